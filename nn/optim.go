package nn

import (
	"fmt"
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// Optimizer updates parameters from their gradients. Step enqueues the
// update ops and returns at once: the new parameters (and the optimizer's
// state) are tensors on the worker; each Param's T is replaced by its new
// tensor, which keeps the old gradient, and the old tensor is freed. A
// parameter without a gradient is skipped, as PyTorch skips it. If Step
// returns an error, no parameter and no state was changed.
//
// Optimizers are not safe for concurrent use.
type Optimizer interface {
	Step(params []*Param) error
}

// Default hyper-parameters of Adam and AdamW (PyTorch's).
const (
	DefaultBeta1       = 0.9
	DefaultBeta2       = 0.999
	DefaultAdamEps     = 1e-8
	DefaultWeightDecay = 0.01 // AdamW's
)

// SGD is stochastic gradient descent with momentum, torch.optim.SGD's
// update for each parameter p with gradient g:
//
//	g ← g + WeightDecay·p                      (when WeightDecay ≠ 0)
//	b ← g at the first step, else Momentum·b + (1-Dampening)·g
//	g ← g + Momentum·b if Nesterov, else b     (when Momentum ≠ 0)
//	p ← p - LR·g
//
// The momentum buffers b live on the worker.
type SGD struct {
	LR, Momentum, Dampening, WeightDecay float64
	Nesterov                             bool

	bufs map[*Param]*Tensor
}

// Step updates params; see Optimizer.
func (o *SGD) Step(params []*Param) error {
	if o.Nesterov && (o.Momentum <= 0 || o.Dampening != 0) {
		return fmt.Errorf("%w: SGD: Nesterov needs a momentum and no dampening", ErrInvalidArgument)
	}
	if o.bufs == nil {
		o.bufs = map[*Param]*Tensor{}
	}
	return step(params, func(tp *tape, p *Param, g *Tensor) (*Tensor, []*Tensor) {
		x := p.T
		if o.WeightDecay != 0 {
			g = tp.t(Add(g, tp.t(Mul(x, tp.c(x, o.WeightDecay)))))
		}
		var state []*Tensor
		if o.Momentum != 0 {
			b := o.bufs[p]
			if b == nil {
				b = Mul(g, tp.c(g, 1)) // a copy: the gradient is not ours to keep
			} else {
				b = Add(tp.t(Mul(b, tp.c(b, o.Momentum))), tp.t(Mul(g, tp.c(g, 1-o.Dampening))))
			}
			state = []*Tensor{b}
			if o.Nesterov {
				g = tp.t(Add(g, tp.t(Mul(b, tp.c(b, o.Momentum)))))
			} else {
				g = b
			}
		}
		return Sub(x, tp.t(Mul(g, tp.s(g, o.LR, scalarLR)))), state
	}, func(p *Param, state []*Tensor) {
		if len(state) == 1 {
			o.bufs[p].Free()
			o.bufs[p] = state[0]
		}
	})
}

// Free releases the momentum buffers; the next Step starts afresh.
func (o *SGD) Free() {
	for p, b := range o.bufs {
		b.Free()
		delete(o.bufs, p)
	}
}

// Adam is torch.optim.Adam (amsgrad off): for each parameter p with
// gradient g, at its step t (counted from 1):
//
//	g ← g + WeightDecay·p          (L2 penalty, when WeightDecay ≠ 0)
//	m ← Beta1·m + (1-Beta1)·g
//	v ← Beta2·v + (1-Beta2)·g²
//	p ← p - (LR/(1-Beta1ᵗ)) · m / (sqrt(v)/sqrt(1-Beta2ᵗ) + Eps)
//
// with m and v starting at zero and living on the worker. The bias
// corrections are computed here in float64 and sent as scalar tensors.
// NewAdam gives PyTorch's defaults.
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64

	st adamState
}

// NewAdam is Adam with learning rate lr and PyTorch's defaults.
func NewAdam(lr float64) *Adam {
	return &Adam{LR: lr, Beta1: DefaultBeta1, Beta2: DefaultBeta2, Eps: DefaultAdamEps}
}

// Step updates params; see Optimizer.
func (o *Adam) Step(params []*Param) error {
	return o.st.step(params, o.LR, o.Beta1, o.Beta2, o.Eps, o.WeightDecay, false)
}

// Free releases the moment estimates; the next Step starts afresh.
func (o *Adam) Free() { o.st.free() }

