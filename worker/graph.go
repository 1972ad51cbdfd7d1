package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// opReplay runs a captured graph (see codec.Graph): its ops, with the
// graph's placeholders bound to the replay's inputs and scalars and the
// tensors it makes given ids from Base on in the order it makes them,
// execute exactly as the same ops sent one by one would: a session that
// sends them one by one mints those very ids. Out names the graph's
// outputs among them.
const opReplay = "replay"

// Compiling a graph: a device validates a graph once (ids, arity, shape
// inference on the placeholders' metas) and keeps a plan of it: the ops
// over local ids with a free after the last use of each internal tensor
// (after each run of elementwise ops on a backend that fuses, so that a
// replay's runs become fused groups that drop their intermediates). A
// replay binds ids into that plan and runs it through the same paths as
// ops sent one by one, which is what makes its results, errors and random
// draws theirs.
//
// On a backend that records device work (kernels.Program), a session's
// later replays of a graph run as one recorded program instead: see
// program.go.

// maxCachedGraphs and maxCachedOps bound the validated graphs a device
// keeps, and their ops in all (a plan of n ops holds about 2n ops).
const (
	maxCachedGraphs = 64
	maxCachedOps    = 1 << 18
)

// maxGraphTensors bounds the tensors a graph names, placeholders included.
const maxGraphTensors = 4 * codec.MaxGraphOps

// graphLoadTimeout bounds the fetch of a definition from the graph bucket.
const graphLoadTimeout = 10 * time.Second

// graphCache holds a device's validated graphs, least recently used
// evicted first. Graphs are named by their content, so an entry never goes
// stale; it is shared by every session of the device. Device loop only.
type graphCache struct {
	kv      jetstream.KeyValue
	plans   map[string]*graphPlan
	clock   uint64
	ops     int // of the plans held
	lastUse map[string]uint64
}

// graphPlan is a validated graph compiled for replay: its ops over local
// ids, with a free inserted after the last use of every internal tensor
// that the graph neither outputs nor frees itself, so a replay holds no
// more memory than it needs and the device's fusion sees which results
// it may drop.
type graphPlan struct {
	name string
	// err is the validation failure of a definition that is stored but
	// invalid: replays of it fail at once with it.
	err     error
	inputs  []kernels.Meta
	scalars int
	// internal is the number of ids the graph produces (local ids
	// len(inputs)+1 on); a replay reserves that many from its Base.
	internal int
	// outputs are the offsets from Base of the graph's outputs, outMetas
	// their metas.
	outputs  []uint64
	outMetas []kernels.Meta
	// freesInput says, for each input, whether the graph frees it.
	freesInput []bool
	// nops is the number of the graph's ops.
	nops int
	// recordable: the graph draws nothing from the generator, so its
	// device work does not depend on the ids a replay mints and may be
	// recorded as a program (see program.go).
	recordable bool
	// seq is the graph's ops with a free after the last use of each
	// internal tensor; fuse places those frees after runs of elementwise
	// ops and reductions instead, and after a matmul that reads permutes
	// right before it, where the device's fusion looks for them, for
	// backends that fuse.
	seq, fuse planned
	// scratch holds the session ids of one op's inputs and outputs
	// during a replay: as long as the most any op names.
	scratch []uint64
	// ids maps the local ids to session ids during a replay.
	ids []uint64
}

// size is the number of ops p holds.
func (p *graphPlan) size() int { return len(p.seq.ops) + len(p.fuse.ops) }

// planned is a graph's ops over local ids with the plan's frees.
type planned struct {
	ops []codec.Op
	// origin is each op's index in the definition (for a free of the
	// plan, that of an op before it).
	origin []int
	binds  [][]codec.Bind // per op of ops
}

func (q *planned) add(op codec.Op, origin int, binds []codec.Bind) {
	q.ops = append(q.ops, op)
	q.origin = append(q.origin, origin)
	q.binds = append(q.binds, binds)
}

// graphAttrs are the attributes a scalar placeholder may set: numbers that
// never change a shape. t, an integer, takes the scalar truncated toward
// zero; adam_step checks it like any t.
var graphAttrs = map[string]func(o *codec.Op, v float64){
	"value": func(o *codec.Op, v float64) { o.Value = v },
	"low":   func(o *codec.Op, v float64) { o.Low = v },
	"high":  func(o *codec.Op, v float64) { o.High = v },
	"mean":  func(o *codec.Op, v float64) { o.Mean = v },
	"std":   func(o *codec.Op, v float64) { o.Std = v },
	"eps":   func(o *codec.Op, v float64) { o.Eps = v },
	"p":     func(o *codec.Op, v float64) { o.P = v },
	"lr":    func(o *codec.Op, v float64) { o.LR = v },
	"t":     func(o *codec.Op, v float64) { o.T = int(max(min(v, 1<<40), -1)) },
}

