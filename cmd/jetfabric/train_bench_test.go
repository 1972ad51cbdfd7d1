package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/datasets"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// BenchmarkTrainStep is one training step (forward, backward, Adam) of the
// MLP and the CNN at batch 128 on CPU workers in this process, the batch
// cut on the worker; each step waits for the worker, as a step of PyTorch
// on the CPU does. Compare with the PyTorch anchors of the same models run
// on the same cores. "ops" sends each step op by op (-no-graph), "replay"
// replays it as captured graphs; "dp2" splits each batch over two devices
// of one worker, the gradients summed through the object store, each
// rank's forward and backward replayed in two parts with the first
// bucket's sum queued between them ("replay", as train runs) or replayed
// whole, all gradients summed after it ("replay-whole", -no-split).
func BenchmarkTrainStep(b *testing.B) {
	data, err := mnistData()
	if err != nil {
		b.Fatal(err)
	}
	// Transfers on memory storage, as the fabric train starts keeps them.
	br := brokertest.Run(b, func(c *broker.Config) { c.Provision.XferStorage = jetstream.MemoryStorage })
	workertest.Run(b, br, workertest.CPUs(2))
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const batch, examples = 128, 128 * 16
	train := data[0].Head(examples)
	for _, bench := range []struct {
		model, mode string
		ranks       int
	}{{"mlp", "ops", 1}, {"mlp", "replay", 1}, {"cnn", "ops", 1}, {"cnn", "replay", 1},
		{"mlp", "ops", 2}, {"mlp", "replay", 2}, {"mlp", "replay-whole", 2},
		{"cnn", "ops", 2}, {"cnn", "replay", 2}, {"cnn", "replay-whole", 2}} {
		name := bench.model + "/" + bench.mode
		if bench.ranks > 1 {
			name = bench.model + "/dp2-" + bench.mode
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			var reps []*replica
			for i := range bench.ranks {
				s, err := c.Open(ctx, fmt.Sprintf("cpu-%d", i))
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close(ctx)
				s.Seed(1)
				r := &replica{s: s}
				if r.train, err = datasets.Upload(ctx, s, train.Images, []int{train.N, 1, mnist.Rows, mnist.Cols}, train.LabelsI64(), datasets.MNISTNorm); err != nil {
					b.Fatal(err)
				}
				if r.model, err = newModel(s, bench.model, 512); err != nil {
					b.Fatal(err)
				}
				r.params, r.opt = r.model.Params(), nn.NewAdam(1e-3)
				r.split = bench.mode != "replay-whole"
				if bench.mode != "ops" {
					if err := r.useGraphs(c, bench.ranks); err != nil {
						b.Fatal(err)
					}
				}
				if r.ep, err = r.train.Epoch(ctx, datasets.Permutation(1, 0, train.N)); err != nil {
					b.Fatal(err)
				}
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
				reps = append(reps, r)
			}
			tr := &trainer{c: c, reps: reps}
			step := func(i int) {
				lo := i % (examples / batch) * batch
				if err := tr.step(ctx, lo, lo+batch); err != nil {
					b.Fatal(err)
				}
				for _, r := range reps {
					for _, l := range r.losses {
						l.Free()
					}
					r.correct.Free()
					r.losses, r.correct = r.losses[:0], nil
				}
				for _, r := range reps {
					if err := r.s.Sync(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			for i := range 3 { // warm up: allocations, Adam's state, the captures
				step(i)
			}
			i := 0
			for b.Loop() {
				step(i)
				i++
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(i), "ms/step")
			b.ReportMetric(float64(batch*i)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
