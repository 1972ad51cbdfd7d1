package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refRound rounds x to a binary format with manBits stored significand
// bits, minimum normal exponent emin and largest finite value maxFinite,
// half to even, by scaling; it is independent of roundFloat64.
func refRound(x float64, manBits, emin int, maxFinite float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return x
	}
	_, e := math.Frexp(math.Abs(x)) // |x| = f * 2^e, f in [0.5, 1)
	e = max(e-1, emin)
	ulp := math.Ldexp(1, e-manBits)
	r := math.RoundToEven(math.Abs(x)/ulp) * ulp
	if r > maxFinite {
		r = math.Inf(1)
	}
	return math.Copysign(r, x)
}

func TestFloat16RoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := Float16ToFloat32(uint16(h))
		got := Float16Bits(float64(f))
		if math.IsNaN(float64(f)) {
			if got&0x7c00 != 0x7c00 || got&0x3ff == 0 || got>>15 != uint16(h)>>15 {
				t.Fatalf("f16 NaN %#04x came back as %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("f16 %#04x = %v came back as %#04x", h, f, got)
		}
	}
	for h := range 1 << 16 {
		f := BFloat16ToFloat32(uint16(h))
		got := BFloat16Bits(float64(f))
		if math.IsNaN(float64(f)) {
			if got&0x7f80 != 0x7f80 || got&0x7f == 0 {
				t.Fatalf("bf16 NaN %#04x came back as %#04x", h, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("bf16 %#04x = %v came back as %#04x", h, f, got)
		}
	}
}

func TestHalfRounding(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	check := func(x float64) {
		t.Helper()
		want := refRound(x, 10, -14, 65504)
		if got := float64(Float16ToFloat32(Float16Bits(x))); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("f16(%v) = %v, want %v", x, got, want)
		}
		want = refRound(x, 7, -126, math.Float64frombits(0x47efe00000000000))
		if got := float64(BFloat16ToFloat32(BFloat16Bits(x))); got != want && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("bf16(%v) = %v, want %v", x, got, want)
		}
	}
	// Midpoints between neighbours, and points just either side of them.
	for h := range 0x7c00 - 1 {
		a, b := float64(Float16ToFloat32(uint16(h))), float64(Float16ToFloat32(uint16(h+1)))
		m := (a + b) / 2
		for _, x := range []float64{m, math.Nextafter(m, 0), math.Nextafter(m, 1), -m} {
			check(x)
		}
	}
	for h := range 0x7f80 - 1 {
		a, b := float64(BFloat16ToFloat32(uint16(h))), float64(BFloat16ToFloat32(uint16(h+1)))
		m := (a + b) / 2
		for _, x := range []float64{m, math.Nextafter(m, 0), math.Nextafter(m, 1), -m} {
			check(x)
		}
	}
	for range 200000 {
		check(math.Ldexp(r.Float64()*2-1, r.IntN(300)-150))
	}
	for _, x := range []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1), math.NaN(), 65504, 65519.99, 65520, 1e-8, 2.98e-8, 5.96e-8, 1e300, -1e-300} {
		check(x)
	}
	// f32 to bf16 matches the usual bit trick on non-NaN values.
	for range 200000 {
		f := math.Float32frombits(r.Uint32())
		if f != f {
			continue
		}
		u := math.Float32bits(f)
		want := uint16((u + 0x7fff + (u>>16)&1) >> 16)
		if got := BFloat16Bits(float64(f)); got != want {
			t.Fatalf("bf16(%v) = %#04x, want %#04x", f, got, want)
		}
	}
}

func TestInt64ToFloat64Odd(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		v := int64(r.Uint64())
		if r.IntN(2) == 0 {
			v >>= r.IntN(63)
		}
		f := Int64ToFloat64Odd(v)
		// The correctly rounded float32, computed by the hardware, must
		// equal the rounding of the odd-rounded float64.
		if float32(f) != float32(v) {
			t.Fatalf("float32 of %d: %v via odd, %v direct", v, float32(f), float32(v))
		}
	}
	for _, v := range []int64{0, 1, -1, 1 << 53, 1<<53 + 1, math.MaxInt64, math.MinInt64} {
		if f := Int64ToFloat64Odd(v); float32(f) != float32(v) {
			t.Fatalf("float32 of %d: %v via odd, %v direct", v, float32(f), float32(v))
		}
	}
}

// TestFloat32ToHalf: the float32 conversions and the float64 ones agree
// wherever both apply.
func TestFloat32ToHalf(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	check := func(f float32) {
		t.Helper()
		if f != f {
			return
		}
		if a, b := Float32ToFloat16(f), Float16Bits(float64(f)); a != b {
			t.Fatalf("f16 of %v: Float32ToFloat16 %#04x, Float16Bits %#04x", f, a, b)
		}
		if a, b := Float32ToBFloat16(f), BFloat16Bits(float64(f)); a != b {
			t.Fatalf("bf16 of %v: Float32ToBFloat16 %#04x, BFloat16Bits %#04x", f, a, b)
		}
	}
	for range 1 << 20 {
		check(math.Float32frombits(r.Uint32()))
	}
	// Every float32 whose exponent is in or near the f16 range, sampled
	// densely near f16 rounding boundaries.
	for e := uint32(100); e < 146; e++ {
		for m := uint32(0); m < 1<<23; m += 0x7ff {
			for _, d := range []uint32{0, 1, 0xfff, 0x1000, 0x1001} {
				check(math.Float32frombits(e<<23 | (m+d)&0x7fffff))
				check(-math.Float32frombits(e<<23 | (m+d)&0x7fffff))
			}
		}
	}
}
