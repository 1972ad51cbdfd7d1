package nn_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// ltLayerFabric starts a broker and a CPU worker serving cpu-0, and returns a
// client connected to it and the worker.
func ltLayerFabric(t testing.TB) (*client.Client, *worker.Worker) {
	t.Helper()
	b := brokertest.Run(t)
	w := workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, w
}

func ltOpenSession(t testing.TB, c *client.Client) *client.Session {
	t.Helper()
	s, err := c.Open(context.Background(), "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// ltNewSession starts a fabric and opens one session on it.
func ltNewSession(t testing.TB) *client.Session {
	t.Helper()
	c, _ := ltLayerFabric(t)
	return ltOpenSession(t, c)
}

func ltFromValues(t testing.TB, s *client.Session, dt kernels.DType, shape []int, v []float64) *nn.Tensor {
	t.Helper()
	x, err := nn.FromValues(context.Background(), s, dt, shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func ltValues(t testing.TB, x *nn.Tensor) []float64 {
	t.Helper()
	v, err := x.Float64s(context.Background())
	if err != nil {
		t.Fatalf("read %v: %v", x, err)
	}
	return v
}

// ltRandoms returns n values of U(-1, 1), rounded to f32, from a fixed seed.
func ltRandoms(seed uint64, n int) []float64 {
	r := rand.New(rand.NewPCG(seed, 1))
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(float32(2*r.Float64() - 1))
	}
	return v
}

func ltCloseTo(t testing.TB, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(got[i] - want[i]); !(d <= tol*math.Max(1, math.Abs(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v (diff %g)\n got %v\nwant %v", what, i, got[i], want[i], d, got, want)
		}
	}
}

// ltProbes are the smallest valid uses of the ops that a build may not run
// yet (the spatial ops came with the training stack).
var ltProbes = map[string]func(s *client.Session) *nn.Tensor{
	"conv2d": func(s *client.Session) *nn.Tensor {
		one := nn.Ones(s, kernels.Float32, []int{1, 1, 1, 1})
		return nn.Conv2d(one, one, nil, nn.Conv2dOpts{})
	},
	"max_pool2d": func(s *client.Session) *nn.Tensor {
		return nn.MaxPool2d(nn.Ones(s, kernels.Float32, []int{1, 1, 2, 2}), nn.PoolOpts{Kernel: [2]int{2, 2}})
	},
	"avg_pool2d": func(s *client.Session) *nn.Tensor {
		return nn.AvgPool2d(nn.Ones(s, kernels.Float32, []int{1, 1, 2, 2}), nn.PoolOpts{Kernel: [2]int{2, 2}})
	},
}

// ltCanRun reports whether the worker behind s runs op, by running its probe.
func ltCanRun(t testing.TB, s *client.Session, op string) error {
	t.Helper()
	y := ltProbes[op](s)
	if err := y.Err(); err != nil {
		return err
	}
	_, err := y.Float64s(context.Background())
	return err
}

// ltNeedOp skips t when this build cannot run op yet.
func ltNeedOp(t *testing.T, s *client.Session, op string) {
	t.Helper()
	if err := ltCanRun(t, s, op); err != nil {
		t.Skipf("this build cannot run %s: %v", op, err)
	}
}

// Reference implementations in float64, over row-major slices (conv2d,
// max_pool2d and avg_pool2d checked against torch.nn.functional on these
// tests' cases).

func ltRefLinear(x []float64, rows int, w, b []float64, in, out int) []float64 {
	y := make([]float64, rows*out)
	for r := range rows {
		for o := range out {
			acc := 0.0
			if b != nil {
				acc = b[o]
			}
			for i := range in {
				acc += x[r*in+i] * w[o*in+i]
			}
			y[r*out+o] = acc
		}
	}
	return y
}

type ltConvShape struct {
	n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, g int
}

func (s ltConvShape) out() (int, int) {
	return (s.h+2*s.ph-s.dh*(s.kh-1)-1)/s.sh + 1, (s.w+2*s.pw-s.dw*(s.kw-1)-1)/s.sw + 1
}

func ltRefConv(x, w, b []float64, s ltConvShape) []float64 {
	oh, ow := s.out()
	cg, og := s.c/s.g, s.o/s.g
	y := make([]float64, s.n*s.o*oh*ow)
	for n := range s.n {
		for o := range s.o {
			grp := o / og
			for i := range oh {
				for j := range ow {
					acc := 0.0
					if b != nil {
						acc = b[o]
					}
					for c := range cg {
						for ki := range s.kh {
							for kj := range s.kw {
								hi := i*s.sh - s.ph + ki*s.dh
								wj := j*s.sw - s.pw + kj*s.dw
								if hi < 0 || hi >= s.h || wj < 0 || wj >= s.w {
									continue
								}
								xc := grp*cg + c
								acc += x[((n*s.c+xc)*s.h+hi)*s.w+wj] * w[((o*cg+c)*s.kh+ki)*s.kw+kj]
							}
						}
					}
					y[((n*s.o+o)*oh+i)*ow+j] = acc
				}
			}
		}
	}
	return y
}

func ltRefPool(x []float64, n, c, h, w int, o nn.PoolOpts, isMax bool) []float64 {
	st := o.Stride
	if st == [2]int{} {
		st = o.Kernel
	}
	dil := o.Dilation
	if dil == [2]int{} {
		dil = [2]int{1, 1}
	}
	oh := (h+2*o.Padding[0]-dil[0]*(o.Kernel[0]-1)-1)/st[0] + 1
	ow := (w+2*o.Padding[1]-dil[1]*(o.Kernel[1]-1)-1)/st[1] + 1
	y := make([]float64, n*c*oh*ow)
	for nc := range n * c {
		for i := range oh {
			for j := range ow {
				acc := 0.0
				if isMax {
					acc = math.Inf(-1)
				}
				for ki := range o.Kernel[0] {
					for kj := range o.Kernel[1] {
						hi := i*st[0] - o.Padding[0] + ki*dil[0]
						wj := j*st[1] - o.Padding[1] + kj*dil[1]
						if hi < 0 || hi >= h || wj < 0 || wj >= w {
							continue
						}
						v := x[(nc*h+hi)*w+wj]
						if isMax {
							acc = math.Max(acc, v)
						} else {
							acc += v
						}
					}
				}
				if !isMax {
					acc /= float64(o.Kernel[0] * o.Kernel[1])
				}
				y[(nc*oh+i)*ow+j] = acc
			}
		}
	}
	return y
}

func ltRefLayerNorm(x []float64, k int, w, b []float64, eps float64) []float64 {
	y := make([]float64, len(x))
	for r := 0; r < len(x); r += k {
		row := x[r : r+k]
		mean, v := 0.0, 0.0
		for _, e := range row {
			mean += e
		}
		mean /= float64(k)
		for _, e := range row {
			v += (e - mean) * (e - mean)
		}
		v /= float64(k)
		for i, e := range row {
			y[r+i] = (e-mean)/math.Sqrt(v+eps)*w[i] + b[i]
		}
	}
	return y
}

func ltMapf(x []float64, f func(float64) float64) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = f(v)
	}
	return y
}

func ltGelu(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
func ltGeluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}
func ltSilu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// TestLayerForward runs each layer on the worker and compares its output
// with a float64 reference computed here from the parameters read back.
func TestLayerForward(t *testing.T) {
	s := ltNewSession(t)
	s.Seed(11)
	tests := []struct {
		name  string
		op    string // an op the layer needs that a build may lack
		layer func() (nn.Layer, error)
		shape []int
		dt    kernels.DType
		ref   func(x []float64, ps [][]float64) []float64
		tol   float64
	}{{
		name:  "Linear 2-D",
		layer: func() (nn.Layer, error) { return nn.NewLinear(s, 5, 3) },
		shape: []int{4, 5},
		ref:   func(x []float64, p [][]float64) []float64 { return ltRefLinear(x, 4, p[0], p[1], 5, 3) },
	}, {
		name:  "Linear batched, no bias",
		layer: func() (nn.Layer, error) { return nn.NewLinear(s, 4, 2, nn.WithoutBias()) },
		shape: []int{2, 3, 4},
		ref:   func(x []float64, p [][]float64) []float64 { return ltRefLinear(x, 6, p[0], nil, 4, 2) },
	}, {
		name:  "Linear f64",
		layer: func() (nn.Layer, error) { return nn.NewLinear(s, 3, 3, nn.WithDType(kernels.Float64)) },
		shape: []int{2, 3},
		dt:    kernels.Float64,
		ref:   func(x []float64, p [][]float64) []float64 { return ltRefLinear(x, 2, p[0], p[1], 3, 3) },
		tol:   1e-12,
	}, {
		name: "Conv2d stride padding",
		op:   "conv2d",
		layer: func() (nn.Layer, error) {
			return nn.NewConv2d(s, 2, 3, [2]int{3, 3}, nn.Conv2dOpts{Stride: [2]int{2, 1}, Padding: [2]int{1, 1}})
		},
		shape: []int{2, 2, 5, 6},
		ref: func(x []float64, p [][]float64) []float64 {
			return ltRefConv(x, p[0], p[1], ltConvShape{n: 2, c: 2, h: 5, w: 6, o: 3, kh: 3, kw: 3, sh: 2, sw: 1, ph: 1, pw: 1, dh: 1, dw: 1, g: 1})
		},
	}, {
		name: "Conv2d groups dilation, no bias",
		op:   "conv2d",
		layer: func() (nn.Layer, error) {
			return nn.NewConv2d(s, 4, 2, [2]int{2, 2}, nn.Conv2dOpts{Dilation: [2]int{2, 1}, Groups: 2}, nn.WithoutBias())
		},
		shape: []int{1, 4, 5, 4},
		ref: func(x []float64, p [][]float64) []float64 {
			return ltRefConv(x, p[0], nil, ltConvShape{n: 1, c: 4, h: 5, w: 4, o: 2, kh: 2, kw: 2, sh: 1, sw: 1, dh: 2, dw: 1, g: 2})
		},
	}, {
		name:  "MaxPool2d",
		op:    "max_pool2d",
		layer: func() (nn.Layer, error) { return nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}}), nil },
		shape: []int{2, 3, 4, 5},
		ref: func(x []float64, _ [][]float64) []float64 {
			return ltRefPool(x, 2, 3, 4, 5, nn.PoolOpts{Kernel: [2]int{2, 2}}, true)
		},
	}, {
		name: "MaxPool2d stride padding",
		op:   "max_pool2d",
		layer: func() (nn.Layer, error) {
			return nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}}), nil
		},
		shape: []int{1, 2, 5, 5},
		ref: func(x []float64, _ [][]float64) []float64 {
			return ltRefPool(x, 1, 2, 5, 5, nn.PoolOpts{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}}, true)
		},
	}, {
		name: "MaxPool2d dilation",
		op:   "max_pool2d",
		layer: func() (nn.Layer, error) {
			return nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}, Dilation: [2]int{2, 1}}), nil
		},
		shape: []int{1, 1, 5, 4},
		ref: func(x []float64, _ [][]float64) []float64 {
			return ltRefPool(x, 1, 1, 5, 4, nn.PoolOpts{Kernel: [2]int{2, 2}, Dilation: [2]int{2, 1}}, true)
		},
	}, {
		name: "AvgPool2d padding counted",
		op:   "avg_pool2d",
		layer: func() (nn.Layer, error) {
			return nn.NewAvgPool2d(nn.PoolOpts{Kernel: [2]int{2, 3}, Stride: [2]int{1, 2}, Padding: [2]int{1, 1}}), nil
		},
		shape: []int{2, 1, 4, 5},
		ref: func(x []float64, _ [][]float64) []float64 {
			return ltRefPool(x, 2, 1, 4, 5, nn.PoolOpts{Kernel: [2]int{2, 3}, Stride: [2]int{1, 2}, Padding: [2]int{1, 1}}, false)
		},
	}, {
		name:  "LayerNorm",
		layer: func() (nn.Layer, error) { return nn.NewLayerNorm(s, []int{6}, 0) },
		shape: []int{2, 3, 6},
		ref: func(x []float64, p [][]float64) []float64 {
			return ltRefLayerNorm(x, 6, p[0], p[1], 1e-5)
		},
	}, {
		name:  "LayerNorm two axes",
		layer: func() (nn.Layer, error) { return nn.NewLayerNorm(s, []int{2, 3}, 1e-3) },
		shape: []int{4, 2, 3},
		ref: func(x []float64, p [][]float64) []float64 {
			return ltRefLayerNorm(x, 6, p[0], p[1], 1e-3)
		},
	}, {
		name:  "ReLU",
		layer: func() (nn.Layer, error) { return nn.ReLU{}, nil },
		shape: []int{3, 4},
		ref: func(x []float64, _ [][]float64) []float64 {
			return ltMapf(x, func(v float64) float64 { return math.Max(v, 0) })
		},
	}, {
		name:  "GELU",
		layer: func() (nn.Layer, error) { return nn.GELU{}, nil },
		shape: []int{3, 4},
		ref:   func(x []float64, _ [][]float64) []float64 { return ltMapf(x, ltGelu) },
	}, {
		name:  "GELU tanh",
		layer: func() (nn.Layer, error) { return nn.GELU{Approximate: "tanh"}, nil },
		shape: []int{7},
		ref:   func(x []float64, _ [][]float64) []float64 { return ltMapf(x, ltGeluTanh) },
	}, {
		name:  "SiLU",
		layer: func() (nn.Layer, error) { return nn.SiLU{}, nil },
		shape: []int{2, 2, 2},
		ref:   func(x []float64, _ [][]float64) []float64 { return ltMapf(x, ltSilu) },
	}, {
		name:  "Flatten",
		layer: func() (nn.Layer, error) { return nn.NewFlatten(), nil },
		shape: []int{2, 3, 2, 2},
		ref:   func(x []float64, _ [][]float64) []float64 { return x },
	}, {
		name:  "Dropout in evaluation",
		layer: func() (nn.Layer, error) { d := nn.NewDropout(0.5); d.Train(false); return d, nil },
		shape: []int{10},
		ref:   func(x []float64, _ [][]float64) []float64 { return x },
	}, {
		name: "Sequential",
		layer: func() (nn.Layer, error) {
			a, err := nn.NewLinear(s, 3, 4)
			if err != nil {
				return nil, err
			}
			b, err := nn.NewLinear(s, 4, 2)
			return nn.NewSequential(a, nn.ReLU{}, b), err
		},
		shape: []int{5, 3},
		ref: func(x []float64, p [][]float64) []float64 {
			h := ltMapf(ltRefLinear(x, 5, p[0], p[1], 3, 4), func(v float64) float64 { return math.Max(v, 0) })
			return ltRefLinear(h, 5, p[2], p[3], 4, 2)
		},
	}}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.op != "" {
				ltNeedOp(t, s, tt.op)
			}
			dt := ltCmpOr(tt.dt, kernels.Float32)
			tol := ltCmpOr(tt.tol, 1e-5)
			l, err := tt.layer()
			if err != nil {
				t.Fatal(err)
			}
			xv := ltRandoms(uint64(i), kernels.Numel(tt.shape))
			x := ltFromValues(t, s, dt, tt.shape, xv)
			y, err := l.Forward(x)
			if err != nil {
				t.Fatal(err)
			}
			var ps [][]float64
			for _, p := range l.Params() {
				ps = append(ps, ltValues(t, p.T))
			}
			ltCloseTo(t, tt.name, ltValues(t, y), tt.ref(xv, ps), tol)
		})
	}
}

