package worker_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// aliasRecorder is the CPU backend recording, for each op it runs, which
// outputs are written over an input's buffer.
type aliasRecorder struct {
	*cpu.Backend
	mu      sync.Mutex
	aliases []string // op: output j over input i
}

func (a *aliasRecorder) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	for j, o := range out {
		for i, t := range in {
			if o.Buf == t.Buf {
				a.mu.Lock()
				a.aliases = append(a.aliases, fmt.Sprintf("%s: out %d over in %d", op.Name, j, i))
				a.mu.Unlock()
			}
		}
	}
	return a.Backend.Exec(op, in, out)
}

func (a *aliasRecorder) taken() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.aliases
	a.aliases = nil
	return d
}

// donateFrames are optimizer steps and elementwise ops whose inputs are
// freed after them (their buffers become the outputs'), or read, or kept,
// or named twice (which keeps them), with the outputs each frame's ops
// write over an input.
var donateFrames = []struct {
	body    string
	aliases string
}{
	{`{"v":1,"ops":[
		{"op":"uniform","out":[1],"dtype":"f32","shape":[40,33],"low":-1,"high":1},
		{"op":"uniform","out":[2],"dtype":"f32","shape":[40,33],"low":-1,"high":1},
		{"op":"uniform","out":[3],"dtype":"f32","shape":[40,33],"low":-1,"high":1},
		{"op":"uniform","out":[4],"dtype":"f32","shape":[40,33],"low":0,"high":1},
		{"op":"adam_step","out":[5,6,7],"in":[1,2,3,4],"lr":0.01,"beta1":0.9,"beta2":0.999,"eps":1e-8,"t":3},
		{"op":"free","in":[1,3,4]},
		{"op":"read","in":[5],"tag":1}]}`, "[adam_step: out 0 over in 0 adam_step: out 1 over in 2 adam_step: out 2 over in 3]"},
	{`{"v":1,"ops":[{"op":"read","in":[6],"tag":2}]}`, "[]"},
	{`{"v":1,"ops":[{"op":"read","in":[7],"tag":3}]}`, "[]"},
	// The freed inputs are gone, as they would be.
	{`{"v":1,"ops":[{"op":"read","in":[1],"tag":4}]}`, "[]"},
	// The gradient, kept, is unchanged.
	{`{"v":1,"ops":[{"op":"read","in":[2],"tag":5}]}`, "[]"},
	// An input read after the op keeps its buffer, and its values.
	{`{"v":1,"ops":[
		{"op":"adam_step","out":[8,9,10],"in":[5,2,6,7],"lr":0.01,"beta1":0.9,"beta2":0.999,"eps":1e-8,"t":4},
		{"op":"read","in":[5],"tag":6},
		{"op":"free","in":[5,6,7]},
		{"op":"read","in":[8],"tag":7}]}`, "[adam_step: out 0 over in 2 adam_step: out 1 over in 3]"},
	// An elementwise op over a freed input; one whose input is named
	// twice; one of another dtype.
	{`{"v":1,"ops":[
		{"op":"mul","out":[11],"in":[8,2]},
		{"op":"free","in":[8]},
		{"op":"add","out":[12],"in":[11,11]},
		{"op":"free","in":[11]},
		{"op":"cast","out":[13],"in":[12],"dtype":"f64"},
		{"op":"free","in":[12]},
		{"op":"read","in":[13],"tag":8}]}`, "[mul: out 0 over in 0]"},
	// An op that fails (a moment of another dtype) keeps its inputs.
	{`{"v":1,"ops":[
		{"op":"adam_step","out":[14,15,16],"in":[9,2,10,13],"lr":0.01,"beta1":0.9,"beta2":0.999,"eps":1e-8,"t":5},
		{"op":"read","in":[9],"tag":9},
		{"op":"free","in":[9]}]}`, "[]"},
	{`{"v":1,"ops":[{"op":"read","in":[10],"tag":10}]}`, "[]"},
}

// TestDonation: on a backend that writes in place, an op whose inputs are
// freed right after it writes its outputs over their buffers, with the
// results and errors of a device that allocates every output.
func TestDonation(t *testing.T) {
	b := brokertest.Run(t)
	ar := &aliasRecorder{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{
			{Name: "cpu-0", Kind: "cpu", Backend: struct{ kernels.Backend }{cpu.New()}},
			{Name: "cpu-1", Kind: "cpu", Backend: ar},
		}
	})
	plain := newRaw(t, b, "fabric.ops.cpu-0.d")
	donating := newRaw(t, b, "fabric.ops.cpu-1.d")
	for _, r := range []*rawSession{plain, donating} {
		r.sendJSON(`{"v":1,"ops":[{"op":"seed","seed":7}]}`)
	}
	for i, fr := range donateFrames {
		plain.sendJSON(fr.body)
		donating.sendJSON(fr.body)
		if i == 5 { // two reads
			want, got := plain.result(), donating.result()
			if !sameResult(want, got) || got.Tensor == nil {
				t.Errorf("frame %d, first read: in place %s, allocating %s", i, describe(got), describe(want))
			}
		}
		want, got := plain.result(), donating.result()
		if !sameResult(want, got) {
			t.Errorf("frame %d: in place %s, allocating %s", i, describe(got), describe(want))
		}
		wantErr := i == 3 || i == 7
		if (len(got.Errors) > 0) != wantErr || i != 3 && got.Tensor == nil {
			t.Errorf("frame %d: %s", i, describe(got))
		}
		if a := fmt.Sprint(ar.taken()); a != fr.aliases {
			t.Errorf("frame %d: written over inputs %s, want %s", i, a, fr.aliases)
		}
	}
}
