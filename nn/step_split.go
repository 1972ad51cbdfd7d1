package nn

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// GradStep is the first half of a training step, forward and Backward,
// captured as a graph at its first run and replayed from then on: what a
// data-parallel rank runs before its gradients are summed over the ranks.
// Update is the other half. The graph's placeholders are the parameters
// and the batch; its outputs the loss, the gradients and the aux tensors.
// A replay gives the bits of the same ops run one by one.
//
// A GradStep made by NewSplitGradStep replays its graph in two parts (see
// client.SplitGraph), so that the sum of the first gradients can start
// while the device runs the rest of the backward, as PyTorch's
// DistributedDataParallel sums its gradient buckets: Start replays the
// forward and the part of the backward that makes the first bucket's
// gradients, Finish the rest. The first bucket is the shortest run of
// parameters, in the order the backward completes their gradients (the
// last layers first), that holds at least half of the gradients' bytes,
// but never every parameter: for PyTorch's MNIST CNN, its two linear
// layers (98% of the bytes); for a 784-512-512-10 MLP, all but the first
// layer's weight (the first bucket then holds 40% of the bytes).
// The parts keep the bits of the whole replay: the forward runs whole in
// the first part (where every op of it feeds the loss or the aux tensors),
// ahead of any op left to the second, so its random ops (dropout) mint the
// ids, and draw the bits, of the whole replay; the backward draws none.
//
// A split step also has an early part when its forward starts with ops
// that read no parameter of the first bucket (client.SplitGraphEarly): the
// convolutions of the CNN, the first layer's matmul of the MLP. Begin
// queues it, so that a rank can queue the next step's early forward before
// the update of the first bucket's parameters, whose all_reduce then
// overlaps that forward too. The early part is a run of the forward's
// first ops: the bits are the same with it as without.
//
// A GradStep is not safe for concurrent use.
type GradStep struct {
	c      *client.Client
	params []*Param
	fn     StepFunc
	batch  []kernels.Meta
	split  bool

	def     *client.GraphDef
	outMeta []kernels.Meta // loss, gradients, aux
	// parts is the graph cut in two (nil: replayed whole) and buckets the
	// parameters whose gradients each part makes.
	parts   *client.GraphSplit
	buckets [][]int
	// pending is the run that Start began and Finish has not ended.
	pending *gradRun
}

// gradRun is a run of a GradStep from Begin (or Start) to Finish.
type gradRun struct {
	replay  *client.SplitReplay // nil: the whole graph is replayed
	batch   []*Tensor
	in      []*client.Tensor // the graph's inputs as bound so far
	outs    []*client.Tensor // the whole's outputs the parts queued so far
	started bool             // Start queued its part
}

// rebind binds the parameters' placeholders to in's tensors (the graph's
// inputs, parameters first) where they changed since Begin.
func (run *gradRun) rebind(params []*Param, in []*client.Tensor) error {
	for i, p := range params {
		if in[i] == run.in[i] {
			continue
		}
		if run.replay != nil {
			if err := run.replay.Rebind(i, in[i]); err != nil {
				return fmt.Errorf("%w: parameter %q changed since Begin, whose early part read it: %w", ErrInvalidArgument, p.Name, err)
			}
		}
		run.in[i] = in[i]
	}
	return nil
}