func ltCmpOr[T comparable](a, b T) T {
	var zero T
	if a != zero {
		return a
	}
	return b
}

func TestEmbeddingForward(t *testing.T) {
	s := ltNewSession(t)
	e, err := nn.NewEmbedding(s, 5, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []kernels.DType{kernels.Int64, kernels.Int32} {
		idx := ltFromValues(t, s, dt, []int{2, 2}, []float64{4, 0, 2, 4})
		y, err := e.Forward(idx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(y.Shape(), []int{2, 2, 3}) {
			t.Fatalf("Embedding of [2 2] has shape %v, want [2 2 3]", y.Shape())
		}
		w := ltValues(t, e.Weight.T)
		var want []float64
		for _, i := range []int{4, 0, 2, 4} {
			want = append(want, w[3*i:3*i+3]...)
		}
		ltCloseTo(t, "Embedding "+dt.String(), ltValues(t, y), want, 0)
	}
}

func TestDropoutTraining(t *testing.T) {
	s := ltNewSession(t)
	d := nn.NewDropout(0.25)
	x := ltFromValues(t, s, kernels.Float32, []int{400}, slices.Repeat([]float64{3}, 400))
	y, err := d.Forward(x)
	if err != nil {
		t.Fatal(err)
	}
	zeros := 0
	for i, v := range ltValues(t, y) {
		switch v {
		case 0:
			zeros++
		case 4:
		default:
			t.Fatalf("dropout output[%d] = %v, want 0 or 3/(1-0.25) = 4", i, v)
		}
	}
	if zeros < 60 || zeros > 140 {
		t.Errorf("%d of 400 dropped, want about 100", zeros)
	}
}

// TestInitSeeded checks PyTorch's default bounds and that the session seed
// fixes the weights: two sessions seeded alike build equal models, the
// weights are the worker's counter-based uniform draw, and another seed
// gives other weights.
func TestInitSeeded(t *testing.T) {
	c, _ := ltLayerFabric(t)
	build := func(seed uint64) (*nn.Linear, []float64, []float64) {
		s := ltOpenSession(t, c)
		s.Seed(seed)
		l, err := nn.NewLinear(s, 16, 4)
		if err != nil {
			t.Fatal(err)
		}
		return l, ltValues(t, l.Weight.T), ltValues(t, l.Bias.T)
	}
	l, w1, b1 := build(5)
	_, w2, b2 := build(5)
	_, w3, _ := build(6)
	if !slices.Equal(w1, w2) || !slices.Equal(b1, b2) {
		t.Fatalf("the same seed gave different weights")
	}
	if slices.Equal(w1, w3) {
		t.Fatalf("seeds 5 and 6 gave the same weights")
	}
	for i, v := range w1 {
		want := float64(float32(kernels.UniformAt(5, l.Weight.T.Client().ID(), uint64(i), -0.25, 0.25)))
		if v != want {
			t.Fatalf("weight[%d] = %v, want the uniform draw %v", i, v, want)
		}
	}
	for _, v := range append(w1, b1...) {
		if !(v >= -0.25 && v < 0.25) {
			t.Fatalf("value %v outside [-1/sqrt(16), 1/sqrt(16))", v)
		}
	}
	if got := []string{l.Weight.Name, l.Bias.Name}; !slices.Equal(got, []string{"weight", "bias"}) {
		t.Errorf("names %q", got)
	}
}

func TestSequentialNames(t *testing.T) {
	s := ltNewSession(t)
	must := func(l nn.Layer, err error) nn.Layer {
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	inner := nn.NewSequential(must(nn.NewLinear(s, 2, 2)), nn.ReLU{}, must(nn.NewLayerNorm(s, []int{2}, 0)))
	model := nn.NewSequential(
		must(nn.NewLinear(s, 2, 2, nn.WithoutBias())),
		nn.NewDropout(0.1),
		inner,
		must(nn.NewEmbedding(s, 3, 2)),
	)
	var names []string
	for _, p := range model.Params() {
		names = append(names, p.Name)
	}
	want := []string{"0.weight", "2.0.weight", "2.0.bias", "2.2.weight", "2.2.bias", "3.weight"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}
}

// TestLayerShapeErrors feeds each layer a wrong input: the error names the
// layer and both shapes, and the layer enqueues nothing.
func TestLayerShapeErrors(t *testing.T) {
	s := ltNewSession(t)
	lin, err := nn.NewLinear(s, 784, 512)
	if err != nil {
		t.Fatal(err)
	}
	conv, err := nn.NewConv2d(s, 3, 8, [2]int{3, 3}, nn.Conv2dOpts{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := nn.NewLayerNorm(s, []int{4, 5}, 0)
	if err != nil {
		t.Fatal(err)
	}
	emb, err := nn.NewEmbedding(s, 10, 3)
	if err != nil {
		t.Fatal(err)
	}
	f32 := func(shape ...int) *nn.Tensor { return nn.Zeros(s, kernels.Float32, shape) }
	tests := []struct {
		layer nn.Layer
		x     *nn.Tensor
		want  string // the whole message, or a regexp when re is set
		re    bool
		is    error
	}{
		{lin, f32(128, 100), `nn: Linear(784->512) fed shape [128 100]: want [..., 784]`, false, kernels.ErrShape},
		{lin, f32(), `nn: Linear(784->512) fed shape []: want [..., 784]`, false, kernels.ErrShape},
		{lin, nn.Zeros(s, kernels.Float64, []int{2, 784}), `nn: Linear(784->512) fed f64[2 784]: want f32[..., 784]`, false, kernels.ErrDType},
		{conv, f32(2, 4, 8, 8), `nn: Conv2d(3, 8, kernel_size=[3 3]) fed shape [2 4 8 8]: want [N, 3, H, W]`, false, kernels.ErrShape},
		{conv, f32(3, 8, 8), `nn: Conv2d(3, 8, kernel_size=[3 3]) fed shape [3 8 8]: want [N, 3, H, W]`, false, kernels.ErrShape},
		{nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}}), f32(4, 4), `nn: MaxPool2d(kernel_size=[2 2]) fed shape [4 4]: want [N, C, H, W]`, false, kernels.ErrShape},
		{nn.NewAvgPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}}), f32(1, 1, 4), `nn: AvgPool2d(kernel_size=[2 2]) fed shape [1 1 4]: want [N, C, H, W]`, false, kernels.ErrShape},
		{ln, f32(3, 5, 4), `nn: LayerNorm(4, 5) fed shape [3 5 4]: want [..., 4 5]`, false, kernels.ErrShape},
		{emb, f32(3), `nn: Embedding(10, 3) fed f32[3]: want i32 or i64 indices`, false, kernels.ErrDType},
		{nn.ReLU{}, nn.Zeros(s, kernels.Int32, []int{2}), `nn: ReLU() fed i32[2]: want a float tensor`, false, kernels.ErrDType},
		{nn.NewFlatten(), f32(3), `nn: Flatten(start_dim=1, end_dim=-1) fed shape [3]: want at least 2 axes`, false, kernels.ErrShape},
		{nn.NewSequential(nn.ReLU{}, lin), f32(1, 783), `nn: Linear(784->512) fed shape [1 783]: want [..., 784]`, false, kernels.ErrShape},
		{nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{5, 5}}), f32(1, 1, 4, 4), `^nn: MaxPool2d\(kernel_size=\[5 5\]\): .*`, true, kernels.ErrShape},
		{conv, f32(1, 3, 2, 2), `^nn: Conv2d\(3, 8, kernel_size=\[3 3\]\): .*`, true, kernels.ErrShape},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.layer), func(t *testing.T) {
			_, err := tt.layer.Forward(tt.x)
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if tt.re && !regexp.MustCompile(tt.want).MatchString(err.Error()) || !tt.re && err.Error() != tt.want {
				t.Errorf("error\n %q\nwant\n %q", err, tt.want)
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("error %v does not wrap %v", err, tt.is)
			}
		})
	}
	// The session is still sound: nothing bad was enqueued.
	if err := s.Sync(context.Background()); err != nil {
		t.Fatalf("Sync after the refused inputs: %v", err)
	}
}

