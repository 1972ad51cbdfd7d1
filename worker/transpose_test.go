package worker_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// foldCounter is the CPU backend counting the matmuls of transposed
// operands it runs.
type foldCounter struct {
	*cpu.Backend
	mu    sync.Mutex
	folds []string // each ExecMatmulT that succeeded: which operands, shapes
}

func (f *foldCounter) ExecMatmulT(op *kernels.Op, trans [2]bool, in, out []*kernels.Tensor) error {
	err := f.Backend.ExecMatmulT(op, trans, in, out)
	if err == nil {
		f.mu.Lock()
		f.folds = append(f.folds, fmt.Sprint(trans, in[0].Shape, in[1].Shape))
		f.mu.Unlock()
	}
	return err
}

func (f *foldCounter) taken() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.folds
	f.folds = nil
	return d
}

// transposeFrames pair permutes with the matmul that reads them, frame by
// frame, with the folds a backend that reads transposed operands in place
// makes of each, then the cases that must not fold: a transpose kept, or
// read by another op, a permute that swaps nothing or has three axes, a
// dtype the backend refuses, and bad input, whose errors must be those of
// the ops one by one.
var transposeFrames = []struct {
	body  string
	folds int
}{
	{`{"v":1,"ops":[
		{"op":"uniform","out":[1],"dtype":"f32","shape":[37,70],"low":-1,"high":1},
		{"op":"uniform","out":[2],"dtype":"f32","shape":[50,70],"low":-1,"high":1},
		{"op":"uniform","out":[3],"dtype":"f32","shape":[37,50],"low":-1,"high":1},
		{"op":"uniform","out":[4],"dtype":"f64","shape":[300,257],"low":-1,"high":1},
		{"op":"uniform","out":[5],"dtype":"f64","shape":[300,40],"low":-1,"high":1},
		{"op":"uniform","out":[6],"dtype":"f32","shape":[60,37],"low":-1,"high":1},
		{"op":"uniform","out":[7],"dtype":"f32","shape":[40,40],"low":-1,"high":1},
		{"op":"permute","out":[10],"in":[2],"perm":[1,0]},
		{"op":"matmul","out":[11],"in":[1,10]},
		{"op":"free","in":[10]},
		{"op":"read","in":[11],"tag":1}]}`, 1},
	// gᵀ·x, a weight's gradient; f64, k over one block of the product.
	{`{"v":1,"ops":[
		{"op":"permute","out":[12],"in":[4],"perm":[-1,-2]},
		{"op":"matmul","out":[13],"in":[12,5]},
		{"op":"free","in":[12]},
		{"op":"read","in":[13],"tag":2}]}`, 1},
	// Both operands transposed, freed in one free after another op.
	{`{"v":1,"ops":[
		{"op":"permute","out":[14],"in":[1],"perm":[1,0]},
		{"op":"permute","out":[15],"in":[6],"perm":[1,0]},
		{"op":"matmul","out":[16],"in":[14,15]},
		{"op":"exp","out":[17],"in":[16]},
		{"op":"free","in":[15,14]},
		{"op":"read","in":[16],"tag":3}]}`, 1},
	// A transpose read by the matmul twice.
	{`{"v":1,"ops":[
		{"op":"permute","out":[18],"in":[7],"perm":[1,0]},
		{"op":"matmul","out":[19],"in":[18,18]},
		{"op":"free","in":[18]},
		{"op":"read","in":[19],"tag":4}]}`, 1},
	// A transpose kept (no free): stored, and readable.
	{`{"v":1,"ops":[
		{"op":"permute","out":[20],"in":[2],"perm":[1,0]},
		{"op":"matmul","out":[21],"in":[1,20]},
		{"op":"read","in":[20],"tag":5}]}`, 0},
	// A transpose read by another op before its free.
	{`{"v":1,"ops":[
		{"op":"permute","out":[22],"in":[2],"perm":[1,0]},
		{"op":"matmul","out":[23],"in":[1,22]},
		{"op":"neg","out":[24],"in":[22]},
		{"op":"free","in":[22]},
		{"op":"read","in":[24],"tag":6}]}`, 0},
	// A permute that swaps nothing, one of three axes.
	{`{"v":1,"ops":[
		{"op":"permute","out":[25],"in":[3],"perm":[0,1]},
		{"op":"matmul","out":[26],"in":[25,2]},
		{"op":"free","in":[25]},
		{"op":"uniform","out":[27],"dtype":"f32","shape":[2,37,50],"low":-1,"high":1},
		{"op":"permute","out":[28],"in":[27],"perm":[0,2,1]},
		{"op":"matmul","out":[29],"in":[28,3]},
		{"op":"free","in":[28]},
		{"op":"read","in":[29],"tag":7}]}`, 0},
	// f16, which the backend refuses: the ops one by one.
	{`{"v":1,"ops":[
		{"op":"cast","out":[30],"in":[1],"dtype":"f16"},
		{"op":"cast","out":[31],"in":[2],"dtype":"f16"},
		{"op":"permute","out":[32],"in":[31],"perm":[1,0]},
		{"op":"matmul","out":[33],"in":[30,32]},
		{"op":"free","in":[32]},
		{"op":"read","in":[33],"tag":8}]}`, 0},
	// Inner dimensions that differ: the matmul's error, at its index.
	{`{"v":1,"ops":[
		{"op":"permute","out":[34],"in":[1],"perm":[1,0]},
		{"op":"matmul","out":[35],"in":[1,34]},
		{"op":"permute","out":[36],"in":[2],"perm":[1,0]},
		{"op":"matmul","out":[37],"in":[36,3]},
		{"op":"free","in":[34,36]},
		{"op":"read","in":[37],"tag":9}]}`, 1},
	// A permute of a tensor that does not exist, and a matmul into an
	// id that is taken.
	{`{"v":1,"ops":[
		{"op":"permute","out":[38],"in":[99],"perm":[1,0]},
		{"op":"matmul","out":[39],"in":[1,38]},
		{"op":"free","in":[38]},
		{"op":"permute","out":[40],"in":[2],"perm":[1,0]},
		{"op":"matmul","out":[11],"in":[1,40]},
		{"op":"free","in":[40]},
		{"op":"read","in":[39],"tag":10}]}`, 0},
	// The transposes of the folds were never stored.
	{`{"v":1,"ops":[{"op":"read","in":[10],"tag":11}]}`, 0},
	{`{"v":1,"ops":[{"op":"read","in":[14],"tag":12}]}`, 0},
	// What the folds made, read again.
	{`{"v":1,"ops":[{"op":"read","in":[13],"tag":13}]}`, 0},
	{`{"v":1,"ops":[{"op":"read","in":[21],"tag":14}]}`, 0},
}

