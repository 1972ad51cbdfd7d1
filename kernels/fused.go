package kernels

import "fmt"

// FusedOp is one op of a FusedGroup. Args name its operands by value
// number: v < Inputs is the group's input v, and v >= Inputs is the result
// of Ops[v-Inputs], which must come earlier in Ops.
type FusedOp struct {
	Op   Op
	Args []int
}

// FusedGroup is a run of ops executed as one unit. Each op reads group
// inputs or the results of earlier ops; Results names, in order, the values
// the group writes to its outputs. Every other value is internal: a backend
// that fuses the group never stores it. Executing a group gives the results
// that executing its ops one by one would, within each backend's rounding.
//
// Backends that can fuse offer ExecFused(g *FusedGroup, in, out []*Tensor)
// error, found by type assertion, and return ErrNotImplemented for groups
// they cannot fuse, so the caller runs the ops one by one instead.
type FusedGroup struct {
	Inputs  int
	Ops     []FusedOp
	Results []int
}

// InferFused checks g against the metas of its inputs and returns the
// metas of every value, inputs first, then one per op. The metas of the
// outputs are the values named by g.Results. Errors wrap those of Infer,
// or ErrArity and ErrAttr for bad value numbers.
func InferFused(g *FusedGroup, in []Meta, lim Limits) ([]Meta, error) {
	if len(in) != g.Inputs {
		return nil, fmt.Errorf("%w: fused group takes %d inputs, got %d", ErrArity, g.Inputs, len(in))
	}
	vals := make([]Meta, 0, g.Inputs+len(g.Ops))
	vals = append(vals, in...)
	args := make([]Meta, 0, 2)
	for i := range g.Ops {
		op := &g.Ops[i]
		args = args[:0]
		for _, a := range op.Args {
			if a < 0 || a >= len(vals) {
				return nil, fmt.Errorf("%w: fused op %d (%s) reads value %d, which is not defined before it", ErrAttr, i, op.Op.Name, a)
			}
			args = append(args, vals[a])
		}
		out, err := Infer(&op.Op, args, lim)
		if err != nil {
			return nil, fmt.Errorf("fused op %d: %w", i, err)
		}
		if len(out) != 1 {
			return nil, fmt.Errorf("%w: fused op %d (%s) has %d outputs", ErrAttr, i, op.Op.Name, len(out))
		}
		vals = append(vals, out[0])
	}
	seen := make(map[int]bool, len(g.Results))
	for _, r := range g.Results {
		if r < g.Inputs || r >= len(vals) {
			return nil, fmt.Errorf("%w: fused group result %d is not an op's result", ErrAttr, r)
		}
		if seen[r] {
			return nil, fmt.Errorf("%w: fused group result %d named twice", ErrAttr, r)
		}
		seen[r] = true
	}
	if len(g.Results) == 0 {
		return nil, fmt.Errorf("%w: fused group has no results", ErrAttr)
	}
	return vals, nil
}

// Clone returns a copy of g that shares no memory with it.
func (g *FusedGroup) Clone() FusedGroup {
	c := FusedGroup{Inputs: g.Inputs, Ops: make([]FusedOp, len(g.Ops)), Results: append([]int{}, g.Results...)}
	for i, op := range g.Ops {
		c.Ops[i] = FusedOp{Op: op.Op.Clone(), Args: append([]int{}, op.Args...)}
	}
	return c
}
