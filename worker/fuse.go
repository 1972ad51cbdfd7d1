package worker

import (
	"errors"
	"slices"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// fuser is a backend that runs a run of ops as one kernel (the CUDA
// backend), or block by block through cache (the CPU backend). It returns
// kernels.ErrNotImplemented for groups it cannot fuse.
type fuser interface {
	ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error
}

// maxFused bounds the ops in one fused group; maxFusedResults the tensors
// it writes.
const (
	maxFused        = 64
	maxFusedResults = 4
)

// elementwise reports whether op computes each output element from the
// input elements at the same (broadcast) position: what a fused kernel
// can chain.
func elementwise(name string) bool {
	switch name {
	case kernels.OpWhere, kernels.OpClamp, kernels.OpCast, kernels.OpIsNaN:
		return true
	}
	return slices.Contains(kernels.Unary, name) || slices.Contains(kernels.Binary, name) || slices.Contains(kernels.Compare, name)
}

// frameUses maps every tensor id a frame names to the indices of the ops
// that name it (as input or output), in order. It is nil for a frame with
// no free op: nothing in it can be dropped, so nothing is fused.
func frameUses(ops []codec.Op) map[uint64][]int {
	return frameUsesInto(ops, nil)
}

// frameUsesInto is frameUses filling uses, an empty map, when it is not
// nil (a device reuses one map frame after frame).
func frameUsesInto(ops []codec.Op, uses map[uint64][]int) map[uint64][]int {
	if !slices.ContainsFunc(ops, func(op codec.Op) bool { return op.Op == opFree }) {
		return nil
	}
	if uses == nil {
		uses = make(map[uint64][]int, 2*len(ops))
	}
	for i := range ops {
		for _, id := range ops[i].In {
			uses[id] = append(uses[id], i)
		}
		for _, id := range ops[i].Out {
			uses[id] = append(uses[id], i)
		}
	}
	return uses
}

// planFusion finds the run of ops that starts at ops[start] and is worth
// running as one fused group: at least two consecutive elementwise ops
// with one output each, optionally closed by one reduction of a value the
// run computed, of which at least one output need not be written and at
// most maxFusedResults must. It returns the end of the run (start when
// there is none) and, for each op of the run, whether its output must be
// written. An output is dropped only if the next op after the run that
// names it is a free: then no later op, read, frame or checkpoint can see
// it. Every other output is kept, as executing the ops one by one would
// keep it. A run that drops nothing saves no memory traffic worth a
// kernel of its own, so it is not fused. The run ends at stop at the
// latest. uses is frameUses(ops).
func planFusion(ops []codec.Op, uses map[uint64][]int, start, stop int) (end int, keep []bool) {
	if uses == nil {
		return start, nil
	}
	made := map[uint64]bool{}
	end = start
	for end < stop && end-start < maxFused {
		op := &ops[end]
		if len(op.Out) != 1 || made[op.Out[0]] {
			break
		}
		if !elementwise(op.Op) {
			if slices.Contains(kernels.Reductions, op.Op) && end-start >= 2 && len(op.In) == 1 && made[op.In[0]] {
				made[op.Out[0]] = true
				end++
			}
			break
		}
		made[op.Out[0]] = true
		end++
	}
	// The longest prefix of the run that drops something and keeps few.
	for ; end-start >= 2; end-- {
		keep = make([]bool, end-start)
		kept, dropped := 0, 0
		for k := range keep {
			keep[k] = true
			for _, j := range uses[ops[start+k].Out[0]] {
				if j >= end {
					keep[k] = ops[j].Op != opFree
					break
				}
			}
			if keep[k] {
				kept++
			} else {
				dropped++
			}
		}
		if dropped > 0 && kept == 0 {
			keep[len(keep)-1], kept = true, 1 // a group writes at least one
		}
		if dropped > 0 && kept <= maxFusedResults {
			return end, keep
		}
	}
	return start, nil
}

// fused runs the run of ops at ops[start] as one group on f (uses is
// frameUses(ops)), if there is
// such a run and every op of it would succeed: inputs that exist, fresh
// output ids, shapes that Infer accepts, memory within the session's
// limit. It returns the number of ops it ran, 0 when the caller must run
// them one by one instead (no run, any problem, or the backend's
// ErrNotImplemented), in which case the session is as it was. A run closed
// by a reduction that the backend refuses is tried again without the
// reduction (the CPU backend fuses no reductions: a ReLU's gradient, sign
// then mul, is followed by the sum of a bias's gradient).
func (x *exec) fused(f fuser, ops []codec.Op, uses map[uint64][]int, start int) int {
	if uses == nil || start+1 >= len(ops) || !elementwise(ops[start].Op) || !elementwise(ops[start+1].Op) {
		return 0
	}
	end, keep := planFusion(ops, uses, start, len(ops))
	if end == start {
		return 0
	}
	n, refused := x.fuseRun(f, ops, start, end, keep)
	if refused && slices.Contains(kernels.Reductions, ops[end-1].Op) {
		if end, keep = planFusion(ops, uses, start, end-1); end > start {
			n, _ = x.fuseRun(f, ops, start, end, keep)
		}
	}
	return n
}

// fuseRun runs ops[start:end] as one group on f, writing the outputs that
// keep marks, as fused does. refused reports the backend's
// ErrNotImplemented.
func (x *exec) fuseRun(f fuser, ops []codec.Op, start, end int, keep []bool) (n int, refused bool) {
	run := ops[start:end]
	val := make(map[uint64]int, 2*len(run)) // tensor id -> value number
	var inIDs []uint64
	for _, op := range run {
		for _, id := range op.In {
			if _, ok := val[id]; !ok && !slices.Contains(inIDs, id) {
				inIDs = append(inIDs, id)
			}
		}
		val[op.Out[0]] = -1 // made in the run: not an input of the group
	}
	g := &kernels.FusedGroup{Inputs: len(inIDs), Ops: make([]kernels.FusedOp, len(run))}
	in := make([]*kernels.Tensor, len(inIDs))
	metas := make([]kernels.Meta, len(inIDs))
	for v, id := range inIDs {
		t, err := x.input(id)
		if err != nil {
			return 0, false
		}
		in[v], metas[v] = t, t.Meta
		val[id] = v
	}
	for k := range run {
		op := &run[k]
		id := op.Out[0]
		if x.s.tensors.has(id) || id == 0 || !kernels.Known(op.Op) {
			return 0, false
		}
		kop, err := codec.KernelOp(op)
		if err != nil {
			return 0, false
		}
		kop.Key, kop.Seed = id, x.s.seed
		args := make([]int, len(op.In))
		for j, a := range op.In {
			args[j] = val[a]
		}
		g.Ops[k] = kernels.FusedOp{Op: kop, Args: args}
		val[id] = g.Inputs + k
	}
	for k, kept := range keep {
		if kept {
			g.Results = append(g.Results, g.Inputs+k)
		}
	}
	vals, err := kernels.InferFused(g, metas, x.d.w.cfg.Limits.Tensor)
	if err != nil {
		return 0, false
	}
	out := make([]*kernels.Tensor, 0, len(g.Results))
	defer func() {
		if p := recover(); p != nil {
			x.release(out)
			n, refused = 0, false // the ops one by one report the panic
		}
	}()
	for _, r := range g.Results {
		// A fused group writes every element of its outputs, as an op does.
		t, err := x.allocFilled(vals[r])
		if err != nil {
			x.release(out)
			return 0, false
		}
		out = append(out, t)
	}
	if err := f.ExecFused(g, in, out); err != nil {
		x.release(out)
		if errors.Is(err, kernels.ErrNotImplemented) {
			return 0, true
		}
		if !x.d.fuseFailed {
			x.d.fuseFailed = true
			x.d.w.logf("worker: %s: a fused group of %d ops failed, running its ops one by one (logged once): %v", x.d.cfg.Name, len(run), err)
		}
		return 0, false
	}
	for k, r := range g.Results {
		x.s.tensors.set(run[r-g.Inputs].Out[0], entry{t: out[k]})
	}
	x.d.m.fused(len(run))
	return len(run), false
}

// reluer is a backend that runs an op and relu of its output as one,
// taking relu as it writes the outputs (the CPU backend's convolutions).
// It returns kernels.ErrNotImplemented for ops it cannot.
type reluer interface {
	ExecRelu(op *kernels.Op, in, out []*kernels.Tensor) error
}

// withRelu runs ops[start], a conv2d, and the relu of its output at
// ops[start+1] as one on rl, if the conv2d's output is dropped after the
// relu (the next op after it that names that output is a free), so it is
// never stored. It returns 2 if it ran them, 0 when the caller must run
// them one by one instead (no such pair, any problem, or the backend's
// ErrNotImplemented), in which case the session is as it was. uses is
// frameUses(ops).
func (x *exec) withRelu(rl reluer, ops []codec.Op, uses map[uint64][]int, start int) (n int) {
	if uses == nil || start+1 >= len(ops) {
		return 0
	}
	op, next := &ops[start], &ops[start+1]
	if op.Op != kernels.OpConv2D || next.Op != kernels.OpRelu || len(op.Out) != 1 || len(next.Out) != 1 ||
		len(next.In) != 1 || next.In[0] != op.Out[0] || next.Out[0] == op.Out[0] {
		return 0
	}
	mid, res := op.Out[0], next.Out[0]
	dropped := false
	for _, j := range uses[mid] {
		if j > start+1 {
			dropped = ops[j].Op == opFree
			break
		}
	}
	if !dropped || mid == 0 || res == 0 {
		return 0
	}
	for _, id := range []uint64{mid, res} {
		if x.s.tensors.has(id) {
			return 0
		}
	}
	in := make([]*kernels.Tensor, len(op.In))
	metas := make([]kernels.Meta, len(op.In))
	for j, id := range op.In {
		t, err := x.input(id)
		if err != nil {
			return 0
		}
		in[j], metas[j] = t, t.Meta
	}
	kop, err := codec.KernelOp(op)
	if err != nil {
		return 0
	}
	kop.Key, kop.Seed = mid, x.s.seed
	lim := x.d.w.cfg.Limits.Tensor
	om, err := kernels.Infer(&kop, metas, lim)
	if err != nil || len(om) != 1 {
		return 0
	}
	rop, err := codec.KernelOp(next)
	if err != nil {
		return 0
	}
	rm, err := kernels.Infer(&rop, om, lim)
	if err != nil || len(rm) != 1 || rm[0].DType != om[0].DType || !slices.Equal(rm[0].Shape, om[0].Shape) {
		return 0
	}
	t, err := x.allocFilled(rm[0])
	if err != nil {
		return 0
	}
	out := []*kernels.Tensor{t}
	defer func() {
		if p := recover(); p != nil {
			x.release(out)
			n = 0 // the ops one by one report the panic
		}
	}()
	if err := rl.ExecRelu(&kop, in, out); err != nil {
		x.release(out)
		return 0
	}
	x.s.tensors.set(res, entry{t: t})
	x.d.m.fused(2)
	return 2
}

// transposer is a backend that runs a matmul of operands given as their
// transposes, reading them where they are (the CPU backend). It returns
// kernels.ErrNotImplemented for operands it cannot.
type transposer interface {
	ExecMatmulT(op *kernels.Op, trans [2]bool, in, out []*kernels.Tensor) error
}

// withTransposed runs ops[start], one or two permutes that swap the axes
// of 2-D tensors, and the matmul right after them, which reads their
// outputs, as one matmul of the permutes' inputs on tp, if each permute's
// output is read by that matmul alone and dropped after it (the next op
// after the matmul that names it is a free), so that no transpose is ever
// stored. Linear layers make such pairs: x·Wᵀ forward, gᵀ·x for the
// weight's gradient. It returns the number of ops it ran, 0 when the
// caller must run them one by one instead (no such run, any problem, or
// the backend's ErrNotImplemented), in which case the session is as it
// was. uses is frameUses(ops).
func (x *exec) withTransposed(tp transposer, ops []codec.Op, uses map[uint64][]int, start int) (n int) {
	if uses == nil {
		return 0
	}
	perms := 0
	for perms < 2 && start+perms < len(ops) && ops[start+perms].Op == kernels.OpPermute {
		perms++
	}
	if perms == 0 || start+perms >= len(ops) {
		return 0
	}
	mm := &ops[start+perms]
	if mm.Op != kernels.OpMatmul || len(mm.In) != 2 || len(mm.Out) != 1 || mm.Out[0] == 0 {
		return 0
	}
	lim := x.d.w.cfg.Limits.Tensor
	var trans [2]bool
	var in [2]*kernels.Tensor
	var metas [2]kernels.Meta
	for j := range perms {
		p := &ops[start+j]
		if len(p.In) != 1 || len(p.Out) != 1 || !swapsTwo(p.Perm) {
			return 0
		}
		t := p.Out[0]
		// Named by the permute, then by the matmul (once or twice), then
		// freed: by nothing else in between.
		us := uses[t]
		if t == 0 || t == mm.Out[0] || len(us) < 3 || us[0] != start+j {
			return 0
		}
		k := 1
		for k < len(us) && us[k] == start+perms {
			k++
		}
		if k == 1 || k == len(us) || ops[us[k]].Op != opFree {
			return 0
		}
		if x.s.tensors.has(t) {
			return 0
		}
		src, err := x.input(p.In[0])
		if err != nil || len(src.Shape) != 2 {
			return 0
		}
		kop, err := codec.KernelOp(p)
		if err != nil {
			return 0
		}
		om, err := kernels.Infer(&kop, []kernels.Meta{src.Meta}, lim)
		if err != nil || len(om) != 1 {
			return 0
		}
		for i, id := range mm.In {
			if id == t {
				trans[i], in[i], metas[i] = true, src, om[0]
			}
		}
	}
	for i, id := range mm.In {
		if trans[i] {
			continue
		}
		t, err := x.input(id)
		if err != nil {
			return 0
		}
		in[i], metas[i] = t, t.Meta
	}
	if x.s.tensors.has(mm.Out[0]) {
		return 0
	}
	kop, err := codec.KernelOp(mm)
	if err != nil {
		return 0
	}
	kop.Key, kop.Seed = mm.Out[0], x.s.seed
	om, err := kernels.Infer(&kop, metas[:], lim)
	if err != nil || len(om) != 1 {
		return 0
	}
	t, err := x.allocFilled(om[0])
	if err != nil {
		return 0
	}
	out := []*kernels.Tensor{t}
	defer func() {
		if p := recover(); p != nil {
			x.release(out)
			n = 0 // the ops one by one report the panic
		}
	}()
	if err := tp.ExecMatmulT(&kop, trans, in[:], out); err != nil {
		x.release(out)
		return 0
	}
	x.s.tensors.set(mm.Out[0], entry{t: t})
	x.d.m.fused(perms + 1)
	return perms + 1
}

// swapsTwo reports whether perm is a permutation of two axes that swaps
// them ([1, 0], or with negative axes).
func swapsTwo(perm []int) bool {
	return len(perm) == 2 && (perm[0] == 1 || perm[0] == -1) && (perm[1] == 0 || perm[1] == -2)
}
