package nn_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
)

// stepModel is a small MLP with dropout, built the same way on any session.
func stepModel(t testing.TB, s *client.Session) *nn.Sequential {
	t.Helper()
	s.Seed(3)
	l1, err := nn.NewLinear(s, 8, 16)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := nn.NewLinear(s, 16, 4)
	if err != nil {
		t.Fatal(err)
	}
	return nn.NewSequential(l1, nn.ReLU{}, nn.NewDropout(0.25), l2)
}

// stepBatch is batch k: 6 rows of 8 features and their classes.
func stepBatch(t testing.TB, s *client.Session, k int) (*nn.Tensor, *nn.Tensor) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(k), 1))
	x := make([]float64, 6*8)
	for i := range x {
		x[i] = r.NormFloat64()
	}
	y := make([]float64, 6)
	for i := range y {
		y[i] = float64(r.IntN(4))
	}
	ctx := context.Background()
	xt, err := nn.FromValues(ctx, s, kernels.Float32, []int{6, 8}, x)
	if err != nil {
		t.Fatal(err)
	}
	yt, err := nn.FromValues(ctx, s, kernels.Int64, []int{6}, y)
	if err != nil {
		t.Fatal(err)
	}
	return xt, yt
}

// TestStepReplaysTheStep: training with a captured step gives the bits of
// the same training run op by op, for each optimizer, dropout included
// (its masks are keyed by ids the replay mints as the ops would).
func TestStepReplaysTheStep(t *testing.T) {
	c, w := ltLayerFabric(t)
	ctx := context.Background()
	opts := map[string]func() nn.Optimizer{
		"sgd":          func() nn.Optimizer { return &nn.SGD{LR: 0.1} },
		"sgd momentum": func() nn.Optimizer { return &nn.SGD{LR: 0.05, Momentum: 0.9, Nesterov: true} },
		"adam":         func() nn.Optimizer { return nn.NewAdam(0.01) },
		"adamw":        func() nn.Optimizer { return nn.NewAdamW(0.01) },
	}
	const steps = 5
	for name, newOpt := range opts {
		t.Run(name, func(t *testing.T) {
			run := func(captured bool) ([]float64, [][]float32) {
				s := ltOpenSession(t, c)
				model := stepModel(t, s)
				opt := newOpt()
				lossOf := func(b []*nn.Tensor) (*nn.Tensor, error) {
					logits, err := model.Forward(b[0])
					if err != nil {
						return nil, err
					}
					return nn.CrossEntropy(logits, b[1], nn.ReduceMean), nil
				}
				st, err := nn.NewStep(c, model.Params(), opt, lossOf,
					kernels.Meta{DType: kernels.Float32, Shape: []int{6, 8}}, kernels.Meta{DType: kernels.Int64, Shape: []int{6}})
				if err != nil {
					t.Fatal(err)
				}
				var losses []float64
				for k := range steps {
					x, y := stepBatch(t, s, k)
					var loss *nn.Tensor
					if captured {
						loss, err = st.Run(ctx, x, y)
					} else {
						loss, err = lossOf([]*nn.Tensor{x, y})
						if err == nil {
							err = nn.Backward(loss)
						}
						if err == nil {
							err = opt.Step(model.Params())
						}
						nn.ZeroGrad(model.Params())
					}
					if err != nil {
						t.Fatal(err)
					}
					if k == 1 {
						// SGD captures at once; the others after their first step.
						if want := captured; st.Captured() != want {
							t.Fatalf("captured %v after two steps", st.Captured())
						}
					}
					v, err := loss.Item(ctx)
					if err != nil {
						t.Fatal(err)
					}
					losses = append(losses, v)
					loss.Free()
					x.Free()
					y.Free()
				}
				var params [][]float32
				for _, p := range model.Params() {
					v, err := p.T.Float32s(ctx)
					if err != nil {
						t.Fatal(err)
					}
					params = append(params, v)
				}
				return losses, params
			}
			wantLoss, wantParams := run(false)
			gotLoss, gotParams := run(true)
			for k := range wantLoss {
				if math.Float64bits(gotLoss[k]) != math.Float64bits(wantLoss[k]) {
					t.Errorf("step %d: loss %v captured, %v op by op", k, gotLoss[k], wantLoss[k])
				}
			}
			for i := range wantParams {
				if !slices.Equal(gotParams[i], wantParams[i]) {
					t.Errorf("parameter %d differs after %d steps", i, steps)
				}
			}
			if !(wantLoss[steps-1] < wantLoss[0]) {
				t.Logf("losses %v", wantLoss)
			}
		})
	}
	_ = w
}

