package cpu

import (
	"errors"
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// ExecFused runs a group of elementwise ops (see kernels.FusedGroup) block
// by block: each block of the results' elements goes through every op of
// the group while it is in cache, the values that are not results living
// only in a block-sized scratch, so a chain such as a ReLU's gradient
// (sign, then mul) reads and writes memory once instead of once an op.
// Each op of a block runs the same kernel as the op alone, on a slice of
// its operands, so the results are bit for bit those of the ops one by
// one. It returns kernels.ErrNotImplemented, doing nothing, for groups it
// does not take: an op that is not elementwise, results of differing
// shapes, or inputs that broadcast in a way a block of rows cannot follow.
func (b *Backend) ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	err := b.execFused(g, in, out)
	if r := b.rec.Load(); r != nil && g != nil {
		c, ci, co := g.Clone(), cloneTensors(in), cloneTensors(out)
		r.note(err, "fused group", co, func() error { return b.execFused(&c, ci, co) })
	}
	return err
}

func (b *Backend) execFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	if g == nil {
		return fmt.Errorf("%w: cpu: nil fused group", kernels.ErrArity)
	}
	if len(in) != g.Inputs || len(out) != len(g.Results) || len(out) == 0 {
		return fmt.Errorf("%w: cpu: fused group of %d inputs and %d results given %d and %d tensors",
			kernels.ErrArity, g.Inputs, len(g.Results), len(in), len(out))
	}
	cost := 1
	for _, op := range g.Ops {
		c, ok := fusable(op.Op.Name)
		if !ok {
			return fmt.Errorf("%w: cpu: %s in a fused group", kernels.ErrNotImplemented, op.Op.Name)
		}
		cost = max(cost, c)
	}
	metas := make([]kernels.Meta, len(in))
	for i, t := range in {
		if err := checkTensor(&kernels.Op{Name: "fused"}, "input", i, t); err != nil {
			return err
		}
		metas[i] = t.Meta
	}
	vals, err := kernels.InferFused(g, metas, kernels.Limits{MaxRank: maxRank, MaxElements: maxAlloc})
	if err != nil {
		return err
	}
	shape := vals[g.Results[0]].Shape
	for k, r := range g.Results {
		if !slices.Equal(vals[r].Shape, shape) || vals[r].DType != out[k].DType || !slices.Equal(out[k].Shape, shape) {
			return fmt.Errorf("%w: cpu: fused results of differing shapes", kernels.ErrNotImplemented)
		}
		if err := checkTensor(&kernels.Op{Name: "fused"}, "output", k, out[k]); err != nil {
			return err
		}
		if aliased(in, out[k:k+1]) {
			return fmt.Errorf("%w: cpu: a fused result overlaps an input", kernels.ErrNotImplemented)
		}
	}
	total := kernels.Numel(shape)
	if total == 0 {
		return nil
	}
	// A block is a run of rows over the leading dims of shape that every
	// input either has in full or broadcasts over, of at most blockElems
	// elements: few enough that no op of a block splits it over the cores.
	blockElems := max(16, (parallelMin-1)/cost)
	lead := fusedLead(shape, metas)
	inner := kernels.Numel(shape[lead:])
	if inner > blockElems {
		return fmt.Errorf("%w: cpu: fused rows of %d elements", kernels.ErrNotImplemented, inner)
	}
	rows := total / inner
	per := max(1, blockElems/inner)
	blocks := (rows + per - 1) / per
	fs := &fusedRun{b: b, g: g, in: in, out: out, vals: vals, shape: shape, lead: lead, inner: inner, per: per, rows: rows}
	fs.resultOf = make([]int, len(vals))
	for i := range fs.resultOf {
		fs.resultOf[i] = -1
	}
	for k, r := range g.Results {
		fs.resultOf[r] = k
	}
	tail := shape[lead:]
	fs.rowsIn, fs.tails = make([]int, len(in)), make([][]int, len(in))
	for v, m := range metas {
		t := make([]int, len(tail))
		for k := range tail {
			t[k] = leadDim(m.Shape, len(shape), lead+k)
		}
		full := true
		for k := range lead {
			full = full && leadDim(m.Shape, len(shape), k) == shape[k]
		}
		if full {
			fs.rowsIn[v], fs.tails[v] = kernels.Numel(t), t
			continue
		}
		// Broadcast over the leading axes: its own trailing dims.
		fs.tails[v] = m.Shape[max(0, len(m.Shape)-len(tail)):]
	}
	w := 1
	if total*cost >= parallelMin*fusedGrain(g, vals) {
		w = min(threads(), blocks)
	}
	if w == 1 {
		return fs.blocks(0, blocks)
	}
	errs := make([]error, w)
	spread(w, func(i int) { errs[i] = fs.blocks(bound(blocks, w, i), bound(blocks, w, i+1)) })
	return errors.Join(errs...)
}

// fusedCost is the price of each unary op in cheap element operations
// (see split); the other ops that fuse cost 1 to 4.
var fusedCost = map[string]int{}

// fusable reports whether ExecFused takes op, and its cost.
func fusable(name string) (int, bool) {
	if c, ok := fusedCost[name]; ok {
		return c, true
	}
	switch {
	case slices.Contains(kernels.Binary, name), slices.Contains(kernels.Compare, name):
		return 1, table[name].fn != nil
	case name == kernels.OpWhere || name == kernels.OpClamp:
		return 2, true
	case name == kernels.OpCast:
		return 4, true
	}
	return 0, false
}

