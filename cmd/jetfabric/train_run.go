package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/datasets"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
)

// trainReport is what `jetfabric train --json` prints.
type trainReport struct {
	Model         string   `json:"model"`
	Devices       []string `json:"devices"`
	Epochs        int      `json:"epochs"`
	Batch         int      `json:"batch"`
	LR            float64  `json:"lr"`
	Schedule      string   `json:"schedule"`
	Seed          uint64   `json:"seed"`
	TrainExamples int      `json:"train_examples"`
	TestExamples  int      `json:"test_examples"`
	Steps         int      `json:"steps"`
	FinalLoss     float64  `json:"final_loss"`
	TrainAccuracy float64  `json:"train_accuracy"`
	TestAccuracy  float64  `json:"test_accuracy"`
	TrainSeconds  float64  `json:"train_seconds"`
	SamplesPerS   float64  `json:"samples_per_s"`
	StepMS        float64  `json:"step_ms"`
	// The steady state: the steps after the first loss check (graphs
	// defined, recorded and warm by then), from that check's answer (the
	// run waits for it) to the end; absent when the run had one check.
	SteadyFrom        int     `json:"steady_from_step,omitempty"`
	SteadySamplesPerS float64 `json:"steady_samples_per_s,omitempty"`
	SteadyStepMS      float64 `json:"steady_step_ms,omitempty"`
	WeightsSHA256     string  `json:"weights_sha256"`
	Saved             string  `json:"saved,omitempty"`
}

func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	var f trainFlags
	f.register(fs)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	train, test, err := f.loadMNIST()
	if err != nil {
		return err
	}
	progress := stdout
	if f.json {
		progress = stderr
	}
	if f.cf.url == "" {
		fab, stop, err := f.embedded(ctx, stderr)
		if err != nil {
			return err
		}
		defer stop()
		f.cf.url = fab.b.ClientURL()
		fmt.Fprintf(progress, "started an embedded fabric at %s (broker and workers in this process)\n", f.cf.url)
	}
	c, err := f.cf.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := waitDevices(ctx, c, f.devices); err != nil {
		return err
	}
	rep, err := trainMNIST(ctx, c, &f, train, test, progress, nil)
	if err != nil {
		return err
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	steady := ""
	if rep.SteadyFrom > 0 {
		steady = fmt.Sprintf(" (from step %d on: %.1f ms a step, %.0f samples/s)", rep.SteadyFrom, rep.SteadyStepMS, rep.SteadySamplesPerS)
	}
	fmt.Fprintf(stdout, "test accuracy %.2f%% (%d examples); %d steps, %.1f ms a step, %.0f samples/s%s; weights sha256 %s\n",
		100*rep.TestAccuracy, rep.TestExamples, rep.Steps, rep.StepMS, rep.SamplesPerS, steady, rep.WeightsSHA256)
	if rep.Saved != "" {
		fmt.Fprintf(stdout, "saved %s\n", rep.Saved)
	}
	return nil
}

// replica is one data-parallel rank: a session on its device with the
// data sets, the model and the optimizer.
type replica struct {
	s           *client.Session
	train, test *datasets.Set
	model       *nn.Sequential
	params      []*nn.Param
	opt         *nn.Adam
	ep          *datasets.Epoch
	// steps are the captured steps, by shard and batch size (the last
	// batch of an epoch may be smaller); nil with -no-graph. With more
	// than one rank, grads and update are the two halves of a step, the
	// gradients summed over the ranks between them.
	steps map[[2]int]*nn.Step
	grads map[[2]int]*nn.GradStep
	// updates are the captured updates of each bucket's parameters, made
	// at the first step (nil with -no-graph or one rank).
	updates []*nn.Update
	graphs  bool
	// split: with more than one rank, the gradients are summed in two
	// buckets, each forward and backward replayed in two parts, the first
	// bucket's sum queued between them (see nn.GradStep); sent op by op,
	// in the same buckets after the whole backward (nn.GradBuckets).
	split bool
	// Since the last check: each step's loss (scaled by the rank's share
	// of the batch), and the sum of correct predictions, on the worker.
	// Every step mints the same tensors whether a check follows it or not,
	// and a check mints none: random ops (dropout) are keyed by the ids
	// the session mints, so the weights do not depend on how often the
	// loss is checked.
	losses  []*client.Tensor
	correct *client.Tensor
}

