package nn

import (
	"context"
	"fmt"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// GradStep is the first half of a training step, forward and Backward,
// captured as a graph at its first run and replayed from then on: what a
// data-parallel rank runs before its gradients are summed over the ranks.
// Update is the other half. The graph's placeholders are the parameters
// and the batch; its outputs the loss, the gradients and the aux tensors.
// A replay gives the bits of the same ops run one by one.
//
// A GradStep is not safe for concurrent use.
type GradStep struct {
	c      *client.Client
	params []*Param
	fn     StepFunc
	batch  []kernels.Meta

	def     *client.GraphDef
	outMeta []kernels.Meta // loss, gradients, aux
}

// NewGradStep prepares the captured forward and backward of params, with
// the loss (and aux tensors) computed by fn from a batch of tensors of the
// given metas. c is the client of the parameters' session.
func NewGradStep(c *client.Client, params []*Param, fn StepFunc, batch ...kernels.Meta) (*GradStep, error) {
	if c == nil || fn == nil || len(params) == 0 {
		return nil, fmt.Errorf("%w: NewGradStep needs a client, parameters and a loss", ErrInvalidArgument)
	}
	return &GradStep{c: c, params: params, fn: fn, batch: batch}, nil
}

// Captured reports whether the forward and backward are captured.
func (gs *GradStep) Captured() bool { return gs.def != nil }

// Run runs the forward and backward on batch: each parameter's gradient
// is set (one it held before is freed), and the loss and aux tensors are
// returned, leaves for the caller to read and free.
func (gs *GradStep) Run(ctx context.Context, batch ...*Tensor) (*Tensor, []*Tensor, error) {
	if err := checkBatch(gs.batch, batch); err != nil {
		return nil, nil, err
	}
	if gs.def == nil {
		if err := gs.capture(ctx); err != nil {
			return nil, nil, err
		}
	}
	var in []*client.Tensor
	for _, p := range gs.params {
		if err := checkLive(p.T); err != nil {
			return nil, nil, fmt.Errorf("nn: parameter %q: %w", p.Name, err)
		}
		in = append(in, p.T.Client())
	}
	for _, b := range batch {
		in = append(in, b.Client())
	}
	s := gs.params[0].T.Session()
	outs := s.Replay(gs.def, in)
	wrap := func(i int) *Tensor { return Wrap(outs[i], gs.outMeta[i].DType, gs.outMeta[i].Shape) }
	for i, p := range gs.params {
		if g := p.T.Grad(); g != nil {
			g.Free()
		}
		p.T.SetGrad(wrap(1 + i))
	}
	aux := make([]*Tensor, len(outs)-1-len(gs.params))
	for i := range aux {
		aux[i] = wrap(1 + len(gs.params) + i)
	}
	return wrap(0), aux, nil
}

// capture records the forward and backward on a graph whose placeholders
// stand for the parameters and the batch, and stores it.
func (gs *GradStep) capture(ctx context.Context) error {
	live := make([]*Tensor, len(gs.params))
	for i, p := range gs.params {
		live[i] = p.T
	}
	defer func() {
		for i, p := range gs.params {
			p.T = live[i]
		}
	}()
	g := gs.c.NewGraph()
	for _, p := range gs.params {
		p.T = Wrap(g.Input(p.T.DType().String(), p.T.Shape()), p.T.DType(), p.T.Shape()).RequireGrad()
	}
	batch := make([]*Tensor, len(gs.batch))
	for i, m := range gs.batch {
		batch[i] = Wrap(g.Input(m.DType.String(), m.Shape), m.DType, m.Shape)
	}
	loss, aux, err := gs.fn(batch)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	if err := Backward(loss); err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	outs := []*Tensor{loss}
	for _, p := range gs.params {
		if p.T.Grad() == nil {
			return fmt.Errorf("%w: capture: parameter %q gets no gradient from the loss", ErrInvalidArgument, p.Name)
		}
		outs = append(outs, p.T.Grad())
	}
	outs = append(outs, aux...)
	cts := make([]*client.Tensor, len(outs))
	gs.outMeta = make([]kernels.Meta, len(outs))
	for i, t := range outs {
		cts[i], gs.outMeta[i] = t.Client(), t.Meta()
	}
	def, err := g.Define(ctx, cts...)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	gs.def = def
	return nil
}

// Update is the second half of a training step: opt applied to the
// parameters with the gradients they hold, as opt.Step then ZeroGrad do.
// Run runs it op by op until the optimizer's state is steady, then
// captures it as a graph (placeholders: parameters, gradients, state;
// outputs: the new parameters and state) and replays it from then on.
// The replay frees the old parameters, gradients and state.
//
// An Update is not safe for concurrent use.
type Update struct {
	c      *client.Client
	params []*Param
	opt    Optimizer

	def     *client.GraphDef
	names   []string       // the graph's scalar placeholders
	outMeta []kernels.Meta // params, state
}

// NewUpdate prepares the captured update of params by opt (SGD, Adam or
// AdamW). c is the client of the parameters' session.
func NewUpdate(c *client.Client, params []*Param, opt Optimizer) (*Update, error) {
	if _, ok := opt.(stepOptimizer); !ok {
		return nil, fmt.Errorf("%w: an Update captures SGD, Adam or AdamW, not %T", ErrInvalidArgument, opt)
	}
	if c == nil || len(params) == 0 {
		return nil, fmt.Errorf("%w: NewUpdate needs a client and parameters", ErrInvalidArgument)
	}
	return &Update{c: c, params: params, opt: opt}, nil
}

// Captured reports whether the update is captured: later runs are replays.
func (u *Update) Captured() bool { return u.def != nil }

// Run updates the parameters with their gradients and frees the gradients.
func (u *Update) Run(ctx context.Context) error {
	for _, p := range u.params {
		if err := checkLive(p.T); err != nil {
			return fmt.Errorf("nn: parameter %q: %w", p.Name, err)
		}
		if p.T.Grad() == nil {
			return fmt.Errorf("%w: parameter %q has no gradient", ErrInvalidArgument, p.Name)
		}
	}
	opt := u.opt.(stepOptimizer)
	if u.def == nil {
		if _, steady := opt.state(u.params); !steady {
			if err := u.opt.Step(u.params); err != nil {
				return err
			}
			ZeroGrad(u.params)
			return nil
		}
		if err := u.capture(ctx); err != nil {
			return err
		}
	}
	state, steady := opt.state(u.params)
	if !steady || len(state) != len(u.outMeta)-len(u.params) {
		return fmt.Errorf("%w: the optimizer's state changed since the update was captured", ErrInvalidArgument)
	}
	var in []*client.Tensor
	var old []*Tensor
	for _, p := range u.params {
		in, old = append(in, p.T.Client()), append(old, p.T)
	}
	for _, p := range u.params {
		in, old = append(in, p.T.Grad().Client()), append(old, p.T.Grad())
	}
	for _, t := range state {
		in, old = append(in, t.Client()), append(old, t)
	}
	scalars := make([]float64, len(u.names))
	for i, n := range u.names {
		v, err := opt.scalar(n, u.params)
		if err != nil {
			return err
		}
		scalars[i] = v
	}
	s := u.params[0].T.Session()
	outs := s.Replay(u.def, in, scalars...)
	wrap := func(i int) *Tensor { return Wrap(outs[i], u.outMeta[i].DType, u.outMeta[i].Shape) }
	for _, t := range old {
		t.freed = true
	}
	for i, p := range u.params {
		p.T = wrap(i).RequireGrad()
	}
	next := make([]*Tensor, len(state))
	for i := range next {
		next[i] = wrap(len(u.params) + i)
	}
	opt.setState(u.params, next)
	opt.stepped(u.params)
	return nil
}

// capture records the update on a graph and stores it.
func (u *Update) capture(ctx context.Context) error {
	opt := u.opt.(stepOptimizer)
	state, _ := opt.state(u.params)
	restore := opt.snapshot()
	live := make([]*Tensor, len(u.params))
	for i, p := range u.params {
		live[i] = p.T
	}
	defer func() {
		restore()
		for i, p := range u.params {
			p.T = live[i]
		}
	}()
	g := u.c.NewGraph()
	input := func(t *Tensor) *Tensor {
		return Wrap(g.Input(t.DType().String(), t.Shape()), t.DType(), t.Shape())
	}
	ps := make([]*Tensor, len(u.params))
	for i, p := range u.params {
		ps[i] = input(p.T).RequireGrad()
	}
	for i, p := range u.params {
		ps[i].SetGrad(input(p.T.Grad()))
	}
	for i, p := range u.params {
		p.T = ps[i]
	}
	ph := make([]*Tensor, len(state))
	for i, t := range state {
		ph[i] = input(t)
	}
	opt.setState(u.params, ph)
	if err := u.opt.Step(u.params); err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	ZeroGrad(u.params)
	newState, _ := opt.state(u.params)
	var outs []*Tensor
	for _, p := range u.params {
		outs = append(outs, p.T)
	}
	outs = append(outs, newState...)
	cts := make([]*client.Tensor, len(outs))
	u.outMeta = make([]kernels.Meta, len(outs))
	for i, t := range outs {
		cts[i], u.outMeta[i] = t.Client(), t.Meta()
	}
	def, err := g.Define(ctx, cts...)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	u.def, u.names = def, g.ScalarNames()
	return nil
}
