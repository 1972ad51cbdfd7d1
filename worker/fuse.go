package worker

import (
	"slices"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// fuser is a backend that runs a run of ops as one kernel (the CUDA
// backend). It returns kernels.ErrNotImplemented for groups it cannot fuse.
type fuser interface {
	ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error
}

// maxFused bounds the ops in one fused group.
const maxFused = 64

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

// planFusion finds the run of ops that starts at ops[start] and can run as
// one fused group: at least two consecutive elementwise ops with one
// output each, optionally closed by one reduction of a value the run
// computed. It returns the end of the run (start when there is none) and,
// for each op of the run, whether its output must be written. An output is
// dropped only if the next op of the frame that names it is a free: then
// no later op, read, frame or checkpoint can see it. Every other output is
// kept, as executing the ops one by one would keep it; if every output is
// freed so, the last is kept, as a group writes at least one.
func planFusion(ops []codec.Op, start int) (end int, keep []bool) {
	made := map[uint64]bool{}
	end = start
	for end < len(ops) && end-start < maxFused {
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
	if end-start < 2 {
		return start, nil
	}
	keep = make([]bool, end-start)
	kept := false
	for k := range keep {
		id := ops[start+k].Out[0]
		keep[k] = true
		for j := end; j < len(ops); j++ {
			if slices.Contains(ops[j].In, id) || slices.Contains(ops[j].Out, id) {
				keep[k] = ops[j].Op != opFree
				break
			}
		}
		kept = kept || keep[k]
	}
	if !kept {
		keep[len(keep)-1] = true
	}
	return end, keep
}

// fused runs the run of ops at ops[start] as one group on f, if there is
// such a run and every op of it would succeed: inputs that exist, fresh
// output ids, shapes that Infer accepts, memory within the session's
// limit. It returns the number of ops it ran, 0 when the caller must run
// them one by one instead (no run, any problem, or the backend's
// ErrNotImplemented), in which case the session is as it was.
func (x *exec) fused(f fuser, ops []codec.Op, start int) (n int) {
	if start+1 >= len(ops) || !elementwise(ops[start].Op) || !elementwise(ops[start+1].Op) {
		return 0
	}
	end, keep := planFusion(ops, start)
	if end == start {
		return 0
	}
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
			return 0
		}
		in[v], metas[v] = t, t.Meta
		val[id] = v
	}
	for k := range run {
		op := &run[k]
		id := op.Out[0]
		if _, taken := x.s.tensors[id]; taken || id == 0 || !kernels.Known(op.Op) {
			return 0
		}
		kop, err := kernelOp(op)
		if err != nil {
			return 0
		}
		kop.Key, kop.Seed = id, x.s.seed
		args := make([]int, len(op.In))
		for j, a := range op.In {
			args[j] = val[a]
		}
		g.Ops[k] = kernels.FusedOp{Op: *kop, Args: args}
		val[id] = g.Inputs + k
	}
	for k, kept := range keep {
		if kept {
			g.Results = append(g.Results, g.Inputs+k)
		}
	}
	vals, err := kernels.InferFused(g, metas, x.d.w.cfg.Limits.Tensor)
	if err != nil {
		return 0
	}
	out := make([]*kernels.Tensor, 0, len(g.Results))
	defer func() {
		if p := recover(); p != nil {
			x.release(out)
			n = 0 // the ops one by one report the panic
		}
	}()
	for _, r := range g.Results {
		t, err := x.alloc(vals[r])
		if err != nil {
			x.release(out)
			return 0
		}
		out = append(out, t)
	}
	if err := f.ExecFused(g, in, out); err != nil {
		x.release(out)
		return 0
	}
	for k, r := range g.Results {
		x.s.tensors[run[r-g.Inputs].Out[0]] = entry{t: out[k]}
	}
	x.d.m.fused(len(run))
	return len(run)
}
