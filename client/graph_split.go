package client

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/codec"
)

// InferFunc gives the dtypes and shapes of the tensors op makes from those
// of its inputs: the fabric's shape inference (kernels.Infer with the op in
// the kernels' form; the nn package has one). SplitGraph types with it the
// placeholders of the tensors a part hands on to a later one.
type InferFunc func(op *codec.Op, in []codec.Placeholder) ([]codec.Placeholder, error)

// GraphSplit is a graph cut into parts that run one after the other, each
// a graph of its own: see SplitGraph.
type GraphSplit struct {
	// Whole is the graph that was cut.
	Whole *GraphDef
	// Parts are the parts, in the order they run.
	Parts []GraphPart
	// Early reports whether Parts[0] is an early part (SplitGraphEarly).
	Early bool
}

// GraphPart is one part of a GraphSplit.
type GraphPart struct {
	// Def is the part's graph, stored and replayed like any other.
	Def *GraphDef
	// Inputs is what each of Def's placeholders is bound to, in order.
	Inputs []PartInput
	// Outputs is, for each of Def's outputs in order, its index among the
	// whole's outputs, or -1 for a tensor made only for later parts (the
	// last of them to read it frees it).
	Outputs []int
}

// PartInput is what a part's placeholder is bound to: for Part -1, the
// whole's placeholder Index; otherwise output Index of part Part, an
// earlier part.
type PartInput struct {
	Part, Index int
}

// opFree is the op that frees its inputs.
const opFree = "free"

// SplitGraph cuts def into len(cuts)+1 parts replayed one after another,
// so that a caller can act on some of its outputs (start a collective on
// them, read them) while the device runs the rest. Part k < len(cuts)
// makes the outputs of def that cuts[k] lists (indexes into def's
// outputs) and every op they need that no earlier part makes; the last
// part makes everything else, the other outputs included. A tensor that
// one part makes and a later part reads becomes an output of the one and
// a placeholder of the other, typed by infer; the last part that reads it
// frees it, unless it is an output of def. A free of def goes to the last
// part that makes or reads what it frees. Each part takes all of def's
// scalar placeholders, in order, and keeps the binds of its ops.
//
// Within a part the ops are def's in def's order, so the parts replayed
// in turn (Session.ReplaySplit) compute def's outputs from the same inputs
// by the same ops, with the same bits, but for random ops: their draws
// are keyed by the ids the replay mints, and the parts mint them in
// another order than def. The ops of the first part keep def's ids, and
// so their draws, up to the first op of def that the first part leaves to
// a later one (all of a forward pass, when what is cut is its backward).
//
// Errors wrap ErrInvalidArgument: no cut, an empty cut, an output index
// out of range or named twice, an output that no op makes or that def
// frees, a part that would make no tensor (the outputs of its cut all
// made by earlier parts, or no op left for the last part), a definition
// whose ids are not canonical (see Graph.Build), and infer's failures.
func SplitGraph(def *GraphDef, infer InferFunc, cuts ...[]int) (*GraphSplit, error) {
	return splitGraph(def, infer, nil, cuts)
}

// SplitGraphEarly is SplitGraph with one more part before the others: the
// early part, def's first ops up to the first for which late reports true
// (a free aside). late says which ops must wait: those that read a
// placeholder whose tensor the caller has not made yet, say, so that it
// can queue the early part's replay before it makes them (the forward of a
// training step up to the first layer whose parameters are still being
// updated), and those whose draws must be keyed by the ids minted after
// what it queues meanwhile (random ops). late is given each op as def has
// it, with def's ids: the placeholders are ids 1 to len(def.Def.Inputs).
// The cuts apply to the ops after the early part, as in SplitGraph. The
// early part is a run of def's first ops, so they keep def's ids, and the
// later parts mint theirs as they would with SplitGraph alone. When late
// takes def's first op there is no early part: the split is SplitGraph's,
// and Early is false. Errors are SplitGraph's, and a nil late.
func SplitGraphEarly(def *GraphDef, infer InferFunc, late func(op *codec.Op) bool, cuts ...[]int) (*GraphSplit, error) {
	if late == nil {
		return nil, fmt.Errorf("%w: split graph: no late function", ErrInvalidArgument)
	}
	return splitGraph(def, infer, late, cuts)
}

