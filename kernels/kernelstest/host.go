package kernelstest

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// host is a tensor held by the suite: float dtypes in f, integer and bool
// dtypes in i, one element per entry, row-major.
type host struct {
	dt    kernels.DType
	shape []int
	f     []float64
	i     []int64
}

func newHost(dt kernels.DType, shape []int) *host {
	h := &host{dt: dt, shape: slices.Clone(shape)}
	n := kernels.Numel(shape)
	if dt.IsFloat() {
		h.f = make([]float64, n)
	} else {
		h.i = make([]int64, n)
	}
	return h
}

func (h *host) meta() kernels.Meta { return kernels.Meta{DType: h.dt, Shape: slices.Clone(h.shape)} }

func (h *host) numel() int { return kernels.Numel(h.shape) }

// at is element j as a float64 (exact for floats and for integers up to
// 2^53).
func (h *host) at(j int) float64 {
	if h.f != nil {
		return h.f[j]
	}
	return float64(h.i[j])
}

func (h *host) String() string {
	return fmt.Sprintf("%v%v", h.dt, h.shape)
}

// encode returns h as little-endian bytes.
func (h *host) encode() []byte {
	n := h.numel()
	b := make([]byte, n*h.dt.Size())
	for j := range n {
		switch h.dt {
		case kernels.Float32:
			binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(float32(h.f[j])))
		case kernels.Float64:
			binary.LittleEndian.PutUint64(b[8*j:], math.Float64bits(h.f[j]))
		case kernels.Float16:
			binary.LittleEndian.PutUint16(b[2*j:], f16Bits(h.f[j]))
		case kernels.BFloat16:
			binary.LittleEndian.PutUint16(b[2*j:], bf16Bits(h.f[j]))
		case kernels.Int32:
			binary.LittleEndian.PutUint32(b[4*j:], uint32(h.i[j]))
		case kernels.Int64:
			binary.LittleEndian.PutUint64(b[8*j:], uint64(h.i[j]))
		case kernels.Uint8, kernels.Bool:
			b[j] = byte(h.i[j])
		}
	}
	return b
}

// decode reads a tensor of dtype dt and shape from little-endian bytes. A
// bool byte other than 0 or 1 decodes as -1, which no reference produces.
func decode(dt kernels.DType, shape []int, b []byte) *host {
	h := newHost(dt, shape)
	for j := range h.numel() {
		switch dt {
		case kernels.Float32:
			h.f[j] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:])))
		case kernels.Float64:
			h.f[j] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*j:]))
		case kernels.Float16:
			h.f[j] = f16Value(binary.LittleEndian.Uint16(b[2*j:]))
		case kernels.BFloat16:
			h.f[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*j:])) << 16))
		case kernels.Int32:
			h.i[j] = int64(int32(binary.LittleEndian.Uint32(b[4*j:])))
		case kernels.Int64:
			h.i[j] = int64(binary.LittleEndian.Uint64(b[8*j:]))
		case kernels.Uint8:
			h.i[j] = int64(b[j])
		case kernels.Bool:
			h.i[j] = int64(b[j])
			if b[j] > 1 {
				h.i[j] = -1
			}
		}
	}
	return h
}

// Independent of kernels' own conversions, so the suite checks them.

// f16Value decodes binary16 bits.
func f16Value(b uint16) float64 {
	s := 1.0
	if b&0x8000 != 0 {
		s = -1
	}
	e, m := int(b>>10&0x1f), float64(b&0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return math.Inf(int(s))
	case 0:
		return s * math.Ldexp(m, -24)
	}
	return s * math.Ldexp(1+m/1024, e-15)
}

// roundTo rounds x to a binary format with man stored significand bits,
// least normal exponent emin and largest finite value top, half to even.
func roundTo(x float64, man, emin int, top float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return x
	}
	_, e := math.Frexp(math.Abs(x))
	e = max(e-1, emin)
	ulp := math.Ldexp(1, e-man)
	r := math.RoundToEven(math.Abs(x)/ulp) * ulp
	if r > top {
		r = math.Inf(1)
	}
	return math.Copysign(r, x)
}

const (
	f16Max  = 65504
	bf16Max = 3.3895313892515355e38
)

func roundF16(x float64) float64  { return roundTo(x, 10, -14, f16Max) }
func roundBF16(x float64) float64 { return roundTo(x, 7, -126, bf16Max) }

// f16Bits encodes a value already representable in binary16.
func f16Bits(x float64) uint16 {
	var s uint16
	if math.Signbit(x) {
		s = 0x8000
	}
	a := math.Abs(x)
	switch {
	case math.IsNaN(x):
		return 0x7e00
	case math.IsInf(x, 0):
		return s | 0x7c00
	case a < math.Ldexp(1, -14):
		return s | uint16(a*(1<<24))
	}
	_, e := math.Frexp(a) // a = f * 2^e, f in [0.5, 1)
	m := math.Ldexp(a, 1-e) - 1
	return s | uint16(e-1+15)<<10 | uint16(m*1024)
}

