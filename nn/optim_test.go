package nn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
)

// ltTorchOpt is a float64 transcription of torch.optim's single-tensor
// update loops (SGD, Adam, AdamW), element by element.
type ltTorchOpt struct {
	kind                        string // "sgd", "adam", "adamw"
	lr, momentum, dampening, wd float64
	nesterov                    bool
	beta1, beta2, eps           float64
	buf, m, v                   []float64
	t                           int
}

func (o *ltTorchOpt) step(p, grad []float64) {
	o.t++
	g := append([]float64(nil), grad...)
	switch o.kind {
	case "sgd":
		for i := range p {
			if o.wd != 0 {
				g[i] += o.wd * p[i]
			}
		}
		if o.momentum != 0 {
			if o.buf == nil {
				o.buf = append([]float64(nil), g...)
			} else {
				for i := range o.buf {
					o.buf[i] = o.buf[i]*o.momentum + (1-o.dampening)*g[i]
				}
			}
			for i := range g {
				if o.nesterov {
					g[i] += o.momentum * o.buf[i]
				} else {
					g[i] = o.buf[i]
				}
			}
		}
		for i := range p {
			p[i] -= o.lr * g[i]
		}
	case "adam", "adamw":
		if o.m == nil {
			o.m, o.v = make([]float64, len(p)), make([]float64, len(p))
		}
		for i := range p {
			if o.kind == "adamw" {
				p[i] *= 1 - o.lr*o.wd
			} else if o.wd != 0 {
				g[i] += o.wd * p[i]
			}
			o.m[i] += (g[i] - o.m[i]) * (1 - o.beta1) // lerp
			o.v[i] = o.v[i]*o.beta2 + (1-o.beta2)*g[i]*g[i]
			bc1 := 1 - math.Pow(o.beta1, float64(o.t))
			bc2 := 1 - math.Pow(o.beta2, float64(o.t))
			denom := math.Sqrt(o.v[i])/math.Sqrt(bc2) + o.eps
			p[i] -= o.lr / bc1 * o.m[i] / denom
		}
	}
}

// TestOptimizerStep runs three steps of each optimizer on known gradients
// and compares the parameter with PyTorch's formulas computed here.
func TestOptimizerStep(t *testing.T) {
	s := ltNewSession(t)
	p0 := []float64{0.5, -1, 2, 0}
	grads := [][]float64{{0.1, -0.2, 0.3, 0}, {-0.4, 0, 0.25, 1e-3}, {0.05, 0.5, -1, 2}}
	tests := []struct {
		name string
		opt  func() nn.Optimizer
		ref  ltTorchOpt
	}{
		{"SGD", func() nn.Optimizer { return &nn.SGD{LR: 0.1} }, ltTorchOpt{kind: "sgd", lr: 0.1}},
		{"SGD momentum dampening weight decay", func() nn.Optimizer {
			return &nn.SGD{LR: 0.05, Momentum: 0.9, Dampening: 0.1, WeightDecay: 0.01}
		}, ltTorchOpt{kind: "sgd", lr: 0.05, momentum: 0.9, dampening: 0.1, wd: 0.01}},
		{"SGD Nesterov", func() nn.Optimizer { return &nn.SGD{LR: 0.1, Momentum: 0.8, Nesterov: true} },
			ltTorchOpt{kind: "sgd", lr: 0.1, momentum: 0.8, nesterov: true}},
		{"Adam defaults", func() nn.Optimizer { return nn.NewAdam(0.1) },
			ltTorchOpt{kind: "adam", lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8}},
		{"Adam L2", func() nn.Optimizer { return &nn.Adam{LR: 0.01, Beta1: 0.5, Beta2: 0.9, Eps: 1e-3, WeightDecay: 0.1} },
			ltTorchOpt{kind: "adam", lr: 0.01, beta1: 0.5, beta2: 0.9, eps: 1e-3, wd: 0.1}},
		{"AdamW", func() nn.Optimizer { a := nn.NewAdamW(0.1); a.WeightDecay = 0.2; return a },
			ltTorchOpt{kind: "adamw", lr: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: 0.2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := &nn.Param{Name: "p", T: ltFromValues(t, s, kernels.Float64, []int{2, 2}, p0).RequireGrad()}
			frozen := &nn.Param{Name: "frozen", T: ltFromValues(t, s, kernels.Float64, []int{1}, []float64{7}).RequireGrad()}
			opt := tt.opt()
			ref := tt.ref
			want := append([]float64(nil), p0...)
			for i, g := range grads {
				old := p.T
				p.T.SetGrad(ltFromValues(t, s, kernels.Float64, []int{2, 2}, g))
				if err := opt.Step([]*nn.Param{p, frozen}); err != nil {
					t.Fatal(err)
				}
				ref.step(want, g)
				if !old.Freed() || p.T == old || !p.T.RequiresGrad() || !p.T.IsLeaf() {
					t.Fatalf("step %d: the old tensor was not replaced by a new leaf", i)
				}
				if p.T.Grad() == nil {
					t.Fatalf("step %d: the new tensor lost the gradient", i)
				}
				ltCloseTo(t, fmt.Sprintf("step %d", i+1), ltValues(t, p.T), want, 1e-12)
				p.T.Grad().Free()
			}
			if v := ltValues(t, frozen.T); v[0] != 7 {
				t.Errorf("a parameter without a gradient changed to %v", v)
			}
		})
	}
}