// errNaN: the loss became NaN or infinite.
var errNaN = errors.New("the loss is not a number")

// trainMNIST trains the model of f on train (one replica a device), tests
// it on test, and saves the weights. onCheck, when set, is called with the
// last step of each window of losses read, once they are handled (the
// reads of a window are handled at the next check, or at the end).
func trainMNIST(ctx context.Context, c *client.Client, f *trainFlags, train, test *mnist.Set, progress io.Writer, onCheck func(step int)) (*trainReport, error) {
	reps := make([]*replica, len(f.devices))
	defer func() {
		// Free the sessions' tensors on the workers, even after ctx ended,
		// but never wait long on a worker that is gone.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, r := range reps {
			if r != nil {
				_ = r.s.Close(cctx)
			}
		}
	}()
	trainLabels, testLabels := train.LabelsI64(), test.LabelsI64()
	for i, dev := range f.devices {
		s, err := c.Open(ctx, dev)
		if err != nil {
			return nil, err
		}
		r := &replica{s: s}
		reps[i] = r
		// Every rank runs the same ops from the same seed, so every
		// replica starts with the same weights.
		s.Seed(f.seed)
		if r.train, err = datasets.Upload(ctx, s, train.Images, []int{train.N, 1, mnist.Rows, mnist.Cols}, trainLabels, datasets.MNISTNorm); err != nil {
			return nil, err
		}
		if r.test, err = datasets.Upload(ctx, s, test.Images, []int{test.N, 1, mnist.Rows, mnist.Cols}, testLabels, datasets.MNISTNorm); err != nil {
			return nil, err
		}
		if r.model, err = newModel(s, f.model, f.hidden); err != nil {
			return nil, err
		}
		r.params = r.model.Params()
		r.opt = nn.NewAdam(f.lr)
		r.split = !f.noSplit
		if !f.noGraph {
			if err := r.useGraphs(c, len(f.devices)); err != nil {
				return nil, err
			}
		}
		// Wait until the worker holds the data before the next rank
		// uploads the same bytes: two uploads of the same bytes under way
		// at once may both write the object named by their digest, and
		// the second replaces the chunks the first one's worker reads.
		if err := s.Sync(ctx); err != nil {
			return nil, fmt.Errorf("%s: preparing the data and the model: %w", s.Device(), err)
		}
	}

	n, B := train.N, f.batch
	perEpoch := (n + B - 1) / B
	rep := &trainReport{Model: f.model, Devices: f.devices, Epochs: f.epochs, Batch: B, LR: f.lr, Schedule: f.schedule, Seed: f.seed,
		TrainExamples: n, TestExamples: test.N}
	tr := &trainer{c: c, reps: reps}
	start := time.Now()
	lastPrint := start
	step, checked := 0, 0
	windowSamples := 0
	// The first check, waited for: when it was answered, its last step
	// and the samples through it (the start of the steady state).
	var warmAt time.Time
	warmStep, warmSamples, doneSamples := 0, 0, 0
	// Each check queues the reads of its window's losses and correct
	// counts and takes them in the background; it handles the previous
	// window's, so the worker runs the next steps while they travel.
	wctx, cancel := context.WithCancel(ctx)
	var pending *window
	defer func() {
		cancel()
		if pending != nil {
			<-pending.done
		}
	}()
	finish := func(w *window) error {
		<-w.done
		if w.err != nil {
			return w.err
		}
		var loss float64
		for i, v := range w.losses {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				bad := w.first + i
				return fmt.Errorf("%w at step %d (epoch %d): %v", errNaN, bad, (bad-1)/perEpoch+1, v)
			}
			loss += v
		}
		if doneSamples += w.samples; warmStep == 0 {
			warmStep, warmSamples = w.last, doneSamples
		}
		rep.FinalLoss = loss / float64(len(w.losses))
		rep.TrainAccuracy = w.correct / float64(w.samples)
		if onCheck != nil {
			onCheck(w.last)
		}
		if now := time.Now(); f.every > 0 && now.Sub(lastPrint) >= f.every {
			lastPrint = now
			el := now.Sub(start).Seconds()
			fmt.Fprintf(progress, "epoch %d/%d step %d/%d loss %.4f train accuracy %.2f%% %.0f samples/s\n",
				w.epoch+1, f.epochs, w.last, f.epochs*perEpoch, rep.FinalLoss, 100*rep.TrainAccuracy, float64(min(w.last*B, f.epochs*n))/el)
		}
		return nil
	}
	for epoch := range f.epochs {
		order := datasets.Permutation(f.seed, epoch, n)
		for _, r := range reps {
			var err error
			if r.ep, err = r.train.Epoch(ctx, order); err != nil {
				return nil, err
			}
		}
		for lo := 0; lo < n; lo += B {
			hi := min(lo+B, n)
			for _, r := range reps {
				r.opt.LR = f.learningRate(step, f.epochs*perEpoch)
			}
			if err := tr.step(ctx, lo, hi); err != nil {
				return nil, fmt.Errorf("step %d: %w", step+1, err)
			}
			step++
			windowSamples += hi - lo
			if step%f.check == 0 || hi == n && epoch == f.epochs-1 {
				w := startWindow(wctx, reps, checked+1, step, epoch, windowSamples)
				checked, windowSamples = step, 0
				if pending != nil {
					if err := finish(pending); err != nil {
						return nil, err
					}
				}
				pending = w
				if warmStep == 0 {
					// The first check is waited for: the steady state starts
					// with the workers done with the steps before it.
					if err := finish(pending); err != nil {
						return nil, err
					}
					pending, warmAt = nil, time.Now()
				}
			}
		}
		for _, r := range reps {
			r.ep.Free()
		}
	}
	if err := tr.flush(ctx); err != nil {
		return nil, fmt.Errorf("step %d: %w", step, err)
	}
	if pending != nil { // nil when the last check was the first, waited for
		err := finish(pending)
		pending = nil
		if err != nil {
			return nil, err
		}
	}
	end := time.Now()
	elapsed := end.Sub(start)
	rep.Steps = step
	rep.TrainSeconds = elapsed.Seconds()
	rep.SamplesPerS = float64(f.epochs*n) / elapsed.Seconds()
	rep.StepMS = float64(elapsed.Microseconds()) / 1000 / float64(step)
	if warmStep > 0 && warmStep < step {
		steady := end.Sub(warmAt)
		rep.SteadyFrom = warmStep + 1
		rep.SteadySamplesPerS = float64(f.epochs*n-warmSamples) / steady.Seconds()
		rep.SteadyStepMS = float64(steady.Microseconds()) / 1000 / float64(step-warmStep)
	}

	acc, err := evaluate(ctx, reps[0], test.N)
	if err != nil {
		return nil, err
	}
	rep.TestAccuracy = acc

	path := f.save
	if path == "" {
		dir, err := os.MkdirTemp("", "jetfabric-weights-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		path = filepath.Join(dir, "model.safetensors")
	} else {
		rep.Saved = f.save
	}
	if err := nn.Save(ctx, path, reps[0].params); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	rep.WeightsSHA256 = hex.EncodeToString(sum[:])
	return rep, nil
}