// take notes the outputs a part queued.
func (run *gradRun) take(outs []*client.Tensor) {
	for i, o := range outs {
		if o != nil {
			run.outs[i] = o
		}
	}
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

// NewSplitGradStep is NewGradStep for a step replayed in two parts, cut
// after the first bucket of gradients (see GradStep). A step of one
// parameter is replayed whole.
func NewSplitGradStep(c *client.Client, params []*Param, fn StepFunc, batch ...kernels.Meta) (*GradStep, error) {
	gs, err := NewGradStep(c, params, fn, batch...)
	if err != nil {
		return nil, err
	}
	gs.split = len(params) > 1
	return gs, nil
}

// Captured reports whether the forward and backward are captured.
func (gs *GradStep) Captured() bool { return gs.def != nil }

// Early reports whether the step has an early part, which Begin queues
// (see GradStep); false before the capture.
func (gs *GradStep) Early() bool { return gs.parts != nil && gs.parts.Early }

// Buckets lists the parameters (indexes into the params given to
// NewGradStep, in increasing order) whose gradients each part of the
// replay makes, in the order the parts run: one bucket of every parameter
// for a step replayed whole, two for a split one; nil before the capture.
func (gs *GradStep) Buckets() [][]int {
	if gs.buckets == nil {
		return nil
	}
	out := make([][]int, len(gs.buckets))
	for i, b := range gs.buckets {
		out[i] = slices.Clone(b)
	}
	return out
}

// Run runs the forward and backward on batch: each parameter's gradient
// is set (one it held before is freed), and the loss and aux tensors are
// returned, leaves for the caller to read and free. It is Start then
// Finish.
func (gs *GradStep) Run(ctx context.Context, batch ...*Tensor) (*Tensor, []*Tensor, error) {
	loss, aux, err := gs.Start(ctx, batch...)
	if err != nil {
		return nil, nil, err
	}
	if err := gs.Finish(); err != nil {
		return nil, nil, err
	}
	return loss, aux, nil
}

// Begin queues the early part of a run on batch (see GradStep): the
// forward's first ops that read no parameter of the first bucket. Those
// parameters may change between Begin and Start (an update of them queued
// in between): Start binds the tensors they hold then. For a step with no
// early part Begin queues nothing. Start, then Finish, end the run.
func (gs *GradStep) Begin(ctx context.Context, batch ...*Tensor) error {
	if gs.pending != nil {
		return fmt.Errorf("%w: GradStep.Begin before the last run's Finish", ErrInvalidArgument)
	}
	if err := checkBatch(gs.batch, batch); err != nil {
		return err
	}
	if gs.def == nil {
		if err := gs.capture(ctx); err != nil {
			return err
		}
	}
	in, err := gs.inputs(batch)
	if err != nil {
		return err
	}
	run := &gradRun{batch: slices.Clone(batch), in: in, outs: make([]*client.Tensor, len(gs.outMeta))}
	if gs.parts != nil {
		run.replay = gs.params[0].T.Session().ReplaySplit(gs.parts, in)
		if gs.parts.Early {
			outs := run.replay.Next()
			run.take(outs)
			gs.setGrads(outs)
		}
	}
	gs.pending = run
	return nil
}

// Start queues the first part of a run on batch (the whole of it for a
// step replayed whole), after the early part that Begin queued, or that
// Start queues itself when Begin was not called: the loss and aux tensors
// are returned, leaves for the caller to read and free, and the
// parameters of the first bucket hold their gradients (one they held
// before is freed). Finish queues the rest; until then the parameters and
// the batch must stay live, and the ops queued between them (a collective
// of the first bucket) run before the rest of the backward on the device.
// After Begin, batch must be Begin's, and only the parameters the early
// part does not read may hold other tensors than at Begin.
func (gs *GradStep) Start(ctx context.Context, batch ...*Tensor) (*Tensor, []*Tensor, error) {
	run := gs.pending
	switch {
	case run == nil:
		if err := gs.Begin(ctx, batch...); err != nil {
			return nil, nil, err
		}
		run = gs.pending
	case run.started:
		return nil, nil, fmt.Errorf("%w: GradStep.Start before the last run's Finish", ErrInvalidArgument)
	case !slices.Equal(batch, run.batch):
		return nil, nil, fmt.Errorf("%w: GradStep.Start on another batch than Begin's", ErrInvalidArgument)
	}
	in, err := gs.inputs(batch)
	if err == nil {
		err = run.rebind(gs.params, in)
	}
	if err != nil {
		// What the early part made stays on the worker until the session
		// closes.
		gs.pending = nil
		return nil, nil, err
	}
	var outs []*client.Tensor
	if run.replay == nil {
		outs = gs.params[0].T.Session().Replay(gs.def, run.in)
	} else {
		outs = run.replay.Next()
	}
	run.take(outs)
	run.started = true
	gs.setGrads(outs)
	aux := make([]*Tensor, len(run.outs)-1-len(gs.params))
	for i := range aux {
		aux[i] = gs.wrap(run.outs, 1+len(gs.params)+i)
	}
	return gs.wrap(run.outs, 0), aux, nil
}

// Finish queues the rest of the run Start began: the parameters of the
// other buckets hold their gradients. For a step replayed whole it queues
// nothing. A Finish that fails (a parameter or a batch tensor freed since
// Start) queues nothing and ends the run; what the first part made for
// the rest stays on the worker until the session closes.
func (gs *GradStep) Finish() error {
	run := gs.pending
	if run == nil || !run.started {
		return fmt.Errorf("%w: GradStep.Finish without a Start", ErrInvalidArgument)
	}
	gs.pending = nil
	if run.replay == nil {
		return nil
	}
	for _, p := range gs.params {
		if err := checkLive(p.T); err != nil {
			return fmt.Errorf("nn: parameter %q: %w", p.Name, err)
		}
	}
	for i, b := range run.batch {
		if err := checkLive(b); err != nil {
			return fmt.Errorf("nn: batch tensor %d: %w", i, err)
		}
	}
	for !run.replay.Done() {
		gs.setGrads(run.replay.Next())
	}
	return nil
}

// inputs are the graph's inputs: the parameters, then the batch.
func (gs *GradStep) inputs(batch []*Tensor) ([]*client.Tensor, error) {
	var in []*client.Tensor
	for _, p := range gs.params {
		if err := checkLive(p.T); err != nil {
			return nil, fmt.Errorf("nn: parameter %q: %w", p.Name, err)
		}
		in = append(in, p.T.Client())
	}
	for _, b := range batch {
		in = append(in, b.Client())
	}
	return in, nil
}

// wrap is output i of the graph, outs indexed as the graph's outputs.
func (gs *GradStep) wrap(outs []*client.Tensor, i int) *Tensor {
	return Wrap(outs[i], gs.outMeta[i].DType, gs.outMeta[i].Shape)
}

// setGrads sets the gradients among outs (indexed as the graph's outputs,
// nil for those a part does not make) on their parameters.
func (gs *GradStep) setGrads(outs []*client.Tensor) {
	for i, p := range gs.params {
		if outs[1+i] == nil {
			continue
		}
		if g := p.T.Grad(); g != nil {
			g.Free()
		}
		p.T.SetGrad(gs.wrap(outs, 1+i))
	}
}

// capture records the forward and backward on a graph whose placeholders
// stand for the parameters and the batch, and stores it, or its parts.
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
	outMeta := make([]kernels.Meta, len(outs))
	for i, t := range outs {
		cts[i], outMeta[i] = t.Client(), t.Meta()
	}
	def, err := g.Build(cts...)
	if err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	all := make([]int, len(gs.params))
	for i := range all {
		all[i] = i
	}
	buckets := [][]int{all}
	var parts *client.GraphSplit
	if gs.split {
		// The graph's local ids are minted in the order of its ops.
		buckets = splitBuckets(def.Def.Outputs[1:1+len(gs.params)], outMeta[1:1+len(gs.params)])
		cut := []int{0}
		for _, i := range buckets[0] {
			cut = append(cut, 1+i)
		}
		for i := range aux {
			cut = append(cut, 1+len(gs.params)+i)
		}
		if parts, err = client.SplitGraphEarly(def, inferWire, lateOp(buckets[0]), cut); err != nil {
			return fmt.Errorf("nn: capture: %w", err)
		}
		for _, p := range parts.Parts {
			if err := gs.c.StoreGraph(ctx, p.Def); err != nil {
				return fmt.Errorf("nn: capture: %w", err)
			}
		}
	} else if err := gs.c.StoreGraph(ctx, def); err != nil {
		return fmt.Errorf("nn: capture: %w", err)
	}
	gs.def, gs.outMeta, gs.parts, gs.buckets = def, outMeta, parts, buckets
	return nil
}

