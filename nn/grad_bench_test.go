package nn_test

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
)

// opsDone reads the worker's count of ops executed on cpu-0.
func opsDone(b testing.TB, w *worker.Worker) float64 {
	var buf bytes.Buffer
	if err := w.WriteMetrics(&buf); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), `jetfabric_device_ops_total{device="cpu-0"} `); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return 0
}

// BenchmarkTrainStep: one SGD step of a 784-128-10 MLP on a batch of 64
// in f32 on the CPU worker: forward, Backward, update, and the read of
// the loss. It reports the ops each step sends.
func BenchmarkTrainStep(b *testing.B) {
	_, s, w := fabric(b)
	ctx := context.Background()
	f32 := kernels.Float32
	params := []*nn.Tensor{
		nn.Normal(s, []int{784, 128}, 0, 0.03).RequireGrad(), nn.Zeros(s, f32, []int{128}).RequireGrad(),
		nn.Normal(s, []int{128, 10}, 0, 0.1).RequireGrad(), nn.Zeros(s, f32, []int{10}).RequireGrad(),
	}
	x := nn.Uniform(s, []int{64, 784}, 0, 1).Detach()
	y := nn.Cast(nn.Mul(nn.Uniform(s, []int{64}, 0, 10), nn.Ones(s, f32, nil)), kernels.Int64).Detach()
	step := func() {
		h := nn.Relu(nn.Add(nn.Matmul(x, params[0]), params[1]))
		logits := nn.Add(nn.Matmul(h, params[2]), params[3])
		loss := nn.CrossEntropy(logits, y, nn.ReduceMean)
		if err := nn.Backward(loss); err != nil {
			b.Fatal(err)
		}
		for i, p := range params {
			next := nn.Sub(p, nn.ScalarMul(p.Grad(), 0.01)).RequireGrad()
			p.Grad().Free()
			p.Free()
			params[i] = next
		}
		if _, err := loss.Item(ctx); err != nil {
			b.Fatal(err)
		}
		loss.Free()
	}
	step()
	before := opsDone(b, w)
	n := 0
	for b.Loop() {
		step()
		n++
	}
	if err := s.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric((opsDone(b, w)-before)/float64(n), "ops/step")
}
