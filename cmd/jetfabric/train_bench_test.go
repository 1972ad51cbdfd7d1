package main

import (
	"context"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/datasets"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// BenchmarkTrainStep is one training step (forward, backward, Adam) of the
// MLP and the CNN at batch 128 on a CPU worker in this process, the batch
// cut on the worker; each step waits for the worker, as a step of PyTorch
// on the CPU does. Compare with the PyTorch anchors of the same models run
// on the same cores. "ops" sends each step op by op (-no-graph), "replay"
// replays it as one captured graph.
func BenchmarkTrainStep(b *testing.B) {
	data, err := mnistData()
	if err != nil {
		b.Fatal(err)
	}
	br := brokertest.Run(b)
	workertest.Run(b, br, workertest.CPUs(1))
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const batch, examples = 128, 128 * 16
	train := data[0].Head(examples)
	for _, bench := range []struct{ model, mode string }{{"mlp", "ops"}, {"mlp", "replay"}, {"cnn", "ops"}, {"cnn", "replay"}} {
		model := bench.model
		b.Run(model+"/"+bench.mode, func(b *testing.B) {
			ctx := context.Background()
			s, err := c.Open(ctx, "cpu-0")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			s.Seed(1)
			r := &replica{s: s}
			if r.train, err = datasets.Upload(ctx, s, train.Images, []int{train.N, 1, mnist.Rows, mnist.Cols}, train.LabelsI64(), datasets.MNISTNorm); err != nil {
				b.Fatal(err)
			}
			if r.model, err = newModel(s, model, 512); err != nil {
				b.Fatal(err)
			}
			r.params, r.opt = r.model.Params(), nn.NewAdam(1e-3)
			if bench.mode == "replay" {
				if err := r.useGraphs(c, 1); err != nil {
					b.Fatal(err)
				}
			}
			if r.ep, err = r.train.Epoch(ctx, datasets.Permutation(1, 0, train.N)); err != nil {
				b.Fatal(err)
			}
			reps := []*replica{r}
			step := func(i int) {
				lo := i % (examples / batch) * batch
				if err := trainStep(ctx, c, reps, lo, lo+batch); err != nil {
					b.Fatal(err)
				}
				for _, l := range r.losses {
					l.Free()
				}
				r.correct.Free()
				r.losses, r.correct = r.losses[:0], nil
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
			for i := range 3 { // warm up: allocations, Adam's state
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