// window is a check's reads in flight: the summed losses of steps first
// to last (of epoch, from 0) and the correct predictions over their
// samples, over every rank.
type window struct {
	first, last, epoch, samples int

	done    chan struct{} // closed when the fields below are set
	losses  []float64
	correct float64
	err     error
}

// startWindow reads, on goroutines, every rank's losses and count of
// correct predictions since the last check, and frees them; the caller
// waits on done. The reads go out in the session's order, so they read what the
// steps before them made whatever is queued after them meanwhile. They
// make no tensor (see replica.losses).
func startWindow(ctx context.Context, reps []*replica, first, last, epoch, samples int) *window {
	w := &window{first: first, last: last, epoch: epoch, samples: samples,
		done: make(chan struct{}), losses: make([]float64, last-first+1)}
	type reads struct {
		r       *replica
		losses  []*client.Tensor
		correct *client.Tensor
	}
	rs := make([]reads, len(reps))
	for i, r := range reps {
		rs[i] = reads{r, r.losses, r.correct}
		r.losses, r.correct = nil, nil
	}
	go func() {
		defer close(w.done)
		// The first rank whose read failed, and why: its error is joined
		// with the other ranks' once every read is back (rankErrors).
		var mu sync.Mutex
		failed, cause := len(rs), error(nil)
		fail := func(rank int, err error) {
			if rank < failed {
				failed, cause = rank, err
			}
		}
		var wg sync.WaitGroup
		for rank, x := range rs {
			if len(x.losses) != len(w.losses) {
				for _, l := range x.losses {
					l.Free()
				}
				x.correct.Free()
				mu.Lock()
				if w.err == nil {
					w.err = fmt.Errorf("%s: step %d: %d losses since step %d", x.r.s.Device(), last, len(x.losses), first-1)
				}
				mu.Unlock()
				continue
			}
			for i, l := range x.losses {
				wg.Go(func() {
					v, err := l.Float32s(ctx)
					if err == nil && len(v) != 1 {
						err = fmt.Errorf("a loss of %d values", len(v))
					}
					l.Free()
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						fail(rank, err)
						return
					}
					w.losses[i] += float64(v[0])
				})
			}
			wg.Go(func() {
				k, err := x.correct.Float32s(ctx)
				if err == nil && len(k) != 1 {
					err = fmt.Errorf("a count of %d values", len(k))
				}
				x.correct.Free()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					fail(rank, err)
					return
				}
				w.correct += float64(k[0])
			})
		}
		wg.Wait()
		if w.err == nil && cause != nil {
			w.err = rankErrors(ctx, reps, rs[failed].r, last, cause)
		}
	}()
	return w
}

