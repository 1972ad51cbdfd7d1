package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestAdamBits checks that the float32 adam_step gives, element for
// element, the bits of the scalar loop written out here, whichever path
// (vector or scalar, and any split over cores) the backend takes; lengths
// with tails, infinities and zeros included.
func TestAdamBits(t *testing.T) {
	b := New()
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 8, 9, 31, 1000, 40007} {
		for _, op := range []kernels.Op{
			{Name: kernels.OpAdamStep, LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 3},
			{Name: kernels.OpAdamStep, LR: 1e-2, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, T: 11, WeightDecay: 0.1},
			{Name: kernels.OpAdamStep, LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1, WeightDecay: 0.01, Decoupled: true},
		} {
			in := make([][]float32, 4)
			ts := make([]*kernels.Tensor, 7)
			for k := range ts {
				buf, err := b.Alloc(4 * n)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Free(buf)
				ts[k] = &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: []int{n}}, Buf: buf}
				if k < 4 {
					in[k] = view[float32](data(ts[k]), n)
					for i := range in[k] {
						x := float32(r.NormFloat64())
						if k == 3 {
							x *= x
						}
						in[k][i] = x
					}
				}
			}
			in[1][0], in[0][n/2], in[1][n-1] = float32(math.Inf(1)), 0, float32(math.Copysign(0, -1))
			if err := b.Exec(&op, ts[:4], ts[4:]); err != nil {
				t.Fatal(err)
			}
			c := op.Adam()
			decay, l2 := float32(c.Decay), float32(c.L2)
			w1, b2, w2 := float32(c.OneMinusBeta1), float32(c.Beta2), float32(c.OneMinusBeta2)
			step, bc2, eps := float32(c.StepSize), float32(c.BC2Sqrt), float32(c.Eps)
			for i := range n {
				pi, gi, mi, vi := in[0][i], in[1][i], in[2][i], in[3][i]
				if l2 != 0 {
					gi += l2 * pi
				}
				pi *= decay
				mi += w1 * (gi - mi)
				vi = vi*b2 + w2*gi*gi
				denom := float32(math.Sqrt(float64(vi)))/bc2 + eps
				want := []float32{pi - step*(mi/denom), mi, vi}
				for k, w := range want {
					got := view[float32](data(ts[4+k]), n)[i]
					if math.Float32bits(got) != math.Float32bits(w) && !(got != got && w != w) {
						t.Fatalf("n %d, %+v: output %d element %d is %v (%#x), want %v (%#x)", n, op, k, i, got, math.Float32bits(got), w, math.Float32bits(w))
					}
				}
			}
		}
	}
}
