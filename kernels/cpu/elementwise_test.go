package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// specials32 are float32 bit patterns that the vector kernels must treat
// as the Go loops do: zeros of both signs, subnormals, infinities, NaNs of
// both signs, quiet and signalling, with payloads.
var specials32 = []uint32{0, 0x80000000, 1, 0x80000001, 0x007fffff, 0x3f800000, 0xbf800000,
	0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7f800001, 0xff800001, 0x7fc00000, 0xffc00000,
	0x7fc00123, 0xffe0a506}

// TestElementwiseVectorBits: the float32 vector kernels of add, sub, mul,
// div, relu and sign, and the widening add of column sums, give the bits
// of the Go loops, element for element, on every length up to 70 (the
// tails the loops finish), from any offset, on random bit patterns and
// special values.
func TestElementwiseVectorBits(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	const n = 80
	a, b := make([]float32, n), make([]float32, n)
	for i := range a {
		u, v := r.Uint32(), r.Uint32()
		if r.IntN(3) == 0 {
			u = specials32[r.IntN(len(specials32))]
		}
		if r.IntN(3) == 0 {
			v = specials32[r.IntN(len(specials32))]
		}
		if r.IntN(4) == 0 { // ordinary numbers too, whose sums and products stay finite
			u, v = math.Float32bits(float32(r.NormFloat64())), math.Float32bits(float32(r.NormFloat64()))
		}
		a[i], b[i] = math.Float32frombits(u), math.Float32frombits(v)
	}
	same := func(x, y []float32) bool {
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
		return true
	}
	// Two NaNs added, multiplied or divided give one of their payloads,
	// which one the order of the compiled loop's operands decides (builds
	// with the race detector differ from the others): there a NaN need
	// only meet a NaN.
	sameOrNaN := func(x, y []float32) bool {
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) && !(x[i] != x[i] && y[i] != y[i]) {
				return false
			}
		}
		return true
	}
	bins := []struct {
		name      string
		vec, loop func(y, a, b []float32, m mode)
	}{
		{"add", addF32, addK[float32]}, {"sub", subF32, subK[float32]},
		{"mul", mulF32, mulK[float32]}, {"div", divF32, divK[float32]},
	}
	for off := range 3 {
		for l := 0; l+off <= 70; l++ {
			x, z := a[off:], b[off+1:] // as the walks pass them: longer than y
			for _, k := range bins {
				for _, m := range []mode{vv, vs, sv} {
					got, want := make([]float32, l), make([]float32, l)
					k.vec(got, x, z, m)
					k.loop(want, x, z, m)
					if !sameOrNaN(got, want) {
						t.Fatalf("%s mode %d, %d elements from %d: %v, want %v", k.name, m, l, off, got, want)
					}
				}
			}
			got, want := make([]float32, l), make([]float32, l)
			reluF32(x, got)
			for i, v := range x[:l] {
				want[i] = max(v, 0)
			}
			if !same(got, want) {
				t.Fatalf("relu, %d elements from %d: %v, want %v", l, off, got, want)
			}
			signF32(x, got)
			signFloat(x[:l], want)
			if !same(got, want) {
				t.Fatalf("sign, %d elements from %d: %v, want %v", l, off, got, want)
			}
			acc, acc2 := make([]float64, l), make([]float64, l)
			for i := range acc {
				acc[i] = r.NormFloat64() * 1e3
				if r.IntN(4) == 0 { // a NaN summed already, of another payload
					acc[i] = math.Float64frombits(0x7ff8000000000000 | r.Uint64()&0xfffff)
				}
				acc2[i] = acc[i]
			}
			k := addWidened(acc, x)
			for j, v := range x[k:l] {
				acc[k+j] += float64(v)
			}
			for j, v := range x[:l] {
				acc2[j] += float64(v)
			}
			for j := range acc {
				if math.Float64bits(acc[j]) != math.Float64bits(acc2[j]) && !(acc[j] != acc[j] && acc2[j] != acc2[j]) {
					t.Fatalf("widening add, %d elements from %d: element %d is %v, want %v", l, off, j, acc[j], acc2[j])
				}
			}
		}
	}
}
