package nn

import (
	"context"
	"fmt"
	"maps"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// Names of the scalar placeholders an optimizer's captured update takes.
const (
	scalarLR = "lr"     // the learning rate of every optimizer
	scalarT  = "adam.t" // Adam's step count, for its bias corrections
)

// LossFunc computes a training step's loss from a batch, reading the
// model's parameters (Param.T) afresh.
type LossFunc func(batch []*Tensor) (*Tensor, error)

// StepFunc computes a training step's loss from a batch, as LossFunc does,
// and aux: other tensors the step returns (a count of correct predictions,
// say) that take no part in the gradient. Each call returns as many aux
// tensors, of the same dtypes and shapes.
type StepFunc func(batch []*Tensor) (loss *Tensor, aux []*Tensor, err error)

// Step is a training step (forward, Backward, optimizer update) captured
// once as a graph and replayed for every batch: one op on the wire a step,
// whatever the model's size. Its parameters, the optimizer's state, the
// batch and the changing scalars (learning rate, Adam's bias corrections)
// are the graph's placeholders; the new parameters, the new state, the
// loss and the aux tensors (see StepFunc) its outputs; the old parameters
// and state are freed by the replay, as Optimizer.Step frees them. A
// replay gives the bits of the same step run op by op.
//
// Run runs the first steps op by op until the optimizer's state is
// steady (SGD with momentum and Adam make their state at the first step),
// then captures the step and replays it from then on. Between runs the
// parameters hold no gradient (Run frees them, as ZeroGrad does).
// Changing the optimizer's hyper-parameters other than LR after the
// capture has no effect on the captured step; NewStep again instead.
//
// A Step is not safe for concurrent use.
type Step struct {
	c      *client.Client
	params []*Param
	opt    Optimizer
	fn     StepFunc
	batch  []kernels.Meta

	def     *client.GraphDef
	names   []string       // the graph's scalar placeholders
	outMeta []kernels.Meta // of the graph's outputs: loss, params, state, aux
	naux    int
}

// stepOptimizer is met by the optimizers a Step can capture.
type stepOptimizer interface {
	Optimizer
	// snapshot returns a function that puts the optimizer's state back
	// as it is now.
	snapshot() (restore func())
	// state returns the state tensors of params in a fixed order, and
	// false while the next Step would make state rather than update it.
	state(params []*Param) ([]*Tensor, bool)
	// setState replaces the state of params by ts (in state's order).
	setState(params []*Param, ts []*Tensor)
	// stepped counts a step of params made by a replay.
	stepped(params []*Param)
	// scalar is the value of the named scalar for the next Step.
	scalar(name string, params []*Param) (float64, error)
}

// NewStep prepares a captured training step of params, updated by opt
// (SGD, Adam or AdamW), with loss computed by loss from a batch of tensors
// of the given metas. c is the client of the parameters' session.
func NewStep(c *client.Client, params []*Param, opt Optimizer, loss LossFunc, batch ...kernels.Meta) (*Step, error) {
	if loss == nil {
		return nil, fmt.Errorf("%w: NewStep needs a client, parameters and a loss", ErrInvalidArgument)
	}
	return NewStepAux(c, params, opt, func(b []*Tensor) (*Tensor, []*Tensor, error) {
		l, err := loss(b)
		return l, nil, err
	}, batch...)
}

// NewStepAux is NewStep with a step that also returns aux tensors: see
// StepFunc and RunAux.
func NewStepAux(c *client.Client, params []*Param, opt Optimizer, fn StepFunc, batch ...kernels.Meta) (*Step, error) {
	if _, ok := opt.(stepOptimizer); !ok {
		return nil, fmt.Errorf("%w: a Step captures SGD, Adam or AdamW, not %T", ErrInvalidArgument, opt)
	}
	if c == nil || fn == nil || len(params) == 0 {
		return nil, fmt.Errorf("%w: NewStep needs a client, parameters and a loss", ErrInvalidArgument)
	}
	return &Step{c: c, params: params, opt: opt, fn: fn, batch: batch}, nil
}

// Captured reports whether the step is captured: later runs are replays.
func (st *Step) Captured() bool { return st.def != nil }

// Graph is the captured step's graph, nil before the capture.
func (st *Step) Graph() *client.GraphDef { return st.def }

// Run runs one step on batch and returns its loss, a leaf of the
// parameters' session for the caller to read and free.
func (st *Step) Run(ctx context.Context, batch ...*Tensor) (*Tensor, error) {
	loss, aux, err := st.RunAux(ctx, batch...)
	for _, t := range aux {
		t.Free()
	}
	return loss, err
}

// RunAux runs one step on batch and returns its loss and the step's aux
// tensors, leaves of the parameters' session for the caller to read and
// free.
func (st *Step) RunAux(ctx context.Context, batch ...*Tensor) (*Tensor, []*Tensor, error) {
	if err := checkBatch(st.batch, batch); err != nil {
		return nil, nil, err
	}
	opt := st.opt.(stepOptimizer)
	if st.def == nil {
		if _, steady := opt.state(st.params); !steady {
			return st.eager(batch)
		}
		if err := st.capture(ctx); err != nil {
			return nil, nil, err
		}
	}
	return st.replay(batch)
}

// checkBatch checks batch against the metas a step takes.
func checkBatch(metas []kernels.Meta, batch []*Tensor) error {
	if len(batch) != len(metas) {
		return fmt.Errorf("%w: the step takes a batch of %d tensors, %d given", ErrInvalidArgument, len(metas), len(batch))
	}
	for i, b := range batch {
		if err := checkLive(b); err != nil {
			return fmt.Errorf("nn: batch %d: %w", i, err)
		}
		if b.DType() != metas[i].DType || !sameShape(b.Shape(), metas[i].Shape) {
			return fmt.Errorf("%w: batch %d is %v, the step takes %v%v", ErrInvalidArgument, i, b, metas[i].DType, metas[i].Shape)
		}
	}
	return nil
}

// eager runs the step op by op.
func (st *Step) eager(batch []*Tensor) (*Tensor, []*Tensor, error) {
	loss, aux, err := st.fn(batch)
	if err != nil {
		return nil, nil, err
	}
	if err := Backward(loss); err != nil {
		return nil, nil, err
	}
	if err := st.opt.Step(st.params); err != nil {
		return nil, nil, err
	}
	ZeroGrad(st.params)
	return loss, aux, nil
}

// capture records the step on a graph whose placeholders stand for the
// parameters, the optimizer's state and the batch, and stores it.
func (st *Step) capture(ctx context.Context) error {
	opt := st.opt.(stepOptimizer)
	state, _ := opt.state(st.params)
	restore := opt.snapshot()
	live := make([]*Tensor, len(st.params))
	for i, p := range st.params {
		live[i] = p.T
	}
	defer func() {
		restore()
		for i, p := range st.params {
			p.T = live[i]
		}
	}()
	g := st.c.NewGraph()
	input := func(t *Tensor) *Tensor {
		return Wrap(g.Input(t.DType().String(), t.Shape()), t.DType(), t.Shape())
	}
	for _, p := range st.params {
		p.T = input(p.T).RequireGrad()
	}
	ph := make([]*Tensor, len(state))
	for i, t := range state {
		ph[i] = input(t)
	}
	opt.setState(st.params, ph)
	batch := make([]*Tensor, len(st.batch))
	for i, m := range st.batch {
		batch[i] = Wrap(g.Input(m.DType.String(), m.Shape), m.DType, m.Shape)
	}
	loss, aux, err := st.fn(batch)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	if err := Backward(loss); err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	for _, p := range st.params {
		if p.T.Grad() == nil {
			return fmt.Errorf("%w: capture: parameter %q gets no gradient from the loss", ErrInvalidArgument, p.Name)
		}
	}
	if err := st.opt.Step(st.params); err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	ZeroGrad(st.params)
	newState, _ := opt.state(st.params)
	outs := []*Tensor{loss}
	for _, p := range st.params {
		outs = append(outs, p.T)
	}
	outs = append(outs, newState...)
	outs = append(outs, aux...)
	st.naux = len(aux)
	cts := make([]*client.Tensor, len(outs))
	st.outMeta = make([]kernels.Meta, len(outs))
	for i, t := range outs {
		cts[i], st.outMeta[i] = t.Client(), t.Meta()
	}
	def, err := g.Define(ctx, cts...)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	st.def, st.names = def, g.ScalarNames()
	return nil
}

// replay runs the captured step once.
func (st *Step) replay(batch []*Tensor) (*Tensor, []*Tensor, error) {
	opt := st.opt.(stepOptimizer)
	state, steady := opt.state(st.params)
	if !steady || len(state) != len(st.outMeta)-1-len(st.params)-st.naux {
		return nil, nil, fmt.Errorf("%w: the optimizer's state changed since the step was captured", ErrInvalidArgument)
	}
	var in []*client.Tensor
	var old []*Tensor
	for _, p := range st.params {
		if err := checkLive(p.T); err != nil {
			return nil, nil, fmt.Errorf("nn: parameter %q: %w", p.Name, err)
		}
		in, old = append(in, p.T.Client()), append(old, p.T)
	}
	for _, t := range state {
		in, old = append(in, t.Client()), append(old, t)
	}
	for _, b := range batch {
		in = append(in, b.Client())
	}
	scalars := make([]float64, len(st.names))
	for i, n := range st.names {
		v, err := opt.scalar(n, st.params)
		if err != nil {
			return nil, nil, err
		}
		scalars[i] = v
	}
	s := st.params[0].T.Session()
	outs := s.Replay(st.def, in, scalars...)
	wrap := func(i int) *Tensor { return Wrap(outs[i], st.outMeta[i].DType, st.outMeta[i].Shape) }
	// The replay freed the old parameters and state.
	for _, t := range old {
		t.freed = true
	}
	for i, p := range st.params {
		p.T = wrap(1 + i).RequireGrad()
	}
	next := make([]*Tensor, len(state))
	for i := range next {
		next[i] = wrap(1 + len(st.params) + i)
	}
	opt.setState(st.params, next)
	opt.stepped(st.params)
	aux := make([]*Tensor, st.naux)
	for i := range aux {
		aux[i] = wrap(len(outs) - st.naux + i)
	}
	return wrap(0), aux, nil
}

func checkLive(t *Tensor) error {
	switch {
	case t == nil:
		return fmt.Errorf("%w: nil tensor", ErrInvalidArgument)
	case t.Err() != nil:
		return t.Err()
	case t.Freed():
		return fmt.Errorf("%w: %v", ErrFreed, t)
	}
	return nil
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// SGD's state is its momentum buffers.

func (o *SGD) snapshot() func() {
	bufs := maps.Clone(o.bufs)
	return func() { o.bufs = bufs }
}

func (o *SGD) state(params []*Param) ([]*Tensor, bool) {
	if o.Momentum == 0 {
		return nil, true
	}
	ts := make([]*Tensor, len(params))
	for i, p := range params {
		if ts[i] = o.bufs[p]; ts[i] == nil {
			return nil, false
		}
	}
	return ts, true
}

func (o *SGD) setState(params []*Param, ts []*Tensor) {
	if o.Momentum == 0 {
		return
	}
	if o.bufs == nil {
		o.bufs = map[*Param]*Tensor{}
	}
	for i, p := range params {
		o.bufs[p] = ts[i]
	}
}

func (o *SGD) stepped([]*Param) {}

func (o *SGD) scalar(name string, _ []*Param) (float64, error) {
	if name == scalarLR {
		return o.LR, nil
	}
	return 0, fmt.Errorf("%w: SGD has no scalar %q", ErrInvalidArgument, name)
}

// Adam's and AdamW's state is each parameter's moments and step count.

func (st *adamState) snapshot() func() {
	saved := make(map[*Param]adamParam, len(*st))
	for p, s := range *st {
		saved[p] = *s
	}
	return func() {
		*st = adamState{}
		for p, s := range saved {
			(*st)[p] = &s
		}
	}
}

func (st *adamState) state(params []*Param) ([]*Tensor, bool) {
	ts := make([]*Tensor, 0, 2*len(params))
	for _, p := range params {
		s := (*st)[p]
		if s == nil || s.t != (*st)[params[0]].t {
			return nil, false
		}
		ts = append(ts, s.m, s.v)
	}
	return ts, true
}

func (st *adamState) setState(params []*Param, ts []*Tensor) {
	if *st == nil {
		*st = adamState{}
	}
	for i, p := range params {
		s := (*st)[p]
		if s == nil {
			s = &adamParam{}
			(*st)[p] = s
		}
		s.m, s.v = ts[2*i], ts[2*i+1]
	}
}

func (st *adamState) scalar(name string, params []*Param, lr, beta1, beta2, wd float64) (float64, error) {
	t := 1
	if len(params) > 0 && (*st)[params[0]] != nil {
		t = (*st)[params[0]].t + 1
	}
	switch name {
	case scalarLR:
		return lr, nil
	case scalarT:
		return float64(t), nil
	}
	return 0, fmt.Errorf("%w: Adam has no scalar %q", ErrInvalidArgument, name)
}

func (o *Adam) snapshot() func()                        { return o.st.snapshot() }
func (o *Adam) state(params []*Param) ([]*Tensor, bool) { return o.st.state(params) }
func (o *Adam) setState(params []*Param, ts []*Tensor)  { o.st.setState(params, ts) }
func (o *Adam) stepped(params []*Param)                 { o.st.count(params) }
func (o *Adam) scalar(name string, params []*Param) (float64, error) {
	return o.st.scalar(name, params, o.LR, o.Beta1, o.Beta2, o.WeightDecay)
}

func (o *AdamW) snapshot() func()                        { return o.st.snapshot() }
func (o *AdamW) state(params []*Param) ([]*Tensor, bool) { return o.st.state(params) }
func (o *AdamW) setState(params []*Param, ts []*Tensor)  { o.st.setState(params, ts) }
func (o *AdamW) stepped(params []*Param)                 { o.st.count(params) }
func (o *AdamW) scalar(name string, params []*Param) (float64, error) {
	return o.st.scalar(name, params, o.LR, o.Beta1, o.Beta2, o.WeightDecay)
}

// count counts a step for params.
func (st *adamState) count(params []*Param) {
	for _, p := range params {
		(*st)[p].t++
	}
}
