package cpu

import (
	"math"
	"testing"
)

// TestSignBits checks the branch-free sign against the float64 definition
// on zeros of both signs, subnormals, infinities and NaN.
func TestSignBits(t *testing.T) {
	vals := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 3.5, -2e-40, 1e-45, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), -float32(math.NaN())}
	y := make([]float32, len(vals))
	signFloat(vals, y)
	for i, v := range vals {
		w := float32(sign(float64(v)))
		if math.Float32bits(y[i]) != math.Float32bits(w) && !(v != v && y[i] != y[i]) {
			t.Errorf("sign(%v) = %v (%#x) want %v (%#x)", v, y[i], math.Float32bits(y[i]), w, math.Float32bits(w))
		}
	}
	v64 := []float64{0, math.Copysign(0, -1), 1, -1, 5e-324, -5e-324, math.Inf(1), math.Inf(-1), math.NaN()}
	y64 := make([]float64, len(v64))
	signFloat(v64, y64)
	for i, v := range v64 {
		w := sign(v)
		if math.Float64bits(y64[i]) != math.Float64bits(w) && !(v != v && y64[i] != y64[i]) {
			t.Errorf("sign(%v) = %v want %v", v, y64[i], w)
		}
	}
}