// TestTransposedMatmul: a device whose backend reads transposed operands
// in place runs a permute and the matmul that reads it as one where the
// transpose is dropped after it, with the bits and errors of a device
// that runs them one by one.
func TestTransposedMatmul(t *testing.T) {
	b := brokertest.Run(t)
	fc := &foldCounter{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{
			{Name: "cpu-0", Kind: "cpu", Backend: struct{ kernels.Backend }{cpu.New()}},
			{Name: "cpu-1", Kind: "cpu", Backend: fc},
		}
	})
	plain := newRaw(t, b, "fabric.ops.cpu-0.t")
	folded := newRaw(t, b, "fabric.ops.cpu-1.t")
	for _, r := range []*rawSession{plain, folded} {
		r.sendJSON(`{"v":1,"ops":[{"op":"seed","seed":5}]}`)
	}
	for i, fr := range transposeFrames {
		plain.sendJSON(fr.body)
		folded.sendJSON(fr.body)
		want, got := plain.result(), folded.result()
		if !sameResult(want, got) {
			t.Errorf("frame %d: op by op %s, folded %s", i, describe(want), describe(got))
		}
		if folds := fc.taken(); len(folds) != fr.folds {
			t.Errorf("frame %d: folds %v, want %d", i, folds, fr.folds)
		}
		switch i {
		case 8, 9, 10, 11:
			if len(got.Errors) == 0 {
				t.Errorf("frame %d: no error", i)
			}
		default:
			if len(got.Errors) > 0 || got.Tensor == nil {
				t.Errorf("frame %d: %s", i, describe(got))
			}
		}
	}
}

// TestReplayFoldsTransposes: a replay on a backend that reads transposed
// operands in place runs each permute and the matmul that reads it as
// one, even where the plan frees a tensor between them, with the bits of
// the replay on a backend that runs its ops one by one.
func TestReplayFoldsTransposes(t *testing.T) {
	b := brokertest.Run(t)
	fc := &foldCounter{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{
			{Name: "cpu-0", Kind: "cpu", Backend: struct{ kernels.Backend }{cpu.New()}},
			{Name: "cpu-1", Kind: "cpu", Backend: fc},
		}
	})
	// x·(w*w)ᵀ + g and gᵀ·x: the first permute's input is freed by the
	// plan right after it.
	g := &codec.Graph{
		V: codec.Version,
		Inputs: []codec.Placeholder{
			{DType: "f32", Shape: []int{37, 70}}, {DType: "f32", Shape: []int{50, 70}}, {DType: "f32", Shape: []int{37, 50}},
		},
		Ops: []codec.Op{
			{Op: "mul", Out: []uint64{4}, In: []uint64{2, 2}},
			{Op: "permute", Out: []uint64{5}, In: []uint64{4}, Perm: []int{1, 0}},
			{Op: "matmul", Out: []uint64{6}, In: []uint64{1, 5}},
			{Op: "permute", Out: []uint64{7}, In: []uint64{3}, Perm: []int{1, 0}},
			{Op: "matmul", Out: []uint64{8}, In: []uint64{7, 1}},
			{Op: "add", Out: []uint64{9}, In: []uint64{6, 3}},
		},
		Outputs: []uint64{8, 9},
	}
	name := storeGraph(t, b, g)
	ops := []codec.Op{
		{Op: "seed", Seed: 3},
		{Op: "uniform", Out: []uint64{1}, DType: "f32", Shape: []int{37, 70}, Low: -1, High: 1},
		{Op: "uniform", Out: []uint64{2}, DType: "f32", Shape: []int{50, 70}, Low: -1, High: 1},
		{Op: "uniform", Out: []uint64{3}, DType: "f32", Shape: []int{37, 50}, Low: -1, High: 1},
		{Op: "replay", Graph: name, In: []uint64{1, 2, 3}, Base: 10, Out: []uint64{14, 15}},
		{Op: "read", In: []uint64{14}, Tag: 1},
	}
	plain := newRaw(t, b, "fabric.ops.cpu-0.rt")
	folded := newRaw(t, b, "fabric.ops.cpu-1.rt")
	for _, r := range []*rawSession{plain, folded} {
		if err := r.send("", frame(t, ops...)); err != nil {
			t.Fatal(err)
		}
		if err := r.send("", frame(t, codec.Op{Op: "read", In: []uint64{15}, Tag: 2})); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		want, got := plain.result(), folded.result()
		if !sameResult(want, got) || len(want.Errors) > 0 || want.Tensor == nil {
			t.Fatalf("one by one %s, folded %s", describe(want), describe(got))
		}
	}
	if folds := fc.taken(); len(folds) != 2 {
		t.Errorf("folds %v, want 2: the permutes of w*w and of g with their matmuls", folds)
	}
}