// lateOp is the end of a split step's early part: the first op that reads
// a parameter of first (the graph's first placeholders are the
// parameters, id i+1 for parameter i) or draws random bits. A random op's
// draws are keyed by the id it mints, and a rank queues the update of the
// first bucket after the early part: with no random op in the early part,
// every random op mints the id it would if the update came first, as it
// does op by op, and the bits are the same.
func lateOp(first []int) func(op *codec.Op) bool {
	late := map[uint64]bool{}
	for _, i := range first {
		late[uint64(i)+1] = true
	}
	return func(op *codec.Op) bool {
		if kernels.IsRandom(op.Op) {
			return true
		}
		return slices.ContainsFunc(op.In, func(id uint64) bool { return late[id] })
	}
}

// GradBuckets is the buckets in which NewSplitGradStep's GradStep of
// params makes their gradients (see GradStep and Buckets), found from the
// gradients params hold, made by Backward op by op: so that a rank that
// sends its backward op by op sums its gradients in the buckets of one
// that replays it in parts.
func GradBuckets(params []*Param) ([][]int, error) {
	made := make([]uint64, len(params))
	metas := make([]kernels.Meta, len(params))
	for i, p := range params {
		g := p.T.Grad()
		if g == nil {
			return nil, fmt.Errorf("%w: parameter %q has no gradient", ErrInvalidArgument, p.Name)
		}
		made[i], metas[i] = g.Client().ID(), g.Meta()
	}
	return splitBuckets(made, metas), nil
}

// splitBuckets is the buckets of a split step (see GradStep): the first,
// the shortest run of gradients, in the order of made (the ids of the
// gradients, which the backward mints in the order it makes them), that
// holds at least half of the bytes of grads (their metas), and at most
// all but one; the second, the others. Each lists indexes in increasing
// order. One gradient makes one bucket.
func splitBuckets(made []uint64, grads []kernels.Meta) [][]int {
	order := make([]int, len(grads))
	total := 0
	for i, m := range grads {
		order[i] = i
		total += m.Numel() * m.DType.Size()
	}
	if len(order) < 2 {
		return [][]int{order}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(made[a], made[b]) })
	n, bytes := 0, 0
	for n < len(order)-1 && 2*bytes < total {
		bytes += grads[order[n]].Numel() * grads[order[n]].DType.Size()
		n++
	}
	first, rest := slices.Clone(order[:n]), slices.Clone(order[n:])
	slices.Sort(first)
	slices.Sort(rest)
	return [][]int{first, rest}
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