// graphRun is the replay in progress, for naming the op of an error.
type graphRun struct {
	name   string
	origin int // index in the definition of the op running
}

// inGraph names the op of the graph in an error raised inside a replay.
// It is a no-op outside one.
func (x *exec) inGraph(e *codec.Error) {
	if g := x.graph; g != nil {
		e.Message = fmt.Sprintf("graph %s op %d: %s", g.name[:12], g.origin, e.Message)
	}
}

// replay runs op, a replay, as op i of the frame.
func (x *exec) replay(i int, op *codec.Op) error {
	if x.graph != nil {
		return failf(codec.CodeAttr, "a replay cannot run inside a replay")
	}
	if !codec.ValidGraphName(op.Graph) {
		return failf(codec.CodeAttr, "replay: graph name %q is not 64 lower-case hex digits", op.Graph)
	}
	p, err := x.d.graph(x.s.tenant, op.Graph)
	if err != nil {
		return err
	}
	if p.err != nil {
		return p.err
	}
	ids, err := x.bind(p, op)
	if err != nil {
		return err
	}
	run := &graphRun{name: p.name}
	x.graph = run
	defer func() { x.graph = nil }()
	if r, ok := x.d.cfg.Backend.(recorder); ok && p.recordable && !x.d.w.cfg.NoPrograms {
		if x.replayProgram(r, p, op, ids, i, run) {
			return nil
		}
	}
	x.replayOps(p, op, ids, i, run)
	return nil
}

// replayOps runs the ops of a replay whose bindings passed bind, through
// the paths of ops sent one by one.
func (x *exec) replayOps(p *graphPlan, op *codec.Op, ids []uint64, i int, run *graphRun) {
	if f, ok := x.d.cfg.Backend.(fuser); ok && !x.d.w.cfg.NoFusion {
		x.replayFused(f, p, op, ids, i, run)
		return
	}
	// One op at a time in a scratch op: nothing a compute op keeps
	// refers to the op itself, so a replay allocates no ops.
	var o codec.Op
	q := &p.seq
	for k := range q.ops {
		o = q.ops[k]
		buf := p.scratch[:0]
		for _, l := range o.In {
			buf = append(buf, ids[l])
		}
		nIn := len(buf)
		for _, l := range o.Out {
			buf = append(buf, ids[l])
		}
		o.In, o.Out = buf[:nIn:nIn], buf[nIn:]
		for _, b := range q.binds[k] {
			graphAttrs[b.Attr](&o, op.Scalars[b.Scalar])
		}
		run.origin = q.origin[k]
		x.op(i, &o)
	}
}

// replayFused runs a replay on a backend that fuses: every op bound at
// once, so that the device's fusion sees runs of elementwise ops and the
// frees of the plan that let it drop their intermediate results.
func (x *exec) replayFused(f fuser, p *graphPlan, op *codec.Op, ids []uint64, i int, run *graphRun) {
	q := &p.fuse
	// The bound ops go in the device's replay array, reused replay after
	// replay (graphs hold no replay, so replays do not nest), as run1
	// reuses its frame's: nothing an op leaves behind refers to the op.
	ops := x.d.replayOps
	if cap(ops) < len(q.ops) {
		ops = make([]codec.Op, len(q.ops))
	}
	ops = ops[:len(q.ops)]
	defer func() {
		if cap(ops) <= maxReusedOps {
			x.d.replayOps = ops[:0] // every op is overwritten at the next replay
		}
	}()
	var backing []uint64
	for k := range q.ops {
		n := len(q.ops[k].In) + len(q.ops[k].Out)
		if n > len(backing) {
			backing = make([]uint64, max(n, 1024))
		}
		o := q.ops[k]
		in, out := backing[:len(o.In):len(o.In)], backing[len(o.In):n:n]
		backing = backing[n:]
		for j, l := range o.In {
			in[j] = ids[l]
		}
		for j, l := range o.Out {
			out[j] = ids[l]
		}
		o.In, o.Out = in, out
		for _, b := range q.binds[k] {
			graphAttrs[b.Attr](&o, op.Scalars[b.Scalar])
		}
		ops[k] = o
	}
	var uses map[uint64][]int
	if len(ops) <= maxReusedOps {
		if x.d.replayUses == nil {
			x.d.replayUses = make(map[uint64][]int, 2*len(ops))
		}
		uses = frameUsesInto(ops, x.d.replayUses)
		defer clear(x.d.replayUses)
	} else {
		uses = frameUses(ops)
	}
	rl, _ := x.d.cfg.Backend.(reluer)
	tp, _ := x.d.cfg.Backend.(transposer)
	ip, _ := x.d.cfg.Backend.(inPlacer)
	for n := 0; n < len(ops); {
		if k := x.fused(f, ops, uses, n); k > 0 {
			n += k
			continue
		}
		if rl != nil {
			if k := x.withRelu(rl, ops, uses, n); k > 0 {
				n += k
				continue
			}
		}
		if tp != nil {
			if k := x.withTransposed(tp, ops, uses, n); k > 0 {
				n += k
				continue
			}
		}
		run.origin = q.origin[n]
		x.donate = donations(ip, ops, uses, n)
		x.op(i, &ops[n])
		x.donate = nil
		n++
	}
}

