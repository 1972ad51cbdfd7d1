// Package gonum measures the CPU backend's float32 matmul against gonum's
// Sgemm (its pure-Go BLAS, the usual Go baseline) in the same run:
//
//	cd bench/gonum && go test -run x -bench .
package gonum

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

func BenchmarkMatmul(b *testing.B) {
	for _, n := range []int{256, 1024, 2048} {
		a, c := make([]float32, n*n), make([]float32, n*n)
		for i := range a {
			a[i] = rand.Float32() - 0.5
			c[i] = rand.Float32() - 0.5
		}
		flops := 2 * float64(n) * float64(n) * float64(n)
		b.Run(fmt.Sprintf("gonum-sgemm/%d", n), func(b *testing.B) {
			out := make([]float32, n*n)
			var impl gonum.Implementation
			for b.Loop() {
				impl.Sgemm(blas.NoTrans, blas.NoTrans, n, n, n, 1, a, n, c, n, 0, out, n)
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("jetfabric-cpu/%d", n), func(b *testing.B) {
			be := cpu.New()
			m := kernels.Meta{DType: kernels.Float32, Shape: []int{n, n}}
			mk := func(src []float32) *kernels.Tensor {
				buf, err := be.Alloc(m.Bytes())
				if err != nil {
					b.Fatal(err)
				}
				if src != nil {
					if err := be.Upload(buf, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src))); err != nil {
						b.Fatal(err)
					}
				}
				return &kernels.Tensor{Meta: m, Buf: buf}
			}
			ta, tc, out := mk(a), mk(c), mk(nil)
			op := &kernels.Op{Name: kernels.OpMatmul}
			for b.Loop() {
				if err := be.Exec(op, []*kernels.Tensor{ta, tc}, []*kernels.Tensor{out}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