func TestOptimizerErrors(t *testing.T) {
	s := ltNewSession(t)
	newP := func() *nn.Param {
		return &nn.Param{Name: "w", T: ltFromValues(t, s, kernels.Float32, []int{2}, []float64{1, 2}).RequireGrad()}
	}
	bad := newP()
	bad.T.SetGrad(ltFromValues(t, s, kernels.Float32, []int{3}, []float64{1, 2, 3}))
	good := newP()
	good.T.SetGrad(ltFromValues(t, s, kernels.Float32, []int{2}, []float64{1, 1}))
	dup := newP()
	tests := []struct {
		name   string
		opt    nn.Optimizer
		params []*nn.Param
	}{
		{"gradient of another shape", &nn.SGD{LR: 0.1}, []*nn.Param{good, bad}},
		{"nil parameter", nn.NewAdam(0.1), []*nn.Param{good, nil}},
		{"repeated parameter", nn.NewAdam(0.1), []*nn.Param{dup, dup}},
		{"beta of 1", &nn.Adam{LR: 0.1, Beta1: 1, Beta2: 0.9}, []*nn.Param{good}},
		{"negative lr", &nn.AdamW{LR: -1, Beta1: 0.9, Beta2: 0.9}, []*nn.Param{good}},
		{"Nesterov without momentum", &nn.SGD{LR: 0.1, Nesterov: true}, []*nn.Param{good}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := good.T
			if err := tt.opt.Step(tt.params); !errors.Is(err, nn.ErrInvalidArgument) {
				t.Fatalf("Step: %v, want ErrInvalidArgument", err)
			}
			if good.T != before || before.Freed() {
				t.Fatalf("a failed Step changed a parameter")
			}
		})
	}
	ltCloseTo(t, "untouched parameter", ltValues(t, good.T), []float64{1, 2}, 0)
}

