package worker_test

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// fakeFuser is the CPU backend with ExecFused, which runs a group's ops
// one by one and records the groups it was given; refuse makes it answer
// ErrNotImplemented.
type fakeFuser struct {
	*cpu.Backend
	refuse bool
	mu     sync.Mutex
	groups []kernels.FusedGroup
	relus  int // ExecRelu calls
}

// ExecRelu counts the calls and runs the CPU backend's.
func (f *fakeFuser) ExecRelu(op *kernels.Op, in, out []*kernels.Tensor) error {
	f.mu.Lock()
	f.relus++
	f.mu.Unlock()
	return f.Backend.ExecRelu(op, in, out)
}

func (f *fakeFuser) ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	f.mu.Lock()
	f.groups = append(f.groups, *g)
	f.mu.Unlock()
	if f.refuse {
		return kernels.ErrNotImplemented
	}
	metas := make([]kernels.Meta, len(in))
	for i, t := range in {
		metas[i] = t.Meta
	}
	vals, err := kernels.InferFused(g, metas, kernels.Limits{})
	if err != nil {
		return err
	}
	ts := append([]*kernels.Tensor(nil), in...)
	var temps []kernels.Buffer
	defer func() {
		for _, b := range temps {
			f.Free(b)
		}
	}()
	for k := range g.Ops {
		v := g.Inputs + k
		var t *kernels.Tensor
		for j, r := range g.Results {
			if r == v {
				t = out[j]
			}
		}
		if t == nil {
			buf, err := f.Alloc(vals[v].Bytes())
			if err != nil {
				return err
			}
			temps = append(temps, buf)
			t = &kernels.Tensor{Meta: vals[v], Buf: buf}
		}
		args := make([]*kernels.Tensor, len(g.Ops[k].Args))
		for j, a := range g.Ops[k].Args {
			args[j] = ts[a]
		}
		if err := f.Exec(&g.Ops[k].Op, args, []*kernels.Tensor{t}); err != nil {
			return err
		}
		ts = append(ts, t)
	}
	return nil
}

func (f *fakeFuser) taken() []kernels.FusedGroup {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.groups
	f.groups = nil
	return g
}

// The same frames on cpu-0 (op by op) and cpu-1 (a fusing backend) give
// the same bits and the same errors; freed intermediates are never
// written, kept ones are readable in later frames.
func TestFusion(t *testing.T) {
	b := brokertest.Run(t)
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse=%v", refuse), func(t *testing.T) {
			ff := &fakeFuser{Backend: cpu.New(), refuse: refuse}
			w := startWorker(t, b, func(c *worker.Config) {
				c.Devices = []worker.Device{
					// Op by op: the CPU backend without its fusing methods.
					{Name: "cpu-0", Kind: "cpu", Backend: struct{ kernels.Backend }{cpu.New()}},
					{Name: "cpu-1", Kind: "cpu", Backend: ff},
				}
			})
			sid := fmt.Sprintf("f%v", refuse)
			plain := newRaw(t, b, "fabric.ops.cpu-0."+sid)
			fused := newRaw(t, b, "fabric.ops.cpu-1."+sid)
			frames := append(slices.Clone(fusionFrames),
				// A cast and a comparison in a run.
				`{"v":1,"ops":[
				{"op":"cast","out":[20],"in":[1],"dtype":"f64"},
				{"op":"gt","out":[21],"in":[20,20]},
				{"op":"read","in":[21],"tag":6}]}`,
				// A convolution and the relu of its output, which is
				// dropped (the backend takes relu as it writes), then one
				// whose output is kept and read.
				`{"v":1,"ops":[
				{"op":"uniform","out":[30],"dtype":"f32","shape":[2,8,6,5],"low":-1,"high":1},
				{"op":"uniform","out":[31],"dtype":"f32","shape":[9,8,3,3],"low":-1,"high":1},
				{"op":"uniform","out":[32],"dtype":"f32","shape":[9],"low":-1,"high":1},
				{"op":"conv2d","out":[33],"in":[30,31,32]},
				{"op":"relu","out":[34],"in":[33]},
				{"op":"free","in":[33]},
				{"op":"read","in":[34],"tag":7}]}`,
				`{"v":1,"ops":[
				{"op":"conv2d","out":[35],"in":[30,31]},
				{"op":"relu","out":[36],"in":[35]},
				{"op":"read","in":[35],"tag":8},
				{"op":"read","in":[36],"tag":9},
				{"op":"read","in":[33],"tag":10}]}`,
			)
			for i, fr := range frames {
				plain.sendJSON(fr)
				fused.sendJSON(fr)
				want, got := plain.result(), fused.result()
				if !sameResult(want, got) {
					t.Errorf("frame %d: op by op %+v, fused %+v", i, describe(want), describe(got))
				}
				if i == 3 && (len(got.Errors) == 0 || got.Errors[0].Code != codec.CodeUnknownID) {
					t.Errorf("read of a freed intermediate: %+v", got.Errors)
				}
			}
			ff.mu.Lock()
			relus := ff.relus
			ff.mu.Unlock()
			if relus != 1 {
				t.Errorf("%d convolutions ran with their relu, want 1 (the one whose output is dropped)", relus)
			}
			groups := ff.taken()
			if len(groups) < 1 {
				t.Fatal("no fused group reached the backend")
			}
			if g := groups[0]; len(g.Ops) != 5 || fmt.Sprint(g.Results) != fmt.Sprint([]int{4, 5, 6}) {
				t.Errorf("first group: %d ops, results %v; want 5 ops, results [4 5 6] (values of ids 5, 6, 7)", len(g.Ops), g.Results)
			}
			_ = w
		})
	}
}

