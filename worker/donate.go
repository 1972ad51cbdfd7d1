package worker

import (
	"slices"

	"github.com/jetfabric/jetfabric/codec"
)

// inPlacer is a backend whose ops may write an output over an input of
// the same dtype and shape, for the ops that InPlace names (the CPU
// backend: elementwise ops and the optimizer steps, whose element i of
// every output reads only element i of the inputs).
type inPlacer interface {
	InPlace(op string) bool
}

// donations marks the inputs of ops[n], a compute op that ip runs in
// place, that nothing names after it but a free (the next op after it
// that names the input is a free, as a replay's plan frees an optimizer
// step's old parameter and moments): their buffers may become its
// outputs' (see exec.compute), which then write memory already in cache
// instead of fresh buffers. An input named twice by the op, or among its
// outputs, is not marked. It returns nil when none is (uses is
// frameUses(ops)).
func donations(ip inPlacer, ops []codec.Op, uses map[uint64][]int, n int) []bool {
	op := &ops[n]
	if ip == nil || uses == nil || len(op.In) == 0 || !ip.InPlace(op.Op) {
		return nil
	}
	var marks []bool
	for i, id := range op.In {
		if slices.Index(op.In, id) != i || slices.Contains(op.In[i+1:], id) || slices.Contains(op.Out, id) {
			continue
		}
		k := slices.Index(uses[id], n)
		if k < 0 || k+1 >= len(uses[id]) || ops[uses[id][k+1]].Op != opFree {
			continue
		}
		if marks == nil {
			marks = make([]bool, len(op.In))
		}
		marks[i] = true
	}
	return marks
}