// fusedGrain is vecGrain for a group whose every op runs on vectors
// (float32 add, sub, mul and div of no scalar operand, relu, sign), else 1:
// such a group spreads over the cores only when that much larger.
func fusedGrain(g *kernels.FusedGroup, vals []kernels.Meta) int {
	for k, op := range g.Ops {
		if vals[g.Inputs+k].DType != kernels.Float32 {
			return 1
		}
		switch op.Op.Name {
		case kernels.OpAdd, kernels.OpSub, kernels.OpMul, kernels.OpDiv:
			for _, a := range op.Args {
				if kernels.Numel(vals[a].Shape) == 1 {
					return 1
				}
			}
		case kernels.OpRelu, kernels.OpSign:
		default:
			return 1
		}
	}
	return vecGrain
}

// leadDim is the dim of a tensor of shape m at axis k of a group of rank
// r (m right-aligned to it, as in broadcasting; 1 where m has no axis).
func leadDim(m []int, r, k int) int {
	if off := r - len(m); k >= off {
		return m[k-off]
	}
	return 1
}

// fusedLead is the number of leading axes of shape that every input
// either has in full or broadcasts over (size 1).
func fusedLead(shape []int, in []kernels.Meta) int {
	r := len(shape)
	lead := r
	for _, m := range in {
		full, bcast := 0, 0
		for full < r && leadDim(m.Shape, r, full) == shape[full] {
			full++
		}
		for bcast < r && leadDim(m.Shape, r, bcast) == 1 {
			bcast++
		}
		lead = min(lead, max(full, bcast))
	}
	return lead
}

// fusedRun is one ExecFused call, shared by the goroutines that run its
// blocks.
type fusedRun struct {
	b         *Backend
	g         *kernels.FusedGroup
	in, out   []*kernels.Tensor
	vals      []kernels.Meta
	shape     []int
	lead      int
	inner     int // elements a row
	per, rows int // rows a block, rows in all
	resultOf  []int
	// Per input: its elements a row if it has the leading axes in full
	// (0 if it broadcasts over them), and the shape of its block without
	// the rows axis.
	rowsIn []int
	tails  [][]int
}

// blocks runs blocks [lo, hi).
func (f *fusedRun) blocks(lo, hi int) error {
	g := f.g
	// scratch for the values that are not results: one block each.
	var handles []*[]uint64
	defer func() {
		for _, h := range handles {
			wordPool.Put(h)
		}
	}()
	scratch := make([][]byte, len(f.vals))
	for v := g.Inputs; v < len(f.vals); v++ {
		if f.resultOf[v] < 0 {
			buf, h := getBytes(f.per * f.inner * f.vals[v].DType.Size())
			scratch[v], handles = buf, append(handles, h)
		}
	}
	ts := make([]kernels.Tensor, len(f.vals))
	bufs := make([]Buffer, len(f.vals))
	args := make([]*kernels.Tensor, 0, 3)
	argm := make([]kernels.Meta, 0, 3)
	tail := f.shape[f.lead:]
	for blk := lo; blk < hi; blk++ {
		r0 := blk * f.per
		r1 := min(f.rows, r0+f.per)
		n := (r1 - r0) * f.inner
		full := append([]int{r1 - r0}, tail...)
		// The inputs: a block of rows of those that have the leading axes
		// in full, the whole of those that broadcast over them.
		for v, t := range f.in {
			sz, m := t.DType.Size(), t.Meta
			if f.rowsIn[v] > 0 {
				per := f.rowsIn[v]
				bufs[v] = Buffer{data: data(t)[r0*per*sz : r1*per*sz]}
				ts[v] = kernels.Tensor{Meta: kernels.Meta{DType: m.DType, Shape: append([]int{r1 - r0}, f.tails[v]...)}, Buf: &bufs[v]}
				continue
			}
			bufs[v] = Buffer{data: data(t)}
			ts[v] = kernels.Tensor{Meta: kernels.Meta{DType: m.DType, Shape: f.tails[v]}, Buf: &bufs[v]}
		}
		for k := range g.Ops {
			op := &g.Ops[k].Op
			args, argm = args[:0], argm[:0]
			for _, a := range g.Ops[k].Args {
				args = append(args, &ts[a])
				argm = append(argm, ts[a].Meta)
			}
			om, err := kernels.Infer(op, argm, kernels.Limits{MaxRank: maxRank, MaxElements: maxAlloc})
			if err != nil {
				return err
			}
			v := g.Inputs + k
			nb := kernels.Numel(om[0].Shape) * om[0].DType.Size()
			if rk := f.resultOf[v]; rk >= 0 {
				if !slices.Equal(om[0].Shape, full) {
					return fmt.Errorf("cpu: fused op %d (%s): block result %v, want %v", k, op.Name, om[0].Shape, full)
				}
				sz := f.out[rk].DType.Size()
				bufs[v] = Buffer{data: data(f.out[rk])[r0*f.inner*sz : r0*f.inner*sz+n*sz]}
			} else {
				bufs[v] = Buffer{data: scratch[v][:nb]}
			}
			ts[v] = kernels.Tensor{Meta: om[0], Buf: &bufs[v]}
			if err := f.b.exec(op, args, []*kernels.Tensor{&ts[v]}); err != nil {
				return err
			}
		}
	}
	return nil
}
