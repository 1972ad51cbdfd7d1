package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// Throughput benchmarks count the bytes an op moves to or from memory:
// reads plus writes. A copy of n bytes moves 2n, an add of n-byte operands
// 3n, a sum over n bytes n. Each size runs a plain copy of the op's input
// bytes beside the op, so the two figures come from the same run.

var sizes = []struct {
	name string
	n    int
}{{"1K", 1 << 10}, {"64K", 1 << 16}, {"1M", 1 << 20}, {"16M", 1 << 24}}

func BenchmarkAdd(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(1, 2))
	for _, sz := range sizes {
		x, y := tensor(b, be, r, kernels.Float32, sz.n), tensor(b, be, r, kernels.Float32, sz.n)
		op := &kernels.Op{Name: kernels.OpAdd}
		out := infer(b, be, op, x, y)
		in := []*kernels.Tensor{x, y}
		b.Run("copy/"+sz.name, func(b *testing.B) {
			src, dst := x.Buf.(*cpu.Buffer).Host(), out[0].Buf.(*cpu.Buffer).Host()
			b.SetBytes(int64(2 * len(src)))
			for b.Loop() {
				copy(dst, src)
			}
		})
		b.Run("add/"+sz.name, func(b *testing.B) {
			b.SetBytes(int64(3 * 4 * sz.n))
			for b.Loop() {
				if err := be.Exec(op, in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("add-row/"+sz.name, func(b *testing.B) {
			row := tensor(b, be, r, kernels.Float32, 1024)
			x := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: []int{sz.n / 1024, 1024}}, Buf: x.Buf}
			in := []*kernels.Tensor{x, row}
			b.SetBytes(int64(2 * 4 * sz.n))
			for b.Loop() {
				if err := be.Exec(op, in, []*kernels.Tensor{{Meta: x.Meta, Buf: out[0].Buf}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkSum(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(3, 4))
	for _, sz := range sizes {
		x := tensor(b, be, r, kernels.Float32, sz.n)
		dst := make([]byte, 4*sz.n)
		b.Run("copy/"+sz.name, func(b *testing.B) {
			src := x.Buf.(*cpu.Buffer).Host()
			b.SetBytes(int64(2 * len(src)))
			for b.Loop() {
				copy(dst, src)
			}
		})
		for _, c := range []struct {
			name  string
			shape []int
			axes  []int
		}{
			{"all", []int{sz.n}, nil},
			{"rows", []int{sz.n / 1024, 1024}, []int{1}},
			{"columns", []int{sz.n / 1024, 1024}, []int{0}},
		} {
			xs := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: c.shape}, Buf: x.Buf}
			op := &kernels.Op{Name: kernels.OpSum, Axes: c.axes}
			out := infer(b, be, op, xs)
			in := []*kernels.Tensor{xs}
			b.Run(c.name+"/"+sz.name, func(b *testing.B) {
				b.SetBytes(int64(4 * sz.n))
				for b.Loop() {
					if err := be.Exec(op, in, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkMatmul reports GFLOP/s (2·m·n·k a product) on square sizes and
// on the shapes a training step of a small MLP and CNN runs: forward,
// and backward with one operand transposed, the transpose (a permute op,
// as the fabric runs it) timed with the product ("T" names).
func BenchmarkMatmul(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(5, 6))
	type shape struct {
		name    string
		m, k, n int
		trans   byte // 'a' or 'b': that operand is given transposed
		fold    bool // and read in place (ExecMatmulT), not permuted first
	}
	var shapes []shape
	for _, n := range []int{64, 256, 1024, 2048} {
		shapes = append(shapes, shape{name: fmt.Sprint(n), m: n, k: n, n: n})
	}
	shapes = append(shapes,
		shape{name: "mlp1", m: 128, k: 784, n: 512},
		shape{name: "mlp2", m: 128, k: 512, n: 512},
		shape{name: "mlp3", m: 128, k: 512, n: 10},
		shape{name: "mlp1-dw", m: 784, k: 128, n: 512},
		shape{name: "mlp1-dwT", m: 784, k: 128, n: 512, trans: 'a'},
		shape{name: "mlp2-dx", m: 128, k: 512, n: 512},
		shape{name: "mlp2-dxT", m: 128, k: 512, n: 512, trans: 'b'},
		shape{name: "mlp3-dx", m: 128, k: 10, n: 512},
		shape{name: "mlp3-dw", m: 512, k: 128, n: 10},
		// The MLP's step as nn sends it (x·Wᵀ forward, gᵀ·x for the weight
		// gradients), permute then matmul, or folded.
		shape{name: "mlp1-fwd-T", m: 128, k: 784, n: 512, trans: 'b'},
		shape{name: "mlp1-fwd-fold", m: 128, k: 784, n: 512, trans: 'b', fold: true},
		shape{name: "mlp2-fwd-T", m: 128, k: 512, n: 512, trans: 'b'},
		shape{name: "mlp2-fwd-fold", m: 128, k: 512, n: 512, trans: 'b', fold: true},
		shape{name: "mlp1-dW-T", m: 512, k: 128, n: 784, trans: 'a'},
		shape{name: "mlp1-dW-fold", m: 512, k: 128, n: 784, trans: 'a', fold: true},
		shape{name: "mlp2-dW-T", m: 512, k: 128, n: 512, trans: 'a'},
		shape{name: "mlp2-dW-fold", m: 512, k: 128, n: 512, trans: 'a', fold: true},
		shape{name: "conv2", m: 128 * 576, k: 288, n: 64},
		shape{name: "conv2-dx", m: 128 * 576, k: 64, n: 288},
		shape{name: "conv2-dw", m: 288, k: 128 * 576, n: 64},
	)
	for _, s := range shapes {
		for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64} {
			if dt == kernels.Float64 && s.m*s.n*s.k > 1<<30 {
				continue
			}
			b.Run(fmt.Sprintf("%v/%s", dt, s.name), func(b *testing.B) {
				x, y := tensor(b, be, r, dt, s.m, s.k), tensor(b, be, r, dt, s.k, s.n)
				var pre []*kernels.Op
				var preIn, preOut [][]*kernels.Tensor
				transpose := func(t *kernels.Tensor) *kernels.Tensor {
					sh := t.Shape
					tt := tensor(b, be, r, dt, sh[1], sh[0])
					op := &kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}
					pre = append(pre, op)
					preIn = append(preIn, []*kernels.Tensor{tt})
					o := infer(b, be, op, tt)
					preOut = append(preOut, o)
					return o[0]
				}
				switch s.trans {
				case 'a':
					x = transpose(x)
				case 'b':
					y = transpose(y)
				}
				op := &kernels.Op{Name: kernels.OpMatmul}
				out := infer(b, be, op, x, y)
				in := []*kernels.Tensor{x, y}
				if s.fold {
					// The stored operand, read in place.
					stored := []*kernels.Tensor{x, y}
					stored[s.trans-'a'] = preIn[0][0]
					trans := [2]bool{s.trans == 'a', s.trans == 'b'}
					for b.Loop() {
						if err := be.ExecMatmulT(op, trans, stored, out); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					return
				}
				for b.Loop() {
					for i, op := range pre {
						if err := be.Exec(op, preIn[i], preOut[i]); err != nil {
							b.Fatal(err)
						}
					}
					if err := be.Exec(op, in, out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkTiny measures the cost of Exec itself, on ops of a few
// elements such as the fabric runs by the hundred thousand.
func BenchmarkTiny(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(7, 8))
	x, y := tensor(b, be, r, kernels.Float32, 4, 4), tensor(b, be, r, kernels.Float32, 4)
	for _, c := range []struct {
		name string
		op   kernels.Op
		in   []*kernels.Tensor
	}{
		{"add", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x, x}},
		{"add-row", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x, y}},
		{"exp", kernels.Op{Name: kernels.OpExp}, []*kernels.Tensor{x}},
		{"sum", kernels.Op{Name: kernels.OpSum, Axes: []int{-1}}, []*kernels.Tensor{x}},
		{"matmul", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x, x}},
		{"permute", kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}, []*kernels.Tensor{x}},
		{"full", kernels.Op{Name: kernels.OpFull, Shape: []int{4, 4}, Value: 1}, nil},
	} {
		out := infer(b, be, &c.op, c.in...)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := be.Exec(&c.op, c.in, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