// bind checks a replay's bindings against p and returns the session id of
// every local id of the graph. A replay whose bindings are wrong runs
// none of the graph's ops.
func (x *exec) bind(p *graphPlan, op *codec.Op) ([]uint64, error) {
	switch {
	case len(op.In) != len(p.inputs):
		return nil, failf(codec.CodeArity, "replay of graph %s: it takes %d inputs, %d given", p.name[:12], len(p.inputs), len(op.In))
	case len(op.Out) != len(p.outputs):
		return nil, failf(codec.CodeArity, "replay of graph %s: it has %d outputs, %d output ids given", p.name[:12], len(p.outputs), len(op.Out))
	case len(op.Scalars) != p.scalars:
		return nil, failf(codec.CodeArity, "replay of graph %s: it takes %d scalars, %d given", p.name[:12], p.scalars, len(op.Scalars))
	case p.internal > 0 && op.Base == 0:
		return nil, failf(codec.CodeAttr, "replay of graph %s: base 0; the graph needs %d ids reserved from a base of at least 1", p.name[:12], p.internal)
	case op.Base > math.MaxUint64-uint64(p.internal):
		return nil, failf(codec.CodeAttr, "replay of graph %s: base %d leaves no room for its %d internal ids", p.name[:12], op.Base, p.internal)
	}
	for j, id := range op.In {
		e, ok := x.s.tensors.get(id)
		if ok && e.t != nil && (e.t.DType != p.inputs[j].DType || !sameShape(e.t.Shape, p.inputs[j].Shape)) && x.d.awaitFlying(e.t) {
			// A collective in flight that fails becomes a failed id.
			e, ok = x.s.tensors.get(id)
		}
		switch {
		case !ok:
			return nil, failf(codec.CodeUnknownID, "replay of graph %s: input %d: tensor %d does not exist in this session (never created, or freed)", p.name[:12], j, id)
		case e.fail != nil:
			continue // the ops that read it fail as they would one by one
		case e.t.DType != p.inputs[j].DType || !sameShape(e.t.Shape, p.inputs[j].Shape):
			code := codec.CodeShape
			if e.t.DType != p.inputs[j].DType {
				code = codec.CodeDType
			}
			return nil, failf(code, "replay of graph %s: input %d: tensor %d is %v%v, the graph takes %v%v",
				p.name[:12], j, id, e.t.DType, e.t.Shape, p.inputs[j].DType, p.inputs[j].Shape)
		}
	}
	for j, id := range op.Out {
		if want := op.Base + p.outputs[j]; id != want {
			return nil, failf(codec.CodeAttr, "replay of graph %s: output %d has id %d; from base %d it is %d", p.name[:12], j, id, op.Base, want)
		}
	}
	nIn := len(p.inputs)
	ids := p.ids
	copy(ids[1:], op.In)
	for k := range p.internal {
		ids[1+nIn+k] = op.Base + uint64(k)
	}
	return ids, nil
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

// graph returns the plan of tenant's graph named name: from the device's
// cache, or loaded from the graph bucket, validated and compiled once.
func (d *device) graph(tenant, name string) (*graphPlan, error) {
	key := subjects.TenantGraphKey(tenant, name)
	c := d.graphs
	if c == nil {
		c = &graphCache{plans: map[string]*graphPlan{}, lastUse: map[string]uint64{}}
		d.graphs = c
	}
	c.clock++
	if p, ok := c.plans[key]; ok {
		c.lastUse[key] = c.clock
		return p, nil
	}
	data, err := c.load(d, key, name)
	if err != nil {
		return nil, err
	}
	p := compileGraph(name, data, d.w.cfg.Limits.Tensor)
	for len(c.plans) > 0 && (len(c.plans) >= maxCachedGraphs || c.ops+p.size() > maxCachedOps) {
		var oldest string
		for n, t := range c.lastUse {
			if oldest == "" || t < c.lastUse[oldest] {
				oldest = n
			}
		}
		c.ops -= c.plans[oldest].size()
		delete(c.plans, oldest)
		delete(c.lastUse, oldest)
	}
	c.plans[key], c.lastUse[key] = p, c.clock
	c.ops += p.size()
	return p, nil
}

// load fetches a definition from the graph bucket and checks that it is
// the one its name says.
func (c *graphCache) load(d *device, key, name string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), graphLoadTimeout)
	defer cancel()
	if c.kv == nil {
		kv, err := d.w.js.KeyValue(ctx, d.w.names.GraphBucket())
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, failf(codec.CodeUnknownGraph, "graph %s is not stored: the fabric has no graph bucket %s", name, d.w.names.GraphBucket())
		} else if err != nil {
			return nil, failf(codec.CodeUnavailabe, "graph %s: bucket %s: %v", name, d.w.names.GraphBucket(), err)
		}
		c.kv = kv
	}
	e, err := c.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, failf(codec.CodeUnknownGraph, "graph %s is not stored (define it before replaying it)", name)
	} else if err != nil {
		return nil, failf(codec.CodeUnavailabe, "graph %s: load: %v", name, err)
	}
	if got := codec.GraphName(e.Value()); got != name {
		return nil, failf(codec.CodeInvalidGraph, "graph %s: the stored definition hashes to %s", name, got)
	}
	return e.Value(), nil
}

