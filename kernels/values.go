package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// EncodeValues converts numbers to the little-endian bytes of dtype dt,
// rounding as a cast does (integers truncate toward zero and saturate at
// the type's range, bool is v != 0).
func EncodeValues(dt DType, v []float64) ([]byte, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	b := make([]byte, len(v)*dt.Size())
	for i, x := range v {
		PutValue(dt, b, i, x)
	}
	return b, nil
}

// DecodeValues converts little-endian bytes of dtype dt to numbers.
func DecodeValues(dt DType, b []byte) ([]float64, error) {
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	if len(b)%dt.Size() != 0 {
		return nil, fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrShape, len(b), dt)
	}
	v := make([]float64, len(b)/dt.Size())
	for i := range v {
		v[i] = Value(dt, b, i)
	}
	return v, nil
}

// Value reads element i of little-endian bytes b of dtype dt.
func Value(dt DType, b []byte, i int) float64 {
	switch dt {
	case Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	case Float64:
		return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	case Float16:
		return float64(Float16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case BFloat16:
		return float64(BFloat16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])))
	case Int32:
		return float64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	case Int64:
		return float64(int64(binary.LittleEndian.Uint64(b[8*i:])))
	case Uint8, Bool:
		return float64(b[i])
	}
	return math.NaN()
}

// PutValue writes x as element i of little-endian bytes b of dtype dt.
func PutValue(dt DType, b []byte, i int, x float64) {
	switch dt {
	case Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	case Float64:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	case Float16:
		binary.LittleEndian.PutUint16(b[2*i:], Float16Bits(x))
	case BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], BFloat16Bits(x))
	case Int32:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(saturate(x, math.MinInt32, math.MaxInt32))))
	case Int64:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(saturateInt64(x)))
	case Uint8:
		b[i] = uint8(saturate(x, 0, math.MaxUint8))
	case Bool:
		if x != 0 {
			b[i] = 1
		} else {
			b[i] = 0
		}
	}
}

func saturate(x, lo, hi float64) float64 {
	switch {
	case math.IsNaN(x):
		return 0
	case x < lo:
		return lo
	case x > hi:
		return hi
	}
	return math.Trunc(x)
}

func saturateInt64(x float64) int64 {
	switch {
	case math.IsNaN(x):
		return 0
	case x <= math.MinInt64:
		return math.MinInt64
	case x >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(x)
}

// Float32ToBFloat16 rounds to nearest even; NaN stays NaN.
func Float32ToBFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// BFloat16ToFloat32 is exact.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToFloat16 rounds to nearest even, overflowing to infinity and
// flushing below the smallest subnormal to zero; NaN stays NaN.
func Float32ToFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xff
	man := u & 0x7fffff
	switch {
	case exp == 0xff:
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15:
		return sign | 0x7c00
	case exp-127 >= -14:
		e := uint32(exp-127+15) << 10
		m := man >> 13
		h := e | m
		rem := man & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && m&1 == 1) {
			h++
		}
		return sign | uint16(h)
	case exp-127 >= -25:
		man |= 0x800000
		shift := uint32(-14-(exp-127)) + 13
		m := man >> shift
		rem := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	return sign
}

// Float16ToFloat32 is exact.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / (1 << 24)
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}