func TestLayerBadConstruction(t *testing.T) {
	s := ltNewSession(t)
	for i, f := range []func() error{
		func() error { _, err := nn.NewLinear(s, 0, 3); return err },
		func() error { _, err := nn.NewLinear(s, 3, 3, nn.WithDType(kernels.Int32)); return err },
		func() error { _, err := nn.NewConv2d(s, 3, 4, [2]int{3, 3}, nn.Conv2dOpts{Groups: 2}); return err },
		func() error { _, err := nn.NewConv2d(s, 2, 4, [2]int{0, 3}, nn.Conv2dOpts{}); return err },
		func() error { _, err := nn.NewLayerNorm(s, nil, 0); return err },
		func() error { _, err := nn.NewEmbedding(s, 3, -1); return err },
		func() error { _, err := nn.NewDropout(1).Forward(nn.Zeros(s, kernels.Float32, []int{1})); return err },
		func() error {
			_, err := nn.GELU{Approximate: "erf"}.Forward(nn.Zeros(s, kernels.Float32, []int{1}))
			return err
		},
	} {
		if err := f(); !errors.Is(err, nn.ErrInvalidArgument) {
			t.Errorf("case %d: %v, want ErrInvalidArgument", i, err)
		}
	}
}

// TestLayerBackward checks that Backward reaches every parameter of every
// layer (each op a layer uses has a gradient rule), and for Linear that the
// gradients are the analytic ones of loss = sum(y²).
func TestLayerBackward(t *testing.T) {
	s := ltNewSession(t)
	s.Seed(4)
	must := func(l nn.Layer, err error) nn.Layer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	f32 := func(shape ...int) *nn.Tensor {
		return ltFromValues(t, s, kernels.Float32, shape, ltRandoms(uint64(len(shape)), kernels.Numel(shape)))
	}
	tests := []struct {
		name  string
		needs string
		layer nn.Layer
		x     *nn.Tensor
	}{
		{"Linear", "", must(nn.NewLinear(s, 3, 2)), f32(4, 3)},
		{"LayerNorm", "", must(nn.NewLayerNorm(s, []int{3}, 0)), f32(2, 3)},
		{"Embedding", "", must(nn.NewEmbedding(s, 4, 3)), ltFromValues(t, s, kernels.Int64, []int{2, 2}, []float64{1, 3, 3, 0})},
		{"Conv2d", "conv2d", must(nn.NewConv2d(s, 2, 2, [2]int{2, 2}, nn.Conv2dOpts{})), f32(1, 2, 3, 3)},
		{"Sequential with dropout", "", nn.NewSequential(must(nn.NewLinear(s, 3, 4)), nn.NewDropout(0.5), nn.GELU{}, nn.NewFlatten(), must(nn.NewLinear(s, 4, 1))), f32(5, 3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needs != "" {
				ltNeedOp(t, s, tt.needs)
			}
			y, err := tt.layer.Forward(tt.x)
			if err != nil {
				t.Fatal(err)
			}
			y.Retain()
			loss := nn.Sum(nn.Mul(y, y), nil, false)
			if err := nn.Backward(loss); err != nil {
				t.Fatal(err)
			}
			for _, p := range tt.layer.Params() {
				g := p.T.Grad()
				if g == nil || !slices.Equal(g.Shape(), p.T.Shape()) {
					t.Fatalf("%s: gradient %v for %v", p.Name, g, p.T)
				}
				for _, v := range ltValues(t, g) {
					if math.IsNaN(v) || math.IsInf(v, 0) {
						t.Fatalf("%s: gradient holds %v", p.Name, v)
					}
				}
			}
			if l, ok := tt.layer.(*nn.Linear); ok {
				x, yv := ltValues(t, tt.x), ltValues(t, y)
				gw := make([]float64, l.Out*l.In)
				gb := make([]float64, l.Out)
				for r := range len(yv) / l.Out {
					for o := range l.Out {
						gb[o] += 2 * yv[r*l.Out+o]
						for i := range l.In {
							gw[o*l.In+i] += 2 * yv[r*l.Out+o] * x[r*l.In+i]
						}
					}
				}
				ltCloseTo(t, "dW", ltValues(t, l.Weight.T.Grad()), gw, 1e-5)
				ltCloseTo(t, "db", ltValues(t, l.Bias.T.Grad()), gb, 1e-5)
			}
		})
	}
}