// AdamW is torch.optim.AdamW: Adam whose weight decay is decoupled from the
// gradient, applied to the parameter before the Adam update:
//
//	p ← p·(1 - LR·WeightDecay)
//
// NewAdamW gives PyTorch's defaults.
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64

	st adamState
}

// NewAdamW is AdamW with learning rate lr and PyTorch's defaults.
func NewAdamW(lr float64) *AdamW {
	return &AdamW{LR: lr, Beta1: DefaultBeta1, Beta2: DefaultBeta2, Eps: DefaultAdamEps, WeightDecay: DefaultWeightDecay}
}

// Step updates params; see Optimizer.
func (o *AdamW) Step(params []*Param) error {
	return o.st.step(params, o.LR, o.Beta1, o.Beta2, o.Eps, o.WeightDecay, true)
}

// Free releases the moment estimates; the next Step starts afresh.
func (o *AdamW) Free() { o.st.free() }

type adamParam struct {
	t    int
	m, v *Tensor
}

type adamState map[*Param]*adamParam

func (st *adamState) step(params []*Param, lr, beta1, beta2, eps, wd float64, decoupled bool) error {
	switch {
	case !(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1):
		return fmt.Errorf("%w: Adam betas (%v, %v) outside [0, 1)", ErrInvalidArgument, beta1, beta2)
	case !(eps >= 0) || !(lr >= 0) || !(wd >= 0):
		return fmt.Errorf("%w: Adam lr %v, eps %v, weight decay %v must be >= 0", ErrInvalidArgument, lr, eps, wd)
	}
	if *st == nil {
		*st = adamState{}
	}
	return step(params, func(tp *tape, p *Param, g *Tensor) (*Tensor, []*Tensor) {
		x := p.T
		s := (*st)[p]
		t := 1
		if s != nil {
			t = s.t + 1
		}
		if wd != 0 {
			if decoupled {
				x = tp.t(Mul(x, tp.s(x, 1-lr*wd, scalarDecay)))
			} else {
				g = tp.t(Add(g, tp.t(Mul(x, tp.c(x, wd)))))
			}
		}
		var m, v *Tensor
		g2 := tp.t(Mul(g, g))
		if s == nil {
			m = Mul(g, tp.c(g, 1-beta1))
			v = Mul(g2, tp.c(g2, 1-beta2))
		} else {
			m = Add(tp.t(Mul(s.m, tp.c(g, beta1))), tp.t(Mul(g, tp.c(g, 1-beta1))))
			v = Add(tp.t(Mul(s.v, tp.c(g, beta2))), tp.t(Mul(g2, tp.c(g, 1-beta2))))
		}
		bc1 := 1 - math.Pow(beta1, float64(t))
		bc2 := 1 - math.Pow(beta2, float64(t))
		denom := tp.t(Add(tp.t(Div(tp.t(Sqrt(v)), tp.s(v, math.Sqrt(bc2), scalarSqrtBC2))), tp.c(v, eps)))
		upd := tp.t(Mul(tp.t(Div(m, denom)), tp.s(m, lr/bc1, scalarLRBC1)))
		return Sub(x, upd), []*Tensor{m, v}
	}, func(p *Param, state []*Tensor) {
		s := (*st)[p]
		if s == nil {
			s = &adamParam{}
			(*st)[p] = s
		} else {
			s.m.Free()
			s.v.Free()
		}
		s.t++
		s.m, s.v = state[0], state[1]
	})
}

func (st *adamState) free() {
	for p, s := range *st {
		s.m.Free()
		s.v.Free()
		delete(*st, p)
	}
}

// update computes a parameter's new value and new state tensors from its
// gradient g, recording the intermediates it makes on tp.
type update func(tp *tape, p *Param, g *Tensor) (x *Tensor, state []*Tensor)

