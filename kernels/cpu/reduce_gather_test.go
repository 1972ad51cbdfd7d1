package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSumOuterInner checks that summing [a, k, b] over a and b a gathered
// block at a time gives the bits of the general path, which transposes x
// to [k, a·b] first and sums its rows, for rows shorter and longer than a
// block, and blocks that end inside a segment.
func TestSumOuterInner(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, sh := range [][3]int{{2, 3, 5}, {128, 64, 576}, {3, 7, 4096}, {5, 2, 1000}, {9000, 2, 1}, {1, 3, 9000}} {
		a, k, b := sh[0], sh[1], sh[2]
		// float64, whose sums show any change of order in their last bits.
		x := make([]float64, a*k*b)
		for i := range x {
			x[i] = r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-6))
		}
		tr := make([]float64, len(x))
		for i := range a {
			for j := range k {
				copy(tr[j*a*b+i*b:j*a*b+(i+1)*b], x[(i*k+j)*b:(i*k+j+1)*b])
			}
		}
		for _, rd := range []red{rSum, rMean} {
			want, got := make([]float64, k), make([]float64, k)
			rowsFloat(rd, 0, tr, want, nil, k, a*b)
			sumOuterInner(rd, x, got, a, k, b)
			for j := range k {
				if math.Float64bits(want[j]) != math.Float64bits(got[j]) {
					t.Fatalf("%v red %d row %d: %v, want %v", sh, rd, j, got[j], want[j])
				}
			}
		}
	}
}
