package worker

import (
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/codec"
)

func TestPlanFusion(t *testing.T) {
	op := func(name string, out uint64, in ...uint64) codec.Op {
		o := codec.Op{Op: name, In: in}
		if out != 0 {
			o.Out = []uint64{out}
		}
		return o
	}
	free := func(ids ...uint64) codec.Op { return codec.Op{Op: opFree, In: ids} }
	for _, tc := range []struct {
		name  string
		ops   []codec.Op
		start int
		end   int
		keep  []bool
	}{
		{"one op is no run", []codec.Op{op("exp", 2, 1), free(1)}, 0, 0, nil},
		{"no free in the frame, no run", []codec.Op{op("exp", 2, 1), op("neg", 3, 2)}, 0, 0, nil},
		{"nothing dropped, no run", []codec.Op{op("exp", 2, 1), op("neg", 3, 2), free(1)}, 0, 0, nil},
		{"freed intermediates dropped", []codec.Op{
			op("mul", 3, 1, 2), op("add", 4, 3, 1), op("tanh", 5, 4), op("sum", 6, 5),
			free(3, 4), op("read", 0, 6)}, 0, 4, []bool{false, false, true, true}},
		{"a use before the free keeps", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("read", 0, 2), free(2)}, 0, 0, nil},
		{"reuse of the id before the free keeps", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("exp", 2, 1), free(2)}, 0, 0, nil},
		{"all freed keeps the last", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), free(2, 3)}, 0, 2, []bool{false, true}},
		{"stops at a matmul", []codec.Op{
			op("upload", 1), op("exp", 2, 1), op("neg", 3, 2), op("matmul", 4, 3, 3), op("exp", 5, 4), free(2)}, 1, 3, []bool{false, true}},
		{"reduction of an outside value ends the run before it", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("sum", 4, 1), free(2)}, 0, 2, []bool{false, true}},
		{"reduction closes the run", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("max", 4, 3), op("exp", 5, 4), free(2, 3)}, 0, 3, []bool{false, false, true}},
		{"a reduction alone starts no run", []codec.Op{op("exp", 2, 1), op("sum", 3, 2), free(2)}, 0, 0, nil},
		{"a duplicate output ends the run", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("abs", 2, 3), free(2)}, 0, 0, nil},
		{"an op of two outputs ends the run", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), {Op: "add", Out: []uint64{4, 5}, In: []uint64{3, 3}}, free(2)}, 0, 2, []bool{false, true}},
		{"too many results shrink the run", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("abs", 4, 3), op("exp", 5, 4), op("neg", 6, 5), op("abs", 7, 6), free(2)},
			0, 5, []bool{false, true, true, true, true}},
		{"a read after the run keeps", []codec.Op{
			op("exp", 2, 1), op("neg", 3, 2), op("abs", 4, 3), op("read", 0, 3), free(2, 3)}, 0, 3, []bool{false, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, keep := planFusion(tc.ops, frameUses(tc.ops), tc.start, len(tc.ops))
			if tc.end == 0 {
				tc.end = tc.start
			}
			if end != tc.end || !slices.Equal(keep, tc.keep) {
				t.Errorf("planFusion = %d, %v; want %d, %v", end, keep, tc.end, tc.keep)
			}
		})
	}
}

// TestPlanFusionStop: a run ends at its stop, and one that keeps fewer
// than two ops before it is no run.
func TestPlanFusionStop(t *testing.T) {
	op := func(name string, out uint64, in ...uint64) codec.Op {
		return codec.Op{Op: name, Out: []uint64{out}, In: in}
	}
	ops := []codec.Op{op("exp", 2, 1), op("neg", 3, 2), op("max", 4, 3), op("exp", 5, 4), {Op: opFree, In: []uint64{2, 3}}}
	uses := frameUses(ops)
	if end, keep := planFusion(ops, uses, 0, len(ops)); end != 3 || !slices.Equal(keep, []bool{false, false, true}) {
		t.Errorf("no stop: %d, %v; want 3, [false false true]", end, keep)
	}
	if end, keep := planFusion(ops, uses, 0, 2); end != 2 || !slices.Equal(keep, []bool{false, true}) {
		t.Errorf("stop before the reduction: %d, %v; want 2, [false true]", end, keep)
	}
	if end, keep := planFusion(ops, uses, 0, 1); end != 0 || keep != nil {
		t.Errorf("stop after one op: %d, %v; want no run", end, keep)
	}
}