// rankErrors is err, the failure of failed's read at step, joined with the
// errors the other ranks report (one rank's failure leaves the others
// waiting in a collective: their own cause says which came first).
func rankErrors(ctx context.Context, reps []*replica, failed *replica, step int, err error) error {
	errs := []error{fmt.Errorf("%s: step %d: %w", failed.s.Device(), step, err)}
	for _, r := range reps {
		if r == failed {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := r.s.Sync(sctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.s.Device(), err))
		}
		cancel()
	}
	return errors.Join(errs...)
}

// trainer runs the training steps of a run's ranks.
type trainer struct {
	c    *client.Client
	reps []*replica
	// deferred is the last step's exchange whose first bucket's sums are
	// not yet each rank's gradients, nor applied: see step.
	deferred *gradExchange
}

// step runs one step over examples [lo, hi) of the epoch's order: each
// rank takes its share, computes its gradients, the ranks sum them (each
// rank's loss is its mean times its share of the batch, so the sum is the
// gradient of the batch's mean loss), and each rank's Adam applies them.
// On one device with captured steps, the whole step is one replay.
//
// With more ranks and r.split, each rank's forward and backward is
// replayed in parts, each followed by the concatenation of the gradients
// it made, and the all_reduce of a bucket is queued on every rank once the
// last rank has queued its part: every rank sends part 1, concat 1,
// all_reduce 1, part 2, concat 2, all_reduce 2, so that a device that runs
// a collective in the background computes the rest of the backward
// meanwhile. Captured, the forward also has an early part (see
// nn.GradStep): each rank applies the second bucket's sums at the end of
// the step, and the first bucket's (the linear layers', most of the bytes)
// in the next step, after that step's early part: so the first bucket's
// all_reduce also overlaps the second's update and the next step's
// convolutions. Flush applies what a last step deferred. Sent op by op,
// the backward goes whole, then the same two buckets, and the update
// whole; the ops of both ways mint as many ids before each random op, so
// dropout's masks (keyed by the ids) and the weights are the same.
// Without split, one bucket of every gradient.
func (tr *trainer) step(ctx context.Context, lo, hi int) error {
	reps := tr.reps
	nb, R := hi-lo, len(reps)
	var ex *gradExchange
	var pending []*nn.GradStep  // each rank's forward and backward, its first part queued
	var batches [][2]*nn.Tensor // freed once every backward is queued
	for i, r := range reps {
		a, b := lo+i*nb/R, lo+(i+1)*nb/R
		xc, yc, err := r.ep.Batch(a, b)
		if err != nil {
			return err
		}
		x := nn.Wrap(xc, kernels.Float32, []int{b - a, 1, mnist.Rows, mnist.Cols})
		y := nn.Wrap(yc, kernels.Int64, []int{b - a})
		fn := r.stepFunc(float64(b-a) / float64(nb))
		var loss *nn.Tensor
		var aux []*nn.Tensor
		buckets := [][]int{allParams(len(r.params))}
		switch {
		case r.grads != nil:
			key := [2]int{b - a, nb}
			gs := r.grads[key]
			if gs == nil {
				newGradStep := nn.NewGradStep
				if r.split {
					newGradStep = nn.NewSplitGradStep
				}
				if gs, err = newGradStep(tr.c, r.params, fn, x.Meta(), y.Meta()); err != nil {
					return err
				}
				r.grads[key] = gs
			}
			if err = gs.Begin(ctx, x, y); err == nil && tr.deferred != nil {
				err = tr.deferred.apply(ctx, tr.c, i, 0)
			}
			if err == nil {
				loss, aux, err = gs.Start(ctx, x, y)
			}
			buckets = gs.Buckets()
			pending = append(pending, gs)
		case r.steps != nil:
			st := r.steps[[2]int{b - a, nb}]
			if st == nil {
				if st, err = nn.NewStepAux(tr.c, r.params, r.opt, fn, x.Meta(), y.Meta()); err != nil {
					return err
				}
				r.steps[[2]int{b - a, nb}] = st
			}
			loss, aux, err = st.RunAux(ctx, x, y)
		default:
			loss, aux, err = fn([]*nn.Tensor{x, y})
			if err == nil {
				err = nn.Backward(loss)
			}
			if err == nil && R > 1 && r.split {
				buckets, err = nn.GradBuckets(r.params)
			}
		}
		if err != nil {
			return err
		}
		r.losses = append(r.losses, loss.Client())
		r.correct = accumulate(r.correct, aux[0].Client())
		batches = append(batches, [2]*nn.Tensor{x, y})
		if R > 1 {
			if ex == nil {
				if ex, err = newGradExchange(reps, buckets); err != nil {
					return err
				}
			} else if !slices.EqualFunc(buckets, ex.buckets, slices.Equal) {
				return fmt.Errorf("%s: its gradients come in buckets %v, rank 0's in %v", r.s.Device(), buckets, ex.buckets)
			}
			if err := ex.submit(i, 0); err != nil {
				return err
			}
		}
	}
	tr.deferred = nil
	// The rest of each rank's backward, then the concatenation of the
	// gradients it made.
	for i := range reps {
		if pending != nil {
			if err := pending[i].Finish(); err != nil {
				return err
			}
		}
		for bucket := 1; ex != nil && bucket < len(ex.buckets); bucket++ {
			if err := ex.submit(i, bucket); err != nil {
				return err
			}
		}
	}
	for _, b := range batches {
		b[0].Free()
		b[1].Free()
	}
	if R == 1 && reps[0].steps != nil {
		return nil
	}
	if R == 1 {
		err := reps[0].opt.Step(reps[0].params)
		nn.ZeroGrad(reps[0].params)
		return err
	}
	// Defer the first bucket's update to the next step when the ranks
	// replay an early part there (the same on every rank: one model).
	deferFirst := len(ex.buckets) > 1 && pending != nil && pending[0].Early()
	for i := range reps {
		for bucket := range ex.buckets {
			if bucket == 0 && deferFirst {
				continue
			}
			if err := ex.apply(ctx, tr.c, i, bucket); err != nil {
				return err
			}
		}
	}
	if deferFirst {
		tr.deferred = ex
	}
	return nil
}