// splitGraph is SplitGraph, with an early part before the cuts' when late
// is not nil (SplitGraphEarly).
func splitGraph(def *GraphDef, infer InferFunc, late func(op *codec.Op) bool, cuts [][]int) (*GraphSplit, error) {
	bad := func(format string, args ...any) (*GraphSplit, error) {
		return nil, fmt.Errorf("%w: split graph: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case def == nil || infer == nil:
		return bad("needs a definition and an infer function")
	case len(cuts) == 0:
		return bad("no cut")
	}
	g := &def.Def
	nIn := uint64(len(g.Inputs))

	// Walk the ops: the ids must be canonical; note the op that makes each
	// id (-1 for a placeholder) and its dtype and shape.
	metas := make([]codec.Placeholder, 1+nIn, 1+int(nIn)+len(g.Ops))
	copy(metas[1:], g.Inputs)
	maker := make([]int, 1+nIn, cap(metas))
	for i := range maker {
		maker[i] = -1
	}
	var freedIDs []uint64
	for k := range g.Ops {
		op := &g.Ops[k]
		next := uint64(len(metas))
		in := make([]codec.Placeholder, len(op.In))
		for j, id := range op.In {
			if id == 0 || id >= next {
				return bad("op %d (%s) reads id %d, which no earlier op makes (ids 1 to %d here)", k, op.Op, id, next-1)
			}
			in[j] = metas[id]
		}
		if op.Op == opFree {
			if len(op.Out) > 0 {
				return bad("op %d: a free makes no tensor", k)
			}
			freedIDs = append(freedIDs, op.In...)
			continue
		}
		for j, id := range op.Out {
			if id != next+uint64(j) {
				return bad("op %d (%s) output %d has id %d, not the next id %d (not a canonical definition)", k, op.Op, j, id, next+uint64(j))
			}
		}
		out, err := infer(op, in)
		if err != nil {
			return nil, fmt.Errorf("%w: split graph: op %d (%s): %w", ErrInvalidArgument, k, op.Op, err)
		}
		if len(out) != len(op.Out) {
			return bad("op %d (%s) makes %d tensors, %d ids given", k, op.Op, len(out), len(op.Out))
		}
		metas = append(metas, out...)
		for range out {
			maker = append(maker, k)
		}
	}
	made := uint64(len(metas))
	freed := make([]bool, made)
	for _, id := range freedIDs {
		freed[id] = true
	}
	isOut := make([]bool, made)
	for j, id := range g.Outputs {
		switch {
		case id <= nIn || id >= made:
			return bad("output %d is id %d, which no op of the graph makes", j, id)
		case isOut[id]:
			return bad("output %d is id %d, an output already", j, id)
		case freed[id]:
			return bad("output %d is id %d, which the graph frees", j, id)
		}
		isOut[id] = true
	}
	named := make([]bool, len(g.Outputs))
	for c, cut := range cuts {
		if len(cut) == 0 {
			return bad("cut %d names no output", c)
		}
		for _, j := range cut {
			switch {
			case j < 0 || j >= len(g.Outputs):
				return bad("cut %d names output %d; the graph has %d", c, j, len(g.Outputs))
			case named[j]:
				return bad("output %d is named twice", j)
			}
			named[j] = true
		}
	}

	// The early part: the ops before the first that late takes.
	part := make([]int, len(g.Ops))
	for k := range part {
		part[k] = -1
	}
	early := 0
	if late != nil {
		n := 0
		for k := range g.Ops {
			if g.Ops[k].Op == opFree {
				continue
			}
			if op := g.Ops[k]; late(&op) {
				break
			}
			part[k], n = 0, n+1
		}
		if n > 0 {
			early = 1
		}
	}

	// Each cut's part: the ops its outputs need that no earlier part has.
	for c, cut := range cuts {
		c += early
		var stack []int
		for _, j := range cut {
			stack = append(stack, maker[g.Outputs[j]])
		}
		n := 0
		for len(stack) > 0 {
			k := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if part[k] >= 0 {
				continue
			}
			part[k], n = c, n+1
			for _, id := range g.Ops[k].In {
				if maker[id] >= 0 {
					stack = append(stack, maker[id])
				}
			}
		}
		if n == 0 {
			return bad("cut %d: earlier parts make all its outputs, it would be empty", c-early)
		}
	}
	last, n := early+len(cuts), 0
	for k := range g.Ops {
		if g.Ops[k].Op != opFree && part[k] < 0 {
			part[k], n = last, n+1
		}
	}
	if n == 0 {
		return bad("the cuts leave no op to the last part: cut fewer outputs")
	}

	// lastPart is the last part that makes or reads each id (-1: none);
	// a free goes there, after the reads, where def has it.
	lastPart := make([]int, made)
	for i := range lastPart {
		lastPart[i] = -1
	}
	for k := range g.Ops {
		if g.Ops[k].Op == opFree {
			continue
		}
		for _, id := range g.Ops[k].In {
			lastPart[id] = max(lastPart[id], part[k])
		}
		for _, id := range g.Ops[k].Out {
			lastPart[id] = part[k]
		}
	}
	for k := range g.Ops {
		if g.Ops[k].Op != opFree {
			continue
		}
		p := 0
		for _, id := range g.Ops[k].In {
			p = max(p, lastPart[id])
		}
		part[k] = p
	}
	for k := range g.Ops {
		if g.Ops[k].Op == opFree {
			for _, id := range g.Ops[k].In {
				lastPart[id] = max(lastPart[id], part[k])
			}
		}
	}
	// A tensor handed on that def neither outputs nor frees is freed
	// after its last read, in the last part that reads it.
	lastRead := make([]int, made)
	for k := range g.Ops {
		for _, id := range g.Ops[k].In {
			if g.Ops[k].Op != opFree && part[k] == lastPart[id] {
				lastRead[id] = k
			}
		}
	}
	after := map[int][]uint64{}
	for id := nIn + 1; id < made; id++ {
		if lastPart[id] > part[maker[id]] && !isOut[id] && !freed[id] {
			after[lastRead[id]] = append(after[lastRead[id]], id)
		}
	}

	sp := &GraphSplit{Whole: def, Parts: make([]GraphPart, last+1), Early: early == 1}
	// outAt is, for each id a part outputs, the part and the index.
	outAt := map[uint64]PartInput{}
	for p := range sp.Parts {
		// The part's ops, with the frees added after their ops.
		var ops []codec.Op
		at := map[int]int{} // def's op index -> the part's
		for k := range g.Ops {
			if part[k] != p {
				continue
			}
			at[k] = len(ops)
			ops = append(ops, g.Ops[k])
			for _, id := range after[k] {
				ops = append(ops, codec.Op{Op: opFree, In: []uint64{id}})
			}
		}
		// Its placeholders: the whole's it reads, then what it reads of
		// earlier parts, each in def's order of ids.
		var whole, handed []uint64
		seen := map[uint64]bool{}
		for _, op := range ops {
			for _, id := range op.In {
				if seen[id] || maker[id] >= 0 && part[maker[id]] == p {
					continue
				}
				seen[id] = true
				if maker[id] < 0 {
					whole = append(whole, id)
				} else {
					handed = append(handed, id)
				}
			}
		}
		slices.Sort(whole)
		slices.Sort(handed)
		gp := &sp.Parts[p]
		local := map[uint64]uint64{}
		pdef := codec.Graph{V: codec.Version, Scalars: g.Scalars}
		for _, id := range whole {
			pdef.Inputs = append(pdef.Inputs, g.Inputs[id-1])
			gp.Inputs = append(gp.Inputs, PartInput{Part: -1, Index: int(id - 1)})
			local[id] = uint64(len(pdef.Inputs))
		}
		for _, id := range handed {
			pdef.Inputs = append(pdef.Inputs, metas[id])
			gp.Inputs = append(gp.Inputs, outAt[id])
			local[id] = uint64(len(pdef.Inputs))
		}
		next := uint64(len(pdef.Inputs) + 1)
		for i := range ops {
			op := ops[i]
			var in, out []uint64
			for _, id := range op.In {
				in = append(in, local[id])
			}
			for _, id := range op.Out {
				local[id] = next
				out = append(out, next)
				next++
			}
			op.In, op.Out = in, out
			ops[i] = op
		}
		pdef.Ops = ops
		for _, b := range g.Binds {
			if k, ok := at[b.Op]; ok {
				b.Op = k
				pdef.Binds = append(pdef.Binds, b)
			}
		}
		// Its outputs: def's that it makes, in def's order, then what it
		// hands on to later parts, in order of ids.
		addOut := func(id uint64, whole int) {
			outAt[id] = PartInput{Part: p, Index: len(pdef.Outputs)}
			pdef.Outputs = append(pdef.Outputs, local[id])
			gp.Outputs = append(gp.Outputs, whole)
		}
		for j, id := range g.Outputs {
			if part[maker[id]] == p {
				addOut(id, j)
			}
		}
		for id := nIn + 1; id < made; id++ {
			if part[maker[id]] == p && lastPart[id] > p && !isOut[id] {
				addOut(id, -1)
			}
		}
		_, name, err := codec.EncodeGraph(&pdef)
		if err != nil {
			return nil, fmt.Errorf("client: split graph: part %d: %w", p, err)
		}
		gp.Def = &GraphDef{Name: name, Def: pdef, Internal: int(next) - 1 - len(pdef.Inputs)}
	}
	return sp, nil
}

// SplitReplay is the replay of a split graph's parts in a session, a part
// a call to Next: see Session.ReplaySplit.
type SplitReplay struct {
	s       *Session
	split   *GraphSplit
	in      []*Tensor
	scalars []float64
	outs    [][]*Tensor // of the parts queued
}

// ReplaySplit prepares the replay of sp's parts in s, the whole's
// placeholders bound to in and its scalar placeholders to scalars; each
// call to Next queues the next part's replay. Queue every part: the
// tensors a part hands on are freed by the later ones. The tensors of in
// must live until the last part that reads them is queued. Other ops may
// go between the parts (a collective of the first part's outputs, while
// the device runs the next).
func (s *Session) ReplaySplit(sp *GraphSplit, in []*Tensor, scalars ...float64) *SplitReplay {
	return &SplitReplay{s: s, split: sp, in: slices.Clone(in), scalars: slices.Clone(scalars)}
}

// Rebind binds the whole's placeholder i to t for the parts not yet
// queued: a caller that queued an early part (SplitGraphEarly) binds the
// late placeholders to the tensors it made since. It fails with
// ErrInvalidArgument, binding nothing, when i is out of range or a part
// already queued read placeholder i.
func (r *SplitReplay) Rebind(i int, t *Tensor) error {
	if r.split == nil || i < 0 || i >= len(r.in) || t == nil {
		return fmt.Errorf("%w: rebind placeholder %d of a split replay of %d", ErrInvalidArgument, i, len(r.in))
	}
	for p := range r.outs {
		if slices.Contains(r.split.Parts[p].Inputs, PartInput{Part: -1, Index: i}) {
			return fmt.Errorf("%w: rebind placeholder %d: part %d, queued, read it", ErrInvalidArgument, i, p)
		}
	}
	r.in[i] = t
	return nil
}

// Done reports whether every part is queued.
func (r *SplitReplay) Done() bool { return r.split == nil || len(r.outs) == len(r.split.Parts) }

// Next queues the replay of the next part and returns the whole's
// outputs, indexed as the whole's: the tensors of those the part makes,
// nil for the others. Failures are the session's, as Replay's are (a
// read or Sync returns them); the tensors of a failed part have id 0. It
// returns nil once every part is queued.
func (r *SplitReplay) Next() []*Tensor {
	if r.Done() {
		return nil
	}
	whole := r.split.Whole
	p := len(r.outs)
	gp := &r.split.Parts[p]
	outs := make([]*Tensor, len(whole.Def.Outputs))
	if len(r.in) != len(whole.Def.Inputs) {
		r.s.fail(fmt.Errorf("%w: split graph %s takes %d inputs, %d given", ErrInvalidArgument, whole.Name[:12], len(whole.Def.Inputs), len(r.in)))
		for _, j := range gp.Outputs {
			if j >= 0 {
				outs[j] = &Tensor{s: r.s}
			}
		}
		r.outs = append(r.outs, make([]*Tensor, len(gp.Outputs)))
		return outs
	}
	in := make([]*Tensor, len(gp.Inputs))
	for j, src := range gp.Inputs {
		if src.Part < 0 {
			in[j] = r.in[src.Index]
		} else {
			in[j] = r.outs[src.Part][src.Index]
		}
	}
	got := r.s.Replay(gp.Def, in, r.scalars...)
	r.outs = append(r.outs, got)
	for i, j := range gp.Outputs {
		if j >= 0 {
			outs[j] = got[i]
		}
	}
	return outs
}
