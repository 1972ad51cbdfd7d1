package cpu_test

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// The shapes of PyTorch's MNIST example network at batch 128: two 3×3
// convolutions, a 2×2 max pool and the loss over 10 classes.

// BenchmarkConv2D runs conv2d and both its gradients at the MNIST
// network's two convolutions, in float32, and reports GFLOP/s counting a
// multiply-add as two.
func BenchmarkConv2D(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(9, 10))
	for _, c := range []struct {
		name string
		x, w []int
	}{
		{"conv1", []int{128, 1, 28, 28}, []int{32, 1, 3, 3}},
		{"conv2", []int{128, 32, 26, 26}, []int{64, 32, 3, 3}},
	} {
		x, w := tensor(b, be, r, kernels.Float32, c.x...), tensor(b, be, r, kernels.Float32, c.w...)
		bias := tensor(b, be, r, kernels.Float32, c.w[0])
		fwd := &kernels.Op{Name: kernels.OpConv2D}
		y := infer(b, be, fwd, x, w, bias)
		dy := tensor(b, be, r, kernels.Float32, y[0].Shape...)
		flops := 2 * float64(y[0].Numel()) * float64(c.w[1]*c.w[2]*c.w[3])
		for _, o := range []struct {
			name string
			op   *kernels.Op
			in   []*kernels.Tensor
		}{
			{"forward", fwd, []*kernels.Tensor{x, w, bias}},
			{"input_grad", &kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: c.x}, []*kernels.Tensor{dy, w}},
			{"weight_grad", &kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: c.w}, []*kernels.Tensor{x, dy}},
		} {
			out := infer(b, be, o.op, o.in...)
			b.Run(c.name+"/"+o.name, func(b *testing.B) {
				for b.Loop() {
					if err := be.Exec(o.op, o.in, out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkMaxPool2D runs a 2×2 max pool and its gradient on the MNIST
// network's [128, 64, 24, 24] activations, counting the bytes read and
// written.
func BenchmarkMaxPool2D(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(11, 12))
	x := tensor(b, be, r, kernels.Float32, 128, 64, 24, 24)
	op := &kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}
	y := infer(b, be, op, x)
	b.Run("forward", func(b *testing.B) {
		b.SetBytes(int64(x.Bytes() + y[0].Bytes()))
		for b.Loop() {
			if err := be.Exec(op, []*kernels.Tensor{x}, y); err != nil {
				b.Fatal(err)
			}
		}
	})
	grad := &kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}
	in := []*kernels.Tensor{y[0], x}
	dx := infer(b, be, grad, in...)
	b.Run("grad", func(b *testing.B) {
		b.SetBytes(int64(2*x.Bytes() + y[0].Bytes()))
		for b.Loop() {
			if err := be.Exec(grad, in, dx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCrossEntropy runs the loss and its gradient over [128, 10]
// logits.
func BenchmarkCrossEntropy(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(13, 14))
	logits := tensor(b, be, r, kernels.Float32, 128, 10)
	target := tensor(b, be, r, kernels.Int32, 128)
	h := target.Buf.(*cpu.Buffer).Host()
	for i := range 128 {
		binary.LittleEndian.PutUint32(h[4*i:], uint32(r.IntN(10)))
	}
	op := &kernels.Op{Name: kernels.OpCrossEntropy}
	loss := infer(b, be, op, logits, target)
	b.Run("forward", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := be.Exec(op, []*kernels.Tensor{logits, target}, loss); err != nil {
				b.Fatal(err)
			}
		}
	})
	grad := &kernels.Op{Name: kernels.OpCrossEntropyGrad}
	in := []*kernels.Tensor{logits, target, loss[0]}
	dl := infer(b, be, grad, in...)
	b.Run("grad", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := be.Exec(grad, in, dl); err != nil {
				b.Fatal(err)
			}
		}
	})
}