// bf16Bits encodes a value already representable in bfloat16.
func bf16Bits(x float64) uint16 {
	if math.IsNaN(x) {
		return 0x7fc0
	}
	return uint16(math.Float32bits(float32(x)) >> 16)
}

// roundFloat rounds x to float dtype dt.
func roundFloat(x float64, dt kernels.DType) float64 {
	switch dt {
	case kernels.Float32:
		return float64(float32(x))
	case kernels.Float16:
		return roundF16(x)
	case kernels.BFloat16:
		return roundBF16(x)
	}
	return x
}

// intToFloat converts v exactly rounded to float dtype dt.
func intToFloat(v int64, dt kernels.DType) float64 {
	prec := map[kernels.DType]uint{kernels.Float64: 53, kernels.Float32: 24, kernels.Float16: 11, kernels.BFloat16: 8}[dt]
	f, _ := new(big.Float).SetPrec(prec).SetMode(big.ToNearestEven).SetInt64(v).Float64()
	switch {
	case dt == kernels.Float16 && math.Abs(f) > f16Max:
		return math.Copysign(math.Inf(1), f)
	case dt == kernels.BFloat16 && math.Abs(f) > bf16Max:
		return math.Copysign(math.Inf(1), f)
	}
	return f
}

// intRange is the range of integer dtype dt.
func intRange(dt kernels.DType) (lo, hi int64) {
	switch dt {
	case kernels.Int32:
		return math.MinInt32, math.MaxInt32
	case kernels.Int64:
		return math.MinInt64, math.MaxInt64
	case kernels.Uint8:
		return 0, math.MaxUint8
	case kernels.Bool:
		return 0, 1
	}
	panic("not an integer dtype")
}

// wrap reduces v to integer dtype dt as two's complement arithmetic does.
func wrap(v int64, dt kernels.DType) int64 {
	switch dt {
	case kernels.Int32:
		return int64(int32(v))
	case kernels.Uint8:
		return int64(uint8(v))
	case kernels.Bool:
		if v != 0 {
			return 1
		}
		return 0
	}
	return v
}

// floatToInt is the cast of x to integer dtype dt: truncation toward zero,
// saturating, NaN giving 0; bool is x != 0.
func floatToInt(x float64, dt kernels.DType) int64 {
	if dt == kernels.Bool {
		if x != 0 {
			return 1
		}
		return 0
	}
	if math.IsNaN(x) {
		return 0
	}
	lo, hi := intRange(dt)
	t := math.Trunc(x)
	switch {
	case t <= float64(lo):
		return lo
	case t >= float64(hi):
		return hi
	}
	return int64(t)
}

// fromFloat64 makes a host tensor of dtype dt from float64 values as the
// cast op would convert them.
func fromFloat64(dt kernels.DType, shape []int, v []float64) *host {
	h := newHost(dt, shape)
	for j, x := range v {
		if dt.IsFloat() {
			h.f[j] = roundFloat(x, dt)
		} else {
			h.i[j] = floatToInt(x, dt)
		}
	}
	return h
}

// dist is how random elements are drawn.
type dist int

const (
	distAny  dist = iota // nonzero, both signs, magnitudes about 0.05 to 2
	distPos              // positive, 0.1 to 4
	distUnit             // within (-1, 1), nonzero
)

// random draws a tensor of dtype dt; integers are small and nonzero
// (u8 and bool nonnegative), floats are rounded to dt.
func random(r *rand.Rand, dt kernels.DType, shape []int, d dist) *host {
	h := newHost(dt, shape)
	for j := range h.numel() {
		switch {
		case dt.IsFloat():
			var x float64
			switch d {
			case distPos:
				x = 0.1 + 3.9*r.Float64()
			case distUnit:
				x = (0.02 + 0.97*r.Float64()) * sign(r)
			default:
				x = (0.05 + 1.95*r.Float64()) * sign(r)
			}
			h.f[j] = roundFloat(x, dt)
		case dt == kernels.Bool:
			h.i[j] = int64(r.IntN(2))
		case dt == kernels.Uint8:
			h.i[j] = 1 + r.Int64N(30)
		default:
			v := 1 + r.Int64N(20)
			if d == distAny && r.IntN(2) == 0 {
				v = -v
			}
			h.i[j] = v
		}
	}
	return h
}

func sign(r *rand.Rand) float64 {
	if r.IntN(2) == 0 {
		return -1
	}
	return 1
}

// specials are the float values mixed into inputs to test NaN, infinity
// and signed-zero handling.
var specials = []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1)}

// sprinkle overwrites a few elements of a float tensor with specials,
// leaving most of it ordinary; integer extremes for integer tensors.
func sprinkle(r *rand.Rand, h *host) {
	n := h.numel()
	if n == 0 {
		return
	}
	for k := range min(n/4+1, 8) {
		j := r.IntN(n)
		if h.f != nil {
			h.f[j] = specials[k%len(specials)]
		} else if h.dt != kernels.Bool {
			lo, hi := intRange(h.dt)
			h.i[j] = []int64{lo, hi, 0, lo + 1, hi - 1}[k%5]
		}
	}
}
