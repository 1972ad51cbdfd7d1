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

func BenchmarkMatmul(b *testing.B) {
	be := cpu.New()
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{64, 256, 1024, 2048} {
		for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64} {
			if dt == kernels.Float64 && n > 1024 {
				continue
			}
			b.Run(fmt.Sprintf("%v/%d", dt, n), func(b *testing.B) {
				x, y := tensor(b, be, r, dt, n, n), tensor(b, be, r, dt, n, n)
				op := &kernels.Op{Name: kernels.OpMatmul}
				out := infer(b, be, op, x, y)
				in := []*kernels.Tensor{x, y}
				for b.Loop() {
					if err := be.Exec(op, in, out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
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