// step runs upd on every parameter that has a gradient, then, if every
// result is sound, commits: each parameter takes its new tensor (and keeps
// its gradient), commit takes the new state, and the old tensors and the
// intermediates are freed (stream-ordered, after their last use). On an
// error, everything made is freed and nothing changes.
func step(params []*Param, upd update, commit func(*Param, []*Tensor)) error {
	type result struct {
		p     *Param
		x     *Tensor
		state []*Tensor
	}
	seen := make(map[*Param]bool, len(params))
	var todo []*Param
	for i, p := range params {
		switch {
		case p == nil || p.T == nil:
			return fmt.Errorf("%w: parameter %d is nil", ErrInvalidArgument, i)
		case seen[p]:
			return fmt.Errorf("%w: parameter %q given twice", ErrInvalidArgument, p.Name)
		case p.T.Err() != nil:
			return fmt.Errorf("nn: parameter %q: %w", p.Name, p.T.Err())
		case p.T.Freed():
			return fmt.Errorf("%w: parameter %q", ErrFreed, p.Name)
		}
		seen[p] = true
		g := p.T.Grad()
		if g == nil {
			continue
		}
		if err := g.Err(); err != nil {
			return fmt.Errorf("nn: gradient of %q: %w", p.Name, err)
		}
		if g.Freed() || g.DType() != p.T.DType() || !slices.Equal(g.Shape(), p.T.Shape()) {
			return fmt.Errorf("%w: parameter %q is %v but its gradient %v (freed: %v)", ErrInvalidArgument, p.Name, p.T, g, g.Freed())
		}
		todo = append(todo, p)
	}
	tp := &tape{}
	results := make([]result, 0, len(todo))
	var err error
	for _, p := range todo {
		x, state := upd(tp, p, p.T.Grad())
		results = append(results, result{p, x, state})
		for _, t := range append([]*Tensor{x}, state...) {
			if err == nil && t.Err() != nil {
				err = fmt.Errorf("nn: update of %q: %w", p.Name, t.Err())
			}
		}
	}
	if err == nil {
		err = tp.err()
	}
	if err != nil {
		for _, r := range results {
			r.x.Free()
			for _, t := range r.state {
				t.Free()
			}
		}
		tp.free()
		return err
	}
	for _, r := range results {
		// The state first: making x a leaf frees the tensors it was
		// computed from that are not leaves, the new state among them.
		for _, t := range r.state {
			t.Detach()
		}
		old := r.p.T
		r.x.RequireGrad()
		r.x.SetGrad(old.Grad())
		old.SetGrad(nil)
		r.p.T = r.x
		commit(r.p, r.state)
		old.Free()
	}
	tp.free()
	return nil
}

// ZeroGrad frees and clears the gradients of params, as PyTorch's
// zero_grad(set_to_none=True) does. Backward replaces gradients by itself,
// so a training loop needs this only to drop gradients it will not use.
func ZeroGrad(params []*Param) {
	for _, p := range params {
		if p == nil || p.T == nil {
			continue
		}
		if g := p.T.Grad(); g != nil {
			g.Free()
			p.T.SetGrad(nil)
		}
	}
}

// tape records the intermediate tensors of an update so that they are freed
// once the update is enqueued, and shares scalar constants within a step.
type tape struct {
	tmp    []*Tensor
	consts map[constKey]*Tensor
}

type constKey struct {
	s    *client.Session
	dt   kernels.DType
	v    float64
	name string
}

// t records x as an intermediate and returns it.
func (tp *tape) t(x *Tensor) *Tensor {
	tp.tmp = append(tp.tmp, x)
	return x
}

// c is a scalar tensor holding v, of like's dtype and session.
func (tp *tape) c(like *Tensor, v float64) *Tensor {
	if like.Err() != nil {
		return like
	}
	k := constKey{s: like.Session(), dt: like.DType(), v: v}
	if c, ok := tp.consts[k]; ok {
		return c
	}
	if tp.consts == nil {
		tp.consts = map[constKey]*Tensor{}
	}
	c := Full(k.s, k.dt, nil, v)
	tp.consts[k] = c
	return c
}

// s is a scalar tensor holding v, of like's dtype and session, that may
// change from step to step: in a captured step (see Step) its value is the
// graph's scalar placeholder called name.
func (tp *tape) s(like *Tensor, v float64, name string) *Tensor {
	if like.Err() != nil {
		return like
	}
	k := constKey{s: like.Session(), dt: like.DType(), name: name}
	if c, ok := tp.consts[k]; ok {
		return c
	}
	if tp.consts == nil {
		tp.consts = map[constKey]*Tensor{}
	}
	c := Full(k.s, k.dt, nil, v)
	if g := k.s.Graph(); g != nil && c.Err() == nil {
		if err := g.Bind(c.Client(), "value", g.NamedScalar(name, v)); err != nil {
			c = failed(k.s, fmt.Errorf("nn: scalar %s: %w", name, err))
		}
	}
	tp.consts[k] = c
	return c
}

func (tp *tape) err() error {
	for _, t := range tp.tmp {
		if err := t.Err(); err != nil {
			return err
		}
	}
	return nil
}

func (tp *tape) free() {
	for _, t := range tp.tmp {
		t.Free()
	}
	for _, c := range tp.consts {
		c.Free()
	}
	tp.tmp, tp.consts = nil, nil
}