// flush applies the update a last step deferred, if any.
func (tr *trainer) flush(ctx context.Context) error {
	ex := tr.deferred
	if ex == nil {
		return nil
	}
	tr.deferred = nil
	for i := range tr.reps {
		if err := ex.apply(ctx, tr.c, i, 0); err != nil {
			return err
		}
	}
	return nil
}

// trainStep runs one step over examples [lo, hi) of the epoch's order and
// applies all of it (trainer.step, then flush).
func trainStep(ctx context.Context, c *client.Client, reps []*replica, lo, hi int) error {
	tr := &trainer{c: c, reps: reps}
	if err := tr.step(ctx, lo, hi); err != nil {
		return err
	}
	return tr.flush(ctx)
}

// allParams is the indexes of n parameters: one bucket of them all.
func allParams(n int) []int {
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return all
}

// useGraphs makes r replay its steps as captured graphs: each whole step
// on one rank, each half of it with more (the forward and backward in two
// parts when r.split).
func (r *replica) useGraphs(c *client.Client, ranks int) error {
	if ranks == 1 {
		r.steps = map[[2]int]*nn.Step{}
		return nil
	}
	r.grads = map[[2]int]*nn.GradStep{}
	r.graphs = true
	return nil
}

// stepFunc is a rank's step on a shard of a batch: the loss, its mean
// cross-entropy times scale (the shard's share of the batch), and the
// number of correct predictions, an f32 scalar.
func (r *replica) stepFunc(scale float64) nn.StepFunc {
	return func(b []*nn.Tensor) (*nn.Tensor, []*nn.Tensor, error) {
		logits, err := r.model.Forward(b[0])
		if err != nil {
			return nil, nil, err
		}
		loss := nn.CrossEntropy(logits, b[1], "mean")
		if scale != 1 {
			loss = nn.ScalarMul(loss, scale)
		}
		lc := logits.Client()
		n := correct(lc.Session(), lc, b[1].Client())
		return loss, []*nn.Tensor{nn.Wrap(n, kernels.Float32, nil)}, loss.Err()
	}
}

