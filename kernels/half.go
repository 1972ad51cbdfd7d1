package kernels

import (
	"math"
	"math/bits"
)

// Float16Bits returns the IEEE 754 binary16 value nearest x, rounding half
// to even, as its bits. Values beyond the largest finite f16 round to
// infinity as IEEE 754 says; NaN becomes a quiet NaN with x's sign. The
// rounding is done once, from x, so Float16Bits(float64(f)) for a float32 f
// is the correctly rounded conversion of f too, as Float32ToFloat16 is.
func Float16Bits(x float64) uint16 { return uint16(roundFloat64(x, 5, 10)) }

// BFloat16Bits returns the bfloat16 value nearest x, rounding half to even,
// as its bits; see Float16Bits.
func BFloat16Bits(x float64) uint16 { return uint16(roundFloat64(x, 8, 7)) }

// roundFloat64 rounds x to a binary format with expBits exponent bits and
// manBits stored significand bits (at most 16 bits in all), half to even.
func roundFloat64(x float64, expBits, manBits uint) uint64 {
	b := math.Float64bits(x)
	sign := (b >> 63) << (expBits + manBits)
	exp := int((b >> 52) & 0x7ff)
	man := b & (1<<52 - 1)
	expMax := uint64(1)<<expBits - 1
	inf := sign | expMax<<manBits
	if exp == 0x7ff {
		if man != 0 {
			return inf | 1<<(manBits-1) // quiet NaN
		}
		return inf
	}
	if exp == 0 {
		return sign // float64 subnormals are far below the smallest half
	}
	bias := 1<<(expBits-1) - 1
	e := exp - 1023
	if e > bias {
		return inf
	}
	sig := man | 1<<52
	var shift uint
	var top uint64
	if e >= 1-bias { // normal in the target
		shift = 52 - manBits
		top = uint64(e+bias) << manBits
		sig = man
	} else { // subnormal in the target: units of 2^(1-bias-manBits)
		s := int(52-manBits) + (1 - bias - e)
		if s > 54 {
			return sign
		}
		shift = uint(s)
	}
	r := sig >> shift
	rem := sig & (1<<shift - 1)
	half := uint64(1) << (shift - 1)
	if rem > half || rem == half && r&1 == 1 {
		r++ // a carry into the exponent, up to infinity, is the right result
	}
	return sign | (top + r)
}

// Int64ToFloat64Odd converts v to float64 rounding to odd: the result is v
// truncated toward zero with its last bit set when bits were lost. A later
// rounding of it to any format of at most 51 significand bits (float32, f16,
// bf16) then equals the correctly rounded conversion of v.
func Int64ToFloat64Odd(v int64) float64 {
	u := uint64(v)
	if v < 0 {
		u = -u
	}
	if u < 1<<53 {
		return float64(v)
	}
	drop := 64 - bits.LeadingZeros64(u) - 53
	m := u >> drop
	if m<<drop != u {
		m |= 1
	}
	f := math.Ldexp(float64(m), drop)
	if v < 0 {
		f = -f
	}
	return f
}
