package nn_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
)

func upload(t testing.TB, s *client.Session, dt kernels.DType, shape []int, v ...float64) *nn.Tensor {
	t.Helper()
	if v == nil {
		v = make([]float64, kernels.Numel(shape))
		for i := range v {
			v[i] = float64(i%7) - 3
		}
	}
	x, err := nn.FromValues(context.Background(), s, dt, shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func readValues(t testing.TB, x *nn.Tensor) []float64 {
	t.Helper()
	v, err := x.Float64s(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestBadInputs(t *testing.T) {
	c, s, _ := fabric(t)
	s2, err := c.Open(context.Background(), "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close(context.Background()) })
	f64 := kernels.Float64
	for _, c := range []struct {
		name string
		run  func() error
		want error
		says []string
	}{
		{"add shapes", func() error {
			return nn.Add(upload(t, s, f64, []int{2, 3}), upload(t, s, f64, []int{4})).Err()
		}, kernels.ErrShape, []string{"add", "[2 3]", "[4]"}},
		{"matmul shapes", func() error {
			return nn.Matmul(upload(t, s, f64, []int{2, 3}), upload(t, s, f64, []int{4, 5})).Err()
		}, kernels.ErrShape, []string{"matmul", "[2 3]", "[4 5]"}},
		{"dtypes", func() error {
			return nn.Mul(upload(t, s, f64, []int{2}), upload(t, s, kernels.Float32, []int{2})).Err()
		}, kernels.ErrDType, []string{"f64", "f32"}},
		{"a failure carries on", func() error {
			bad := nn.Sub(upload(t, s, f64, []int{3}), upload(t, s, f64, []int{2}))
			return nn.Exp(nn.Sum(bad, nil, false)).Err()
		}, kernels.ErrShape, []string{"sub", "[3]", "[2]"}},
		{"Backward of a failed loss", func() error {
			x := upload(t, s, f64, []int{3}).RequireGrad()
			return nn.Backward(nn.Sum(nn.Add(x, upload(t, s, f64, []int{2})), nil, false))
		}, kernels.ErrShape, []string{"[3]", "[2]"}},
		{"Backward of a non-scalar", func() error {
			x := upload(t, s, f64, []int{2, 2}).RequireGrad()
			return nn.Backward(nn.Exp(x))
		}, nn.ErrNotScalar, []string{"[2 2]"}},
		{"Backward without RequireGrad", func() error {
			return nn.Backward(nn.Sum(upload(t, s, f64, []int{2}), nil, false))
		}, nn.ErrNoGrad, []string{"RequireGrad"}},
		{"Backward twice", func() error {
			x := upload(t, s, f64, []int{2}).RequireGrad()
			loss := nn.Sum(nn.Exp(x), nil, false)
			if err := nn.Backward(loss); err != nil {
				return err
			}
			return nn.Backward(loss)
		}, nn.ErrNoGrad, nil},
		{"two sessions", func() error {
			return nn.Add(upload(t, s, f64, []int{2}), upload(t, s2, f64, []int{2})).Err()
		}, nn.ErrSession, []string{"add", "another session"}},
		{"Backward across sessions", func() error {
			x := upload(t, s, f64, []int{2}).RequireGrad()
			return nn.Backward(nn.Sum(nn.Mul(x, upload(t, s2, f64, []int{2})), nil, false))
		}, nn.ErrSession, []string{"mul"}},
		{"freed input", func() error {
			x := upload(t, s, f64, []int{2})
			x.Free()
			return nn.Neg(x).Err()
		}, nn.ErrFreed, []string{"neg"}},
		{"freed intermediate", func() error {
			x := upload(t, s, f64, []int{2}).RequireGrad()
			h := nn.Exp(x)
			if err := nn.Backward(nn.Sum(h, nil, false)); err != nil {
				return err
			}
			return nn.Neg(h).Err()
		}, nn.ErrFreed, nil},
		{"RequireGrad of integers", func() error {
			return upload(t, s, kernels.Int64, []int{2}).RequireGrad().Err()
		}, nn.ErrInvalidArgument, []string{"i64"}},
		{"no rule", func() error {
			x := upload(t, s, f64, []int{1, 1, 2, 2}).RequireGrad()
			return nn.Backward(nn.Sum(nn.AvgPool2dGrad(x, []int{1, 1, 4, 4}, nn.PoolOpts{Kernel: [2]int{2, 2}}), nil, false))
		}, nn.ErrNoRule, []string{"avg_pool2d_grad"}},
		{"nil input", func() error { return nn.Add(upload(t, s, f64, []int{2}), nil).Err() }, nn.ErrInvalidArgument, []string{"add"}},
		{"Backward of nil", func() error { return nn.Backward(nil) }, nn.ErrInvalidArgument, nil},
		{"reshape", func() error { return nn.Reshape(upload(t, s, f64, []int{2, 3}), 4).Err() }, kernels.ErrShape, []string{"reshape", "[2 3]"}},
		{"flatten axis", func() error { return nn.Flatten(upload(t, s, f64, []int{2, 3}), 2).Err() }, kernels.ErrAttr, []string{"flatten", "[2 3]"}},
		{"transpose axis", func() error { return nn.Transpose(upload(t, s, f64, []int{2, 3}), 0, -3).Err() }, kernels.ErrAttr, []string{"transpose", "[2 3]"}},
		{"dropout p", func() error { return nn.Dropout(upload(t, s, f64, []int{2}), 1).Err() }, nn.ErrInvalidArgument, []string{"dropout"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			for _, w := range c.says {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	// The session still works, and nothing reached the worker that failed.
	if err := s.Sync(context.Background()); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// TestTies pins the gradients where central differences cannot: max,
// min, maximum and minimum share a gradient between equal elements
// evenly; relu and abs give 0 at 0; prod's gradient at zeros is the
// product of the others.
func TestTies(t *testing.T) {
	_, s, _ := fabric(t)
	f64 := kernels.Float64
	for _, c := range []struct {
		name string
		f    func(x, y *nn.Tensor) *nn.Tensor
		x, y []float64
		gx   []float64
		gy   []float64
	}{
		{"max", func(x, _ *nn.Tensor) *nn.Tensor { return nn.Max(x, nil, false) }, []float64{1, 3, 3, 2}, nil, []float64{0, 0.5, 0.5, 0}, nil},
		{"min rows", func(x, _ *nn.Tensor) *nn.Tensor {
			return nn.Sum(nn.Min(nn.Reshape(x, 2, 2), []int{1}, false), nil, false)
		},
			[]float64{1, 1, 2, 0}, nil, []float64{0.5, 0.5, 0, 1}, nil},
		{"maximum", func(x, y *nn.Tensor) *nn.Tensor { return nn.Sum(nn.Maximum(x, y), nil, false) },
			[]float64{1, 2, 3}, []float64{1, 1, 4}, []float64{0.5, 1, 0}, []float64{0.5, 0, 1}},
		{"minimum", func(x, y *nn.Tensor) *nn.Tensor { return nn.Sum(nn.Minimum(x, y), nil, false) },
			[]float64{1, 2, 3}, []float64{1, 1, 4}, []float64{0.5, 0, 1}, []float64{0.5, 1, 0}},
		{"prod with a zero", func(x, _ *nn.Tensor) *nn.Tensor {
			return nn.Sum(nn.Prod(nn.Reshape(x, 3, 3), []int{1}, false), nil, false)
		},
			[]float64{2, 0, 3, 0, 0, 5, 1, 2, 3}, nil, []float64{0, 6, 0, 0, 0, 0, 6, 3, 2}, nil},
		{"relu at 0", func(x, _ *nn.Tensor) *nn.Tensor { return nn.Sum(nn.Relu(x), nil, false) }, []float64{-1, 0, 2}, nil, []float64{0, 0, 1}, nil},
		{"abs at 0", func(x, _ *nn.Tensor) *nn.Tensor { return nn.Sum(nn.Abs(x), nil, false) }, []float64{-1, 0, 2}, nil, []float64{-1, 0, 1}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := upload(t, s, f64, []int{len(c.x)}, c.x...).RequireGrad()
			var y *nn.Tensor
			if c.y != nil {
				y = upload(t, s, f64, []int{len(c.y)}, c.y...).RequireGrad()
			}
			if err := nn.Backward(c.f(x, y)); err != nil {
				t.Fatal(err)
			}
			if got := readValues(t, x.Grad()); !slices.Equal(got, c.gx) {
				t.Errorf("dx = %v, want %v", got, c.gx)
			}
			if y != nil {
				if got := readValues(t, y.Grad()); !slices.Equal(got, c.gy) {
					t.Errorf("dy = %v, want %v", got, c.gy)
				}
			}
		})
	}
}

// TestZeroGradOps: ops whose gradient is zero almost everywhere give
// tensors that require no gradient; the gradient through the other
// branch is unaffected.
func TestZeroGradOps(t *testing.T) {
	_, s, _ := fabric(t)
	x := upload(t, s, kernels.Float64, []int{3}, 0.5, 1.5, -2.5).RequireGrad()
	for _, f := range []func(*nn.Tensor) *nn.Tensor{nn.Floor, nn.Ceil, nn.Round, nn.Sign} {
		if f(x).RequiresGrad() {
			t.Errorf("%v requires a gradient", f(x))
		}
	}
	if nn.Gt(x, x).RequiresGrad() || nn.Argmax(x, nil, false).RequiresGrad() {
		t.Error("a comparison or argmax requires a gradient")
	}
	loss := nn.Sum(nn.Mul(nn.Floor(x), x), nil, false)
	if err := nn.Backward(loss); err != nil {
		t.Fatal(err)
	}
	if got, want := readValues(t, x.Grad()), []float64{0, 1, -3}; !slices.Equal(got, want) {
		t.Errorf("dx = %v, want %v", got, want)
	}
}

// tensorBytes reads the worker's tensor memory gauge for cpu-0.
func heldBytes(t testing.TB, w *worker.Worker) int64 {
	t.Helper()
	var b bytes.Buffer
	if err := w.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&b)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, `jetfabric_device_tensor_bytes{device="cpu-0"} `); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(v)
		}
	}
	t.Fatal("no jetfabric_device_tensor_bytes for cpu-0")
	return 0
}

// TestBackwardFreesIntermediates trains a small network for 50 steps of
// SGD and checks that the worker's tensor memory is the same after every
// step: Backward frees the graph's intermediates and the optimizer's own.
func TestBackwardFreesIntermediates(t *testing.T) {
	_, s, w := fabric(t)
	ctx := context.Background()
	f32 := kernels.Float32
	r := rand.New(rand.NewPCG(3, 4))
	randn := func(n int, scale float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64() * scale
		}
		return v
	}
	w1 := upload(t, s, f32, []int{4, 16}, randn(64, 0.5)...).RequireGrad()
	b1 := nn.Zeros(s, f32, []int{16}).RequireGrad()
	w2 := upload(t, s, f32, []int{16, 3}, randn(48, 0.25)...).RequireGrad()
	b2 := nn.Zeros(s, f32, []int{3}).RequireGrad()
	params := []*nn.Tensor{w1, b1, w2, b2}
	x := upload(t, s, f32, []int{8, 4}, randn(32, 1)...)
	labels := make([]float64, 8)
	for i := range labels {
		labels[i] = float64(i % 3)
	}
	y := upload(t, s, kernels.Int64, []int{8}, labels...)

	var first, last float64
	for step := range 50 {
		h := nn.Relu(nn.Add(nn.Matmul(x, params[0]), params[1]))
		logits := nn.Add(nn.Matmul(h, params[2]), params[3])
		// log-softmax and a gather instead of cross_entropy, which not
		// every backend runs yet; a dropout draws a mask each step.
		lp := nn.LogSoftmax(nn.Dropout(logits, 0.1), -1)
		loss := nn.Neg(nn.Mean(nn.Gather(lp, 1, nn.Reshape(y, 8, 1)), nil, false))
		if err := nn.Backward(loss); err != nil {
			t.Fatal(err)
		}
		for i, p := range params {
			next := nn.Sub(p, nn.ScalarMul(p.Grad(), 0.5)).RequireGrad()
			p.Grad().Free()
			p.Free()
			params[i] = next
		}
		v, err := loss.Item(ctx)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		loss.Free()
		if err := s.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			first = v
		}
		last = v
		// Leaves: the 4 parameters, x and y.
		expectBytes(t, w, (64+16+48+3)*4+32*4+8*8, fmt.Sprintf("after step %d", step))
	}
	if !(last < first/2) {
		t.Errorf("loss went from %v to %v", first, last)
	}
	t.Logf("loss %.4f -> %.4f", first, last)
}

// TestBackwardErrorFreesItsOwn: a Backward that fails (here on an op
// without a rule) frees the gradient ops it had enqueued and leaves the
// graph as it was.
func TestBackwardErrorFreesItsOwn(t *testing.T) {
	_, s, w := fabric(t)
	ctx := context.Background()
	x := upload(t, s, kernels.Float64, []int{1, 1, 2, 2}).RequireGrad()
	dx := nn.AvgPool2dGrad(x, []int{1, 1, 4, 4}, nn.PoolOpts{Kernel: [2]int{2, 2}})
	loss := nn.Sum(nn.Exp(nn.Reshape(dx, 4, 4)), nil, false)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// x, avg_pool2d_grad, reshape, exp, sum: 32 + 3·128 + 8 bytes.
	expectBytes(t, w, 424, "before Backward")
	if err := nn.Backward(loss); !errors.Is(err, nn.ErrNoRule) {
		t.Fatalf("Backward: %v, want ErrNoRule", err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	expectBytes(t, w, 424, "after the failed Backward")
	if x.Grad() != nil {
		t.Error("a failed Backward set a gradient")
	}
	if v := readValues(t, loss); len(v) != 1 {
		t.Fatalf("loss = %v", v)
	}
	nn.Release(loss)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	expectBytes(t, w, 32, "after Release")
}

// TestRelease drops an evaluation graph: the memory goes back to what the
// leaves hold.
func TestRelease(t *testing.T) {
	_, s, w := fabric(t)
	x := upload(t, s, kernels.Float64, []int{16, 16})
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	base := heldBytes(t, w)
	out := nn.Softmax(nn.Matmul(nn.Tanh(x), nn.Transpose(x, 0, 1)), -1)
	keep := nn.Sum(out, nil, false).Retain()
	if v := readValues(t, keep); math.Abs(v[0]-16) > 1e-9 {
		t.Fatalf("sum of softmax rows = %v", v)
	}
	nn.Release(keep)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	expectBytes(t, w, base, "after Release")
}

// TestGraphUsedTwice: a second Backward through a graph that an earlier
// one freed fails, naming the cause, rather than missing the gradient
// through it; with the losses added, one Backward gives both gradients.
func TestGraphUsedTwice(t *testing.T) {
	_, s, _ := fabric(t)
	x := upload(t, s, kernels.Float64, []int{3}, 1, 2, 3).RequireGrad()
	h := nn.Exp(x).Retain()
	l1 := nn.Sum(h, nil, false)
	l2 := nn.Sum(nn.Mul(h, x), nil, false)
	if err := nn.Backward(l1); err != nil {
		t.Fatal(err)
	}
	err := nn.Backward(l2)
	if !errors.Is(err, nn.ErrFreed) || !strings.Contains(err.Error(), "earlier Backward") {
		t.Fatalf("second Backward: %v, want ErrFreed naming the earlier Backward", err)
	}
	if v := readValues(t, h); len(v) != 3 || math.Abs(v[0]-math.E) > 1e-12 {
		t.Fatalf("the retained h = %v", v)
	}
	// Detached, h is a constant.
	l3 := nn.Sum(nn.Mul(h.Detach(), x), nil, false)
	if err := nn.Backward(l3); err != nil {
		t.Fatalf("Backward through a detached h: %v", err)
	}
	if g := readValues(t, x.Grad()); math.Abs(g[0]-math.E) > 1e-12 {
		t.Fatalf("dx with h constant = %v, want h", g)
	}

	h = nn.Exp(x)
	loss := nn.Add(nn.Sum(h, nil, false), nn.Sum(nn.Mul(h, x), nil, false))
	if err := nn.Backward(loss); err != nil {
		t.Fatal(err)
	}
	g := readValues(t, x.Grad())
	for i, xi := range []float64{1, 2, 3} {
		// d/dx (e^x + x e^x) = e^x (2 + x)
		if want := math.Exp(xi) * (2 + xi); math.Abs(g[i]-want) > 1e-9*want {
			t.Errorf("dx[%d] = %v, want %v", i, g[i], want)
		}
	}
}

// TestGradReplaced: a second Backward frees the gradient it replaces.
func TestGradReplaced(t *testing.T) {
	_, s, w := fabric(t)
	ctx := context.Background()
	x := upload(t, s, kernels.Float64, []int{4}).RequireGrad()
	for i := range 5 {
		loss := nn.Sum(nn.Tanh(x), nil, false)
		if err := nn.Backward(loss); err != nil {
			t.Fatal(err)
		}
		loss.Free()
		if err := s.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		expectBytes(t, w, 64, fmt.Sprintf("after Backward %d", i+1)) // x and its gradient
	}
}

// TestConcurrentSessions: graphs of different sessions are built and
// differentiated from different goroutines at once (run with -race).
func TestConcurrentSessions(t *testing.T) {
	c, _, _ := fabric(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(ctx) })
		x := upload(t, s, kernels.Float64, []int{3}, 1, 2, float64(i)).RequireGrad()
		wg.Go(func() {
			for range 10 {
				loss := nn.Sum(nn.Mul(nn.Sigmoid(x), x), nil, false)
				if errs[i] = nn.Backward(loss); errs[i] != nil {
					return
				}
				loss.Free()
			}
			_, errs[i] = x.Grad().Float64s(ctx)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("session %d: %v", i, err)
		}
	}
}