// gradBucket bounds the bytes of gradients summed together, in one
// all_reduce of their concatenation. Each all_reduce costs round trips
// through the object store whatever its size (about 5 ms for 4 B over
// four devices of a 16-core host), and the concatenation and the split
// cost a copy: PyTorch's MNIST CNN over four devices summed its 4.8 MB of
// gradients in 44 ms as one all_reduce, 52 ms as three (its two large
// parameters alone, the small ones together), 70 ms as one a parameter
// (BenchmarkGradExchange in the client package).
const gradBucket = 64 << 20

// gradExchange sums every parameter's gradient over the ranks through the
// object store and sets the sum as each rank's gradient. The parameters
// come in buckets (the parts of a split backward, or one bucket of all),
// each summed by one all_reduce for each run of its parameters that fills
// a gradBucket (one for the MNIST networks). A sum is taken element by
// element in rank order, so grouping changes no bit.
type gradExchange struct {
	reps    []*replica
	buckets [][]int
	units   [][]int // indexes of the parameters summed together
	of      [][]int // the units of each bucket
	g       *client.GradSync
	cats    [][]*client.Tensor // [rank][unit]: the concatenations, freed once summed
	// lr is each rank's learning rate at the step: an update applied in
	// the next step (trainer.step) applies the step's.
	lr []float64
}