// ltTensorBytes is the worker's gauge of the tensor memory its sessions hold.
func ltTensorBytes(t testing.TB, w *worker.Worker) int {
	t.Helper()
	var buf bytes.Buffer
	if err := w.WriteMetrics(&buf); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^jetfabric_device_tensor_bytes\{device="cpu-0"\} (\S+)$`).FindSubmatch(buf.Bytes())
	if m == nil {
		t.Fatalf("no tensor bytes gauge in\n%s", buf.Bytes())
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(v)
}

// ltSyncedBytes waits for s's queued ops and returns the worker's tensor
// bytes.
func ltSyncedBytes(t testing.TB, s *client.Session, w *worker.Worker) int {
	t.Helper()
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ltTensorBytes(t, w)
}

// TestTrainXOR trains a two-layer network on XOR with each optimizer to a
// small loss, reading the loss only at the end, and checks that an
// optimizer step leaves the worker's tensor memory as it found it (the old
// parameters and state freed, the gradients kept).
func TestTrainXOR(t *testing.T) {
	c, w := ltLayerFabric(t)
	ctx := context.Background()
	tests := []struct {
		name  string
		opt   nn.Optimizer
		steps int
		max   float64
	}{
		{"Adam", nn.NewAdam(0.05), 150, 1e-4},
		{"AdamW", nn.NewAdamW(0.05), 150, 1e-4},
		{"SGD momentum", &nn.SGD{LR: 0.2, Momentum: 0.9}, 150, 1e-4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ltOpenSession(t, c)
			s.Seed(3)
			l1, err := nn.NewLinear(s, 2, 8)
			if err != nil {
				t.Fatal(err)
			}
			l2, err := nn.NewLinear(s, 8, 1)
			if err != nil {
				t.Fatal(err)
			}
			model := nn.NewSequential(l1, nn.SiLU{}, l2)
			x := ltFromValues(t, s, kernels.Float32, []int{4, 2}, []float64{0, 0, 0, 1, 1, 0, 1, 1})
			y := ltFromValues(t, s, kernels.Float32, []int{4, 1}, []float64{0, 1, 1, 0})
			var loss float64
			var mem []int
			for step := range tt.steps {
				out, err := model.Forward(x)
				if err != nil {
					t.Fatal(err)
				}
				d := nn.Sub(out, y)
				l := nn.Mean(nn.Mul(d, d), nil, false)
				if err := nn.Backward(l); err != nil {
					t.Fatal(err)
				}
				check := step == 20 || step == tt.steps-1
				if check {
					mem = append(mem, ltSyncedBytes(t, s, w))
				}
				if err := tt.opt.Step(model.Params()); err != nil {
					t.Fatal(err)
				}
				if check {
					if after := ltSyncedBytes(t, s, w); after != mem[len(mem)-1] {
						t.Errorf("step %d: the optimizer's step took the session from %d to %d tensor bytes", step, mem[len(mem)-1], after)
					}
				}
				if step == tt.steps-1 {
					if loss, err = l.Item(ctx); err != nil {
						t.Fatal(err)
					}
				}
				l.Free()
			}
			t.Logf("%s: loss %.3g after %d steps; session memory %v bytes at steps 20 and %d", tt.name, loss, tt.steps, mem, tt.steps-1)
			if !(loss < tt.max) {
				t.Errorf("loss %v after %d steps, want < %v", loss, tt.steps, tt.max)
			}
			if mem[0] != mem[1] {
				t.Errorf("the session's tensor memory went from %d bytes at step 20 to %d at step %d", mem[0], mem[1], tt.steps-1)
			}
		})
	}
}

// TestTrainLinearRegression fits y = 3x - 2 with one Linear layer and SGD.
func TestTrainLinearRegression(t *testing.T) {
	s := ltNewSession(t)
	s.Seed(1)
	lin, err := nn.NewLinear(s, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	xs := []float64{-1, -0.5, 0, 0.5, 1, 1.5}
	ys := ltMapf(xs, func(v float64) float64 { return 3*v - 2 })
	x := ltFromValues(t, s, kernels.Float32, []int{6, 1}, xs)
	y := ltFromValues(t, s, kernels.Float32, []int{6, 1}, ys)
	opt := &nn.SGD{LR: 0.1, Momentum: 0.5}
	for range 200 {
		out, err := lin.Forward(x)
		if err != nil {
			t.Fatal(err)
		}
		d := nn.Sub(out, y)
		l := nn.Mean(nn.Mul(d, d), nil, false)
		if err := nn.Backward(l); err != nil {
			t.Fatal(err)
		}
		if err := opt.Step(lin.Params()); err != nil {
			t.Fatal(err)
		}
		l.Free()
	}
	w, b := ltValues(t, lin.Weight.T), ltValues(t, lin.Bias.T)
	if math.Abs(w[0]-3) > 1e-4 || math.Abs(b[0]+2) > 1e-4 {
		t.Fatalf("fit w = %v, b = %v, want 3 and -2", w[0], b[0])
	}
}