func sameResult(a, b codec.Result) bool {
	if a.Tag != b.Tag || len(a.Errors) != len(b.Errors) || (a.Tensor == nil) != (b.Tensor == nil) {
		return false
	}
	for i := range a.Errors {
		if a.Errors[i].Code != b.Errors[i].Code || a.Errors[i].Index != b.Errors[i].Index || a.Errors[i].Op != b.Errors[i].Op {
			return false
		}
	}
	return a.Tensor == nil || a.Tensor.DType == b.Tensor.DType && fmt.Sprint(a.Tensor.Shape) == fmt.Sprint(b.Tensor.Shape) && bytes.Equal(a.Tensor.Data, b.Tensor.Data)
}

func describe(r codec.Result) string {
	s := fmt.Sprintf("tag %d errors %v", r.Tag, r.Errors)
	if r.Tensor != nil {
		s += fmt.Sprintf(" tensor %s %v %v", r.Tensor.DType, r.Tensor.Shape, r.Tensor.Values)
	}
	return s
}

// groupRecorder is the CPU backend recording the groups it fused and the
// ones it refused.
type groupRecorder struct {
	*cpu.Backend
	mu             sync.Mutex
	fused, refused [][]string // the ops of each group
}

func (g *groupRecorder) ExecFused(fg *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	err := g.Backend.ExecFused(fg, in, out)
	var names []string
	for _, op := range fg.Ops {
		names = append(names, op.Op.Name)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.fused = append(g.fused, names)
	} else {
		g.refused = append(g.refused, names)
	}
	return err
}

// TestFusionWithoutTheReduction: a run closed by a reduction that the
// backend does not fuse (the CPU backend fuses none) fuses without it, as
// a ReLU's gradient (sign, mul) before the sum of a bias's gradient, with
// the bits of the ops one by one.
func TestFusionWithoutTheReduction(t *testing.T) {
	b := brokertest.Run(t)
	gr := &groupRecorder{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{
			{Name: "cpu-0", Kind: "cpu", Backend: struct{ kernels.Backend }{cpu.New()}},
			{Name: "cpu-1", Kind: "cpu", Backend: gr},
		}
	})
	body := `{"v":1,"ops":[
		{"op":"seed","seed":9},
		{"op":"uniform","out":[1],"dtype":"f32","shape":[64,300],"low":-1,"high":1},
		{"op":"uniform","out":[2],"dtype":"f32","shape":[64,300],"low":-1,"high":1},
		{"op":"relu","out":[3],"in":[1]},
		{"op":"sign","out":[4],"in":[3]},
		{"op":"mul","out":[5],"in":[2,4]},
		{"op":"sum","out":[6],"in":[5],"axes":[0]},
		{"op":"free","in":[4]},
		{"op":"read","in":[6],"tag":1}]}`
	plain := newRaw(t, b, "fabric.ops.cpu-0.r")
	fused := newRaw(t, b, "fabric.ops.cpu-1.r")
	plain.sendJSON(body)
	fused.sendJSON(body)
	want, got := plain.result(), fused.result()
	if !sameResult(want, got) || len(got.Errors) > 0 {
		t.Fatalf("op by op %s, fused %s", describe(want), describe(got))
	}
	plain.sendJSON(`{"v":1,"ops":[{"op":"read","in":[5],"tag":2}]}`)
	fused.sendJSON(`{"v":1,"ops":[{"op":"read","in":[5],"tag":2}]}`)
	if want, got := plain.result(), fused.result(); !sameResult(want, got) || len(got.Errors) > 0 {
		t.Fatalf("the kept product: op by op %s, fused %s", describe(want), describe(got))
	}
	gr.mu.Lock()
	defer gr.mu.Unlock()
	if fmt.Sprint(gr.refused) != "[[relu sign mul sum]]" || fmt.Sprint(gr.fused) != "[[relu sign mul]]" {
		t.Errorf("refused %v, fused %v; want [[relu sign mul sum]] refused, [[relu sign mul]] fused", gr.refused, gr.fused)
	}
}