// newGradExchange prepares the sum of one step's gradients of reps, in
// buckets (indexes of parameters, every parameter in one bucket).
func newGradExchange(reps []*replica, buckets [][]int) (*gradExchange, error) {
	x := &gradExchange{reps: reps, buckets: buckets, of: make([][]int, len(buckets))}
	seen := make([]bool, len(reps[0].params))
	for b, ps := range buckets {
		bytes := 0
		for k, p := range ps {
			if p < 0 || p >= len(seen) || seen[p] {
				return nil, fmt.Errorf("gradient buckets %v: parameter %d out of range or twice", buckets, p)
			}
			seen[p] = true
			pr := reps[0].params[p]
			n := pr.T.Numel() * pr.T.DType().Size()
			if k == 0 || bytes+n > gradBucket {
				x.of[b] = append(x.of[b], len(x.units))
				x.units, bytes = append(x.units, nil), 0
			}
			x.units[len(x.units)-1] = append(x.units[len(x.units)-1], p)
			bytes += n
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return nil, fmt.Errorf("gradient buckets %v: no bucket holds parameter %d", buckets, i)
	}
	for _, r := range reps {
		x.lr = append(x.lr, r.opt.LR)
	}
	x.cats = make([][]*client.Tensor, len(reps))
	for i := range x.cats {
		x.cats[i] = make([]*client.Tensor, len(x.units))
	}
	var err error
	x.g, err = client.NewGradSync(len(reps), len(x.units), "sum")
	return x, err
}

// submit queues on rank the concatenation of its gradients of each unit of
// bucket and submits it: the last rank's submit queues the all_reduce on
// every rank.
func (x *gradExchange) submit(rank, bucket int) error {
	r := x.reps[rank]
	for _, u := range x.of[bucket] {
		ps := x.units[u]
		parts := make([]*client.Tensor, len(ps))
		for k, p := range ps {
			gr := r.params[p].T.Grad()
			if gr == nil {
				return fmt.Errorf("parameter %s of rank %d has no gradient", r.params[p].Name, rank)
			}
			parts[k] = gr.Client()
		}
		t := parts[0]
		if len(ps) > 1 {
			for k, part := range parts {
				parts[k] = part.Reshape(r.params[ps[k]].T.Numel())
			}
			t = r.s.Apply(codec.Op{Op: kernels.OpConcat, Axis: 0}, parts...)
			for _, part := range parts {
				part.Free()
			}
			x.cats[rank][u] = t
		}
		if err := x.g.Submit(rank, u, t); err != nil {
			return err
		}
	}
	return nil
}

// apply sets rank's gradients of bucket's parameters to their sums, once
// every rank submitted the bucket, frees the concatenations, and applies
// the rank's optimizer to those parameters: their captured update, or the
// optimizer's step op by op with -no-graph.
func (x *gradExchange) apply(ctx context.Context, c *client.Client, rank, bucket int) error {
	r := x.reps[rank]
	for _, u := range x.of[bucket] {
		ps := x.units[u]
		sums, err := x.g.Reduced(u)
		if err != nil {
			return err
		}
		sum := []*client.Tensor{sums[rank]}
		if len(ps) > 1 {
			sizes := make([]int, len(ps))
			for k, p := range ps {
				sizes[k] = r.params[p].T.Numel()
			}
			sum = r.s.ApplyN(codec.Op{Op: kernels.OpSplit, Axis: 0, Sizes: sizes}, len(ps), sums[rank])
			sums[rank].Free()
		}
		for k, p := range ps {
			t := r.params[p].T
			old := t.Grad()
			gr := sum[k]
			if len(ps) > 1 {
				gr = sum[k].Reshape(old.Shape()...)
				sum[k].Free()
			}
			t.SetGrad(nn.Wrap(gr, old.DType(), old.Shape()))
			old.Free()
		}
		if cat := x.cats[rank][u]; cat != nil {
			cat.Free()
			x.cats[rank][u] = nil
		}
	}
	params := make([]*nn.Param, len(x.buckets[bucket]))
	for k, p := range x.buckets[bucket] {
		params[k] = r.params[p]
	}
	defer func(lr float64) { r.opt.LR = lr }(r.opt.LR)
	r.opt.LR = x.lr[rank]
	if !r.graphs {
		err := r.opt.Step(params)
		nn.ZeroGrad(params)
		return err
	}
	if r.updates == nil {
		r.updates = make([]*nn.Update, len(x.buckets))
	}
	if len(r.updates) != len(x.buckets) {
		return fmt.Errorf("%s: the gradients came in %d buckets, then %d", r.s.Device(), len(r.updates), len(x.buckets))
	}
	if r.updates[bucket] == nil {
		var err error
		if r.updates[bucket], err = nn.NewUpdate(c, params, r.opt); err != nil {
			return err
		}
	}
	return r.updates[bucket].Run(ctx)
}

// correct is the number of rows of logits whose largest entry is at the
// label's index, an f32 scalar on the worker.
func correct(s *client.Session, logits, labels *client.Tensor) *client.Tensor {
	pred := s.Apply(codec.Op{Op: kernels.OpArgmax, Axes: []int{1}}, logits)
	eq := s.Apply(codec.Op{Op: kernels.OpEq}, pred, labels)
	pred.Free()
	f := eq.Cast("f32")
	eq.Free()
	n := f.Sum()
	f.Free()
	return n
}

// accumulate adds v to the running sum acc, freeing both inputs' handles.
// With no sum yet (acc nil) it makes one from v all the same, so that
// every call mints one tensor (see replica.losses).
func accumulate(acc, v *client.Tensor) *client.Tensor {
	if acc == nil {
		sum := v.Reshape()
		v.Free()
		return sum
	}
	sum := acc.Add(v)
	acc.Free()
	v.Free()
	return sum
}

// evalBatch is the number of test examples a forward pass takes.
const evalBatch = 1000

// evaluate is the accuracy of r's model on its test set, without dropout.
func evaluate(ctx context.Context, r *replica, n int) (float64, error) {
	r.model.Train(false)
	defer r.model.Train(true)
	order := make([]int64, n)
	for i := range order {
		order[i] = int64(i)
	}
	ep, err := r.test.Epoch(ctx, order)
	if err != nil {
		return 0, err
	}
	defer ep.Free()
	var acc *client.Tensor
	for lo := 0; lo < n; lo += evalBatch {
		hi := min(lo+evalBatch, n)
		xc, yc, err := ep.Batch(lo, hi)
		if err != nil {
			return 0, err
		}
		x := nn.Wrap(xc, kernels.Float32, []int{hi - lo, 1, mnist.Rows, mnist.Cols})
		logits, err := r.model.Forward(x)
		if err != nil {
			return 0, err
		}
		acc = accumulate(acc, correct(r.s, logits.Client(), yc))
		nn.Release(logits)
		x.Free()
		yc.Free()
	}
	v, err := acc.Float32s(ctx)
	if err != nil {
		return 0, fmt.Errorf("%s: testing: %w", r.s.Device(), err)
	}
	acc.Free()
	return float64(v[0]) / float64(n), nil
}

// learningRate is the learning rate of step (counted from 0) of total:
// -lr throughout, or with -schedule cosine, half a cosine from -lr at the
// first step down to 0 after the last, the default (PyTorch's CosineAnnealingLR with
// T_max the number of steps, stepped every step).
func (f *trainFlags) learningRate(step, total int) float64 {
	if f.schedule == "constant" || total <= 0 {
		return f.lr
	}
	return f.lr * 0.5 * (1 + math.Cos(math.Pi*float64(step)/float64(total)))
}