// BenchmarkStep: one step of a 784-128-10 MLP (Linear, ReLU, Linear, SGD
// with momentum) on a batch of 64 in f32 on the CPU worker, with the read
// of the loss: sent op by op, and replayed as a captured Step. It reports
// the ops each step puts on the wire.
func BenchmarkStep(b *testing.B) {
	for _, captured := range []bool{false, true} {
		name := "op-by-op"
		if captured {
			name = "replayed"
		}
		b.Run(name, func(b *testing.B) {
			c, s, w := fabric(b)
			ctx := context.Background()
			l1, _ := nn.NewLinear(s, 784, 128)
			l2, _ := nn.NewLinear(s, 128, 10)
			model := nn.NewSequential(l1, nn.ReLU{}, l2)
			opt := &nn.SGD{LR: 0.01, Momentum: 0.9}
			x := nn.Uniform(s, []int{64, 784}, 0, 1).Detach()
			y := nn.Cast(nn.Mul(nn.Uniform(s, []int{64}, 0, 10), nn.Ones(s, kernels.Float32, nil)), kernels.Int64).Detach()
			lossOf := func(batch []*nn.Tensor) (*nn.Tensor, error) {
				logits, err := model.Forward(batch[0])
				if err != nil {
					return nil, err
				}
				return nn.CrossEntropy(logits, batch[1], nn.ReduceMean), nil
			}
			st, err := nn.NewStep(c, model.Params(), opt, lossOf, x.Meta(), y.Meta())
			if err != nil {
				b.Fatal(err)
			}
			step := func() {
				var loss *nn.Tensor
				var err error
				if captured {
					loss, err = st.Run(ctx, x, y)
				} else {
					loss, err = lossOf([]*nn.Tensor{x, y})
					if err == nil {
						err = nn.Backward(loss)
					}
					if err == nil {
						err = opt.Step(model.Params())
					}
					nn.ZeroGrad(model.Params())
				}
				if err != nil {
					b.Fatal(err)
				}
				if _, err := loss.Item(ctx); err != nil {
					b.Fatal(err)
				}
				loss.Free()
			}
			step()
			step()
			before := opsDone(b, w)
			n := 0
			for b.Loop() {
				step()
				n++
			}
			b.ReportMetric((opsDone(b, w)-before)/float64(n), "wire-ops/step")
		})
	}
}