// compileGraph decodes, validates and compiles a definition. A definition
// that fails gives a plan holding the failure, so that it is checked once.
func compileGraph(name string, data []byte, lim kernels.Limits) *graphPlan {
	p, err := compile(name, data, lim)
	if err != nil {
		return &graphPlan{name: name, err: err}
	}
	return p
}

func compile(name string, data []byte, lim kernels.Limits) (*graphPlan, error) {
	bad := func(format string, args ...any) error {
		return failf(codec.CodeInvalidGraph, "graph %s: %s", name[:12], fmt.Sprintf(format, args...))
	}
	g, err := codec.DecodeGraph(data)
	if err != nil {
		return nil, bad("%v", err)
	}
	p := &graphPlan{name: name, scalars: g.Scalars, inputs: make([]kernels.Meta, len(g.Inputs))}
	if g.Scalars < 0 {
		return nil, bad("%d scalars", g.Scalars)
	}
	for j, ph := range g.Inputs {
		dt, err := kernels.ParseDType(ph.DType)
		if err != nil {
			return nil, bad("input %d: %v", j, err)
		}
		if err := kernels.CheckShape(ph.Shape, lim); err != nil {
			return nil, bad("input %d: %v", j, err)
		}
		p.inputs[j] = kernels.Meta{DType: dt, Shape: ph.Shape}
	}
	binds := make([][]codec.Bind, len(g.Ops))
	for _, b := range g.Binds {
		switch {
		case b.Op < 0 || b.Op >= len(g.Ops):
			return nil, bad("a bind names op %d of %d", b.Op, len(g.Ops))
		case graphAttrs[b.Attr] == nil:
			return nil, bad("op %d: attribute %q cannot take a scalar (value, low, high, mean, std, eps, p, lr, t can)", b.Op, b.Attr)
		case b.Scalar < 0 || b.Scalar >= g.Scalars:
			return nil, bad("op %d: scalar %d of %d", b.Op, b.Scalar, g.Scalars)
		}
		binds[b.Op] = append(binds[b.Op], b)
	}
	// Walk the ops in order: every id read must be live, every id made
	// the next one, and Infer must accept every op with its input metas.
	nIn := uint64(len(g.Inputs))
	metas := make([]kernels.Meta, 1+len(g.Inputs), 1+len(g.Inputs)+len(g.Ops))
	copy(metas[1:], p.inputs)
	freed := make([]bool, len(metas), cap(metas))
	lastUse := make([]int, len(metas), cap(metas)) // op index of the last read
	for k := range g.Ops {
		op := &g.Ops[k]
		next := uint64(len(metas))
		for _, id := range op.In {
			switch {
			case id == 0 || id >= next:
				return nil, bad("op %d (%s) reads id %d, which no earlier op made (the graph has ids 1 to %d here)", k, op.Op, id, next-1)
			case freed[id]:
				return nil, bad("op %d (%s) reads id %d after a free", k, op.Op, id)
			}
			lastUse[id] = k
		}
		if op.Op == opFree {
			if len(op.Out) > 0 {
				return nil, bad("op %d: free makes no tensors", k)
			}
			for _, id := range op.In {
				freed[id] = true
			}
			continue
		}
		if !kernels.Known(op.Op) {
			return nil, bad("op %d: %q is not an op a graph may hold (compute ops and free)", k, op.Op)
		}
		if len(metas)+len(op.Out) > maxGraphTensors {
			return nil, bad("op %d (%s): over %d tensors in one graph", k, op.Op, maxGraphTensors)
		}
		in := make([]kernels.Meta, len(op.In))
		for j, id := range op.In {
			in[j] = metas[id]
		}
		kop, err := codec.KernelOp(op)
		if err == nil {
			var out []kernels.Meta
			if out, err = kernels.Infer(&kop, in, lim); err == nil {
				if len(op.Out) != len(out) {
					return nil, bad("op %d (%s) produces %d tensors, %d ids given", k, op.Op, len(out), len(op.Out))
				}
				for j, id := range op.Out {
					if id != next+uint64(j) {
						return nil, bad("op %d (%s) output %d has id %d; the graph's next id is %d", k, op.Op, j, id, next+uint64(j))
					}
				}
				metas = append(metas, out...)
				for range out {
					freed = append(freed, false)
					lastUse = append(lastUse, k)
				}
			}
		}
		if err != nil {
			return nil, failf(codeOf(err), "graph %s op %d (%s) does not validate: %v", name[:12], k, op.Op, err)
		}
	}
	p.internal = len(metas) - 1 - int(nIn)
	isOut := make([]bool, len(metas))
	for j, id := range g.Outputs {
		switch {
		case id <= nIn || id >= uint64(len(metas)):
			return nil, bad("output %d is id %d, which no op of the graph makes", j, id)
		case freed[id]:
			return nil, bad("output %d is id %d, which the graph frees", j, id)
		case isOut[id]:
			return nil, bad("output %d is id %d, an output already", j, id)
		}
		isOut[id] = true
		p.outputs = append(p.outputs, id-nIn-1)
		p.outMetas = append(p.outMetas, metas[id])
	}
	p.nops = len(g.Ops)
	p.freesInput = make([]bool, nIn)
	for j := range p.freesInput {
		p.freesInput[j] = freed[1+j]
	}
	p.recordable = !slices.ContainsFunc(g.Ops, func(op codec.Op) bool { return kernels.IsRandom(op.Op) })
	// The memory plan: free every internal tensor after its last read.
	frees := make([][]uint64, len(g.Ops))
	for id := nIn + 1; id < uint64(len(metas)); id++ {
		if !freed[id] && !isOut[id] {
			frees[lastUse[id]] = append(frees[lastUse[id]], id)
		}
	}
	var pending []uint64
	for k := range g.Ops {
		p.seq.add(g.Ops[k], k, binds[k])
		if len(frees[k]) > 0 {
			p.seq.add(codec.Op{Op: opFree, In: frees[k]}, k, nil)
		}
		if len(pending) > 0 && !keepsFrees(g.Ops, k) {
			p.fuse.add(codec.Op{Op: opFree, In: pending}, max(k-1, 0), nil)
			pending = nil
		}
		p.fuse.add(g.Ops[k], k, binds[k])
		pending = append(pending, frees[k]...)
	}
	if len(pending) > 0 {
		p.fuse.add(codec.Op{Op: opFree, In: pending}, len(g.Ops)-1, nil)
	}
	most := 0
	for k := range p.seq.ops {
		most = max(most, len(p.seq.ops[k].In)+len(p.seq.ops[k].Out))
	}
	p.scratch = make([]uint64, most)
	p.ids = make([]uint64, 1+len(p.inputs)+p.internal)
	return p, nil
}

// keepsFrees reports whether the frees due before ops[k] in a fusing plan
// wait until after it: ops[k] is elementwise, a reduction, a permute or a
// matmul right after a permute, so that no free splits a run the device
// may fuse (elementwise ops, or permutes and the matmul that reads them).
func keepsFrees(ops []codec.Op, k int) bool {
	switch name := ops[k].Op; {
	case elementwise(name), slices.Contains(kernels.Reductions, name), name == kernels.OpPermute:
		return true
	case name == kernels.OpMatmul:
		return k > 0 && ops[k-1].Op == kernels.OpPermute
	}
	return false
}
