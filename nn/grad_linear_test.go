package nn_test

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
)

// TestTransposedWeightGrad checks the gradient of a weight used through its
// transpose (x·wᵀ, which Backward differentiates as gᵀ·x) when the
// transpose feeds two products and w is also used directly: the
// contributions of every path add up.
func TestTransposedWeightGrad(t *testing.T) {
	s := ltNewSession(t)
	xv, wv, vv := ltRandoms(1, 8), ltRandoms(2, 6), ltRandoms(3, 2)
	x := ltFromValues(t, s, kernels.Float64, []int{4, 2}, xv)
	v := ltFromValues(t, s, kernels.Float64, []int{2, 1}, vv)
	w := ltFromValues(t, s, kernels.Float64, []int{3, 2}, wv).RequireGrad()
	wt := nn.Transpose(w, 0, 1)
	y1 := nn.Matmul(x, wt)                  // [4, 3]
	y2 := nn.Matmul(nn.ScalarMul(x, 3), wt) // [4, 3]
	z := nn.Matmul(w, v)                    // [3, 1]
	loss := nn.Add(nn.Add(nn.Sum(nn.Mul(y1, y1), nil, false), nn.Sum(y2, nil, false)), nn.Sum(z, nil, false))
	y1.Retain()
	if err := nn.Backward(loss); err != nil {
		t.Fatal(err)
	}
	y := ltValues(t, y1)
	want := make([]float64, 6)
	for o := range 3 {
		for i := range 2 {
			for r := range 4 {
				want[o*2+i] += 2*y[r*3+o]*xv[r*2+i] + 3*xv[r*2+i]
			}
			want[o*2+i] += vv[i]
		}
	}
	ltCloseTo(t, "dw", ltValues(t, w.Grad()), want, 1e-12)
}