func TestStepRefusesBadArguments(t *testing.T) {
	c, _ := ltLayerFabric(t)
	s := ltOpenSession(t, c)
	model := stepModel(t, s)
	lossOf := func(b []*nn.Tensor) (*nn.Tensor, error) {
		logits, err := model.Forward(b[0])
		if err != nil {
			return nil, err
		}
		return nn.CrossEntropy(logits, b[1], nn.ReduceMean), nil
	}
	metas := []kernels.Meta{{DType: kernels.Float32, Shape: []int{6, 8}}, {DType: kernels.Int64, Shape: []int{6}}}
	if _, err := nn.NewStep(c, model.Params(), nil, lossOf, metas...); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("no optimizer: %v", err)
	}
	st, err := nn.NewStep(c, model.Params(), &nn.SGD{LR: 0.1}, lossOf, metas...)
	if err != nil {
		t.Fatal(err)
	}
	x, y := stepBatch(t, s, 0)
	ctx := context.Background()
	for name, batch := range map[string][]*nn.Tensor{
		"one tensor":  {x},
		"swapped":     {y, x},
		"wrong shape": {nn.Reshape(x, 8, 6), y},
	} {
		if _, err := st.Run(ctx, batch...); !errors.Is(err, nn.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	loss, err := st.Run(ctx, x, y)
	if err != nil || !st.Captured() {
		t.Fatalf("a good batch: %v, captured %v", err, st.Captured())
	}
	if v, err := loss.Item(ctx); err != nil || !(v > 0) {
		t.Fatalf("loss %v, %v", v, err)
	}
}

// TestGradStepAndUpdateReplayTheStep: a step run as its two captured
// halves, forward and backward then the update, gives the bits of the same
// step op by op, with the aux output (twice the loss, outside the gradient),
// and so does one whose forward and backward is replayed in two parts
// (dropout included: the forward runs whole in the first part), with ops
// between the parts, and one whose early part (the first layer's matmul)
// is queued before the update of the parameters it does not read, the
// update run in two by bucket: the ops of every mode mint as many ids
// before each dropout.
func TestGradStepAndUpdateReplayTheStep(t *testing.T) {
	c, _ := ltLayerFabric(t)
	ctx := context.Background()
	opts := map[string]func() nn.Optimizer{
		"sgd momentum": func() nn.Optimizer { return &nn.SGD{LR: 0.05, Momentum: 0.9} },
		"adam":         func() nn.Optimizer { return nn.NewAdam(0.01) },
	}
	const steps = 4
	for name, newOpt := range opts {
		t.Run(name, func(t *testing.T) {
			run := func(mode string) ([]float64, [][]float32) {
				captured := mode != "ops"
				s := ltOpenSession(t, c)
				model := stepModel(t, s)
				opt := newOpt()
				fn := func(b []*nn.Tensor) (*nn.Tensor, []*nn.Tensor, error) {
					logits, err := model.Forward(b[0])
					if err != nil {
						return nil, nil, err
					}
					loss := nn.CrossEntropy(logits, b[1], nn.ReduceMean)
					twice := nn.Wrap(loss.Client().Add(loss.Client()), kernels.Float32, nil)
					return loss, []*nn.Tensor{twice}, loss.Err()
				}
				metas := []kernels.Meta{{DType: kernels.Float32, Shape: []int{6, 8}}, {DType: kernels.Int64, Shape: []int{6}}}
				newGradStep := nn.NewGradStep
				if mode == "split" || mode == "early" {
					newGradStep = nn.NewSplitGradStep
				}
				gs, err := newGradStep(c, model.Params(), fn, metas...)
				if err != nil {
					t.Fatal(err)
				}
				up, err := nn.NewUpdate(c, model.Params(), opt)
				if err != nil {
					t.Fatal(err)
				}
				// "early": the update in two, by bucket; the first
				// bucket's queued after the next step's early part.
				ps := model.Params()
				upFirst, err := nn.NewUpdate(c, ps[1:], opt)
				if err != nil {
					t.Fatal(err)
				}
				upRest, err := nn.NewUpdate(c, ps[:1], opt)
				if err != nil {
					t.Fatal(err)
				}
				pendingFirst := false
				var losses []float64
				for k := range steps {
					x, y := stepBatch(t, s, k)
					var loss *nn.Tensor
					var aux []*nn.Tensor
					// Every mode queues an op of its own between the
					// backward and the update, so that each step mints as
					// many ids (dropout's masks are keyed by them); the
					// split one between its parts.
					between := func() {
						g := model.Params()[2].T.Grad().Client()
						g.Add(g).Free()
					}
					switch mode {
					case "whole":
						loss, aux, err = gs.Run(ctx, x, y)
						if err == nil {
							between()
							err = up.Run(ctx)
						}
					case "early":
						// The early part (the first layer's matmul) needs
						// the first layer's weight, updated at the end of
						// the last step, and not the rest, updated now.
						if err = gs.Begin(ctx, x, y); err == nil && !gs.Early() {
							t.Fatal("the split step has no early part")
						}
						if err == nil && pendingFirst {
							err = upFirst.Run(ctx)
						}
						if err == nil {
							loss, aux, err = gs.Start(ctx, x, y)
						}
						if err == nil {
							between()
							err = gs.Finish()
						}
						if err == nil {
							err = upRest.Run(ctx)
							pendingFirst = true
						}
						if err == nil && k == steps-1 {
							err = upFirst.Run(ctx)
						}
					case "split":
						loss, aux, err = gs.Start(ctx, x, y)
						if err != nil {
							t.Fatal(err)
						}
						// The first bucket's gradients are there; the
						// others are not yet.
						params := model.Params()
						buckets := gs.Buckets()
						if len(buckets) != 2 || !slices.Equal(buckets[0], []int{1, 2, 3}) || !slices.Equal(buckets[1], []int{0}) {
							t.Fatalf("buckets %v, want the last layer's parameters and the first's bias first", buckets)
						}
						if k == 0 && (params[0].T.Grad() != nil || params[1].T.Grad() == nil) {
							t.Fatal("after Start, the first bucket's parameters hold gradients and no other does")
						}
						between()
						err = gs.Finish()
						if err == nil && params[0].T.Grad() == nil {
							err = errors.New("no gradient of parameter 0 after Finish")
						}
						if err == nil {
							err = up.Run(ctx)
						}
					default:
						loss, aux, err = fn([]*nn.Tensor{x, y})
						if err == nil {
							err = nn.Backward(loss)
						}
						if err == nil {
							between()
							err = opt.Step(model.Params())
						}
						nn.ZeroGrad(model.Params())
					}
					if err != nil {
						t.Fatal(err)
					}
					for _, l := range []*nn.Tensor{loss, aux[0]} {
						v, err := l.Item(ctx)
						if err != nil {
							t.Fatal(err)
						}
						losses = append(losses, v)
						l.Free()
					}
					x.Free()
					y.Free()
				}
				if mode == "early" {
					up = upFirst
				}
				if captured && (!gs.Captured() || !up.Captured()) {
					t.Fatalf("captured: forward and backward %v, update %v", gs.Captured(), up.Captured())
				}
				var params [][]float32
				for _, p := range model.Params() {
					v, err := p.T.Float32s(ctx)
					if err != nil {
						t.Fatal(err)
					}
					params = append(params, v)
				}
				return losses, params
			}
			wantLoss, wantParams := run("ops")
			for _, mode := range []string{"whole", "split", "early"} {
				gotLoss, gotParams := run(mode)
				for k := range wantLoss {
					if math.Float64bits(gotLoss[k]) != math.Float64bits(wantLoss[k]) {
						t.Errorf("%s: output %d: %v captured, %v op by op", mode, k, gotLoss[k], wantLoss[k])
					}
				}
				for i := range wantParams {
					if !slices.Equal(gotParams[i], wantParams[i]) {
						t.Errorf("%s: parameter %d differs after %d steps", mode, i, steps)
					}
				}
			}
		})
	}
}

// TestSplitGradStepRefusesMisuse: Finish needs a Start, Start needs the
// last run finished, and Finish refuses a batch or parameter freed since
// Start; a step of one parameter is replayed whole.
func TestSplitGradStepRefusesMisuse(t *testing.T) {
	c, _ := ltLayerFabric(t)
	s := ltOpenSession(t, c)
	model := stepModel(t, s)
	fn := func(b []*nn.Tensor) (*nn.Tensor, []*nn.Tensor, error) {
		logits, err := model.Forward(b[0])
		if err != nil {
			return nil, nil, err
		}
		loss := nn.CrossEntropy(logits, b[1], nn.ReduceMean)
		return loss, nil, loss.Err()
	}
	metas := []kernels.Meta{{DType: kernels.Float32, Shape: []int{6, 8}}, {DType: kernels.Int64, Shape: []int{6}}}
	if _, err := nn.NewSplitGradStep(c, nil, fn, metas...); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("no parameters: %v", err)
	}
	gs, err := nn.NewSplitGradStep(c, model.Params(), fn, metas...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := gs.Finish(); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("Finish before any Start: %v", err)
	}
	if gs.Buckets() != nil {
		t.Errorf("buckets %v before the capture", gs.Buckets())
	}
	x, y := stepBatch(t, s, 0)
	loss, _, err := gs.Start(ctx, x, y)
	if err != nil {
		t.Fatal(err)
	}
	loss.Free()
	if _, _, err := gs.Start(ctx, x, y); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("Start twice: %v", err)
	}
	x.Free()
	if err := gs.Finish(); !errors.Is(err, nn.ErrFreed) {
		t.Errorf("Finish with the batch freed: %v", err)
	}
	// The run is over: a new one goes through.
	x, y = stepBatch(t, s, 1)
	if loss, _, err = gs.Run(ctx, x, y); err != nil {
		t.Fatal(err)
	}
	if v, err := loss.Item(ctx); err != nil || !(v > 0) {
		t.Fatalf("loss %v, %v", v, err)
	}
	if err := gs.Finish(); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("Finish after Run: %v", err)
	}
	// Begin twice; Start on another batch than Begin's; Start after the
	// early part's parameter changed.
	x, y = stepBatch(t, s, 2)
	if err := gs.Begin(ctx, x, y); err != nil {
		t.Fatal(err)
	}
	if err := gs.Begin(ctx, x, y); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("Begin twice: %v", err)
	}
	x2, y2 := stepBatch(t, s, 3)
	if _, _, err := gs.Start(ctx, x2, y); !errors.Is(err, nn.ErrInvalidArgument) || !strings.Contains(err.Error(), "another batch") {
		t.Errorf("Start on another batch: %v", err)
	}
	w0 := model.Params()[0]
	old := w0.T
	w0.T = nn.Zeros(s, kernels.Float32, old.Shape()).RequireGrad()
	if _, _, err := gs.Start(ctx, x, y); !errors.Is(err, nn.ErrInvalidArgument) || !strings.Contains(err.Error(), "changed since Begin") {
		t.Errorf("Start after the early part's parameter changed: %v", err)
	}
	w0.T.Free()
	w0.T = old
	// That run is over: Begin and Start go through again.
	if err := gs.Begin(ctx, x2, y2); err != nil {
		t.Fatal(err)
	}
	if loss, _, err = gs.Start(ctx, x2, y2); err != nil {
		t.Fatal(err)
	}
	if err := gs.Finish(); err != nil {
		t.Fatal(err)
	}
	if v, err := loss.Item(ctx); err != nil || !(v > 0) {
		t.Fatalf("loss after Begin, Start, Finish: %v, %v", v, err)
	}

	// The buckets of the same backward sent op by op are the replay's.
	nn.ZeroGrad(model.Params())
	if _, err := nn.GradBuckets(model.Params()); !errors.Is(err, nn.ErrInvalidArgument) {
		t.Errorf("GradBuckets without gradients: %v", err)
	}
	loss, _, err = fn([]*nn.Tensor{x, y})
	if err == nil {
		err = nn.Backward(loss)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, err := nn.GradBuckets(model.Params()); err != nil || !slices.EqualFunc(got, gs.Buckets(), slices.Equal) {
		t.Errorf("GradBuckets %v, %v; the split step's %v", got, err, gs.Buckets())
	}

	// One parameter: one bucket, replayed whole.
	w := &nn.Param{Name: "w", T: nn.Zeros(s, kernels.Float32, []int{8, 4}).RequireGrad()}
	one, err := nn.NewSplitGradStep(c, []*nn.Param{w}, func(b []*nn.Tensor) (*nn.Tensor, []*nn.Tensor, error) {
		loss := nn.CrossEntropy(nn.Matmul(b[0], w.T), b[1], nn.ReduceMean)
		return loss, nil, loss.Err()
	}, metas...)
	if err != nil {
		t.Fatal(err)
	}
	if loss, _, err = one.Run(ctx, x, y); err != nil {
		t.Fatal(err)
	}
	if b := one.Buckets(); len(b) != 1 || !slices.Equal(b[0], []int{0}) {
		t.Fatalf("buckets %v of one parameter", b)
	}
	if v, err := loss.Item(ctx); err != nil || math.Abs(v-math.Log(4)) > 1e-6 {
		t.Fatalf("loss %v, %v: want log 4", v, err)
	}
}
