package cpu

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestMaxPoolGrad2x2 checks that the 2×2 stride-2 pool and its gradient
// give the bits of the general path: ties (small integers), NaN, signed zeros and
// infinities in x and dy, odd heights and widths, both float dtypes.
func TestMaxPoolGrad2x2(t *testing.T) {
	b := New()
	r := rand.New(rand.NewPCG(5, 6))
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1)}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64} {
		for _, sh := range [][]int{{2, 3, 8, 6}, {1, 2, 7, 5}, {3, 1, 4, 9}, {1, 1, 2, 2}, {2, 4, 25, 24}} {
			op := &kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}
			x := kernels.Meta{DType: dt, Shape: sh}
			ys, err := kernels.Infer(&kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}, []kernels.Meta{x}, kernels.DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			fill := func(m kernels.Meta) *kernels.Tensor {
				buf, err := b.Alloc(m.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Free(buf) })
				d := buf.(*Buffer).Host()
				for i := range m.Numel() {
					v := float64(r.IntN(5) - 2)
					if r.IntN(8) == 0 {
						v = specials[r.IntN(len(specials))]
					}
					kernels.PutValue(dt, d, i, v)
				}
				return &kernels.Tensor{Meta: m, Buf: buf}
			}
			xt, dy := fill(x), fill(ys[0])
			fast, slow := fill(x), fill(x)
			if err := b.Exec(op, []*kernels.Tensor{dy, xt}, []*kernels.Tensor{fast}); err != nil {
				t.Fatal(err)
			}
			fast2x2 = false
			err = b.Exec(op, []*kernels.Tensor{dy, xt}, []*kernels.Tensor{slow})
			fast2x2 = true
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data(fast), data(slow)) {
				t.Errorf("%v %v: the 2x2 path differs from the general one", dt, sh)
			}
			fwd := &kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}
			yf, yg := fill(ys[0]), fill(ys[0])
			if err := b.Exec(fwd, []*kernels.Tensor{xt}, []*kernels.Tensor{yf}); err != nil {
				t.Fatal(err)
			}
			fast2x2 = false
			err = b.Exec(fwd, []*kernels.Tensor{xt}, []*kernels.Tensor{yg})
			fast2x2 = true
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(data(yf), data(yg)) {
				t.Errorf("%v %v: the 2x2 pool differs from the general one", dt, sh)
			}
		}
	}
}
