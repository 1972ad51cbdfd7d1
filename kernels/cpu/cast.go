package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execCast, 1, kernels.OpCast)
	def(execReshape, 1, kernels.OpReshape)
	elementwise[kernels.OpCast] = true
	elementwise[kernels.OpReshape] = true
}

func execReshape(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	if x.DType != y.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	if x.Numel() != y.Numel() {
		return shapeErr(op, "input %v, output %v", x.Shape, y.Shape)
	}
	xd, yd := data(x), data(y)
	if len(yd) > 0 && &xd[0] == &yd[0] {
		return nil
	}
	parallelCopy(yd, xd)
	return nil
}

// parallelCopy copies src to dst, across cores when it is large.
func parallelCopy(dst, src []byte) {
	const grain = 1 << 20
	n := len(dst)
	if n < 4*grain {
		copy(dst, src)
		return
	}
	parallel(n, split(n/grain, parallelMin), func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
}

func execCast(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	n := x.Numel()
	if y.Numel() != n {
		return shapeErr(op, "input %v, output %v", x.Shape, y.Shape)
	}
	castBytes(data(y), y.DType, data(x), x.DType, n)
	return nil
}

// castChunk is how many elements a cast converts through its stack buffer
// at a time.
const castChunk = 256

// castBytes converts n elements of dtype from in src to dtype to in dst.
// The conversions are the cast op's: floats to floats round to nearest
// even; floats to integers truncate toward zero and saturate, NaN giving
// 0; integers to narrower integers wrap; anything to bool is x != 0.
func castBytes(dst []byte, to kernels.DType, src []byte, from kernels.DType, n int) {
	if n == 0 {
		return
	}
	if from == to || (from == kernels.Bool && to == kernels.Uint8) {
		if from == kernels.Bool {
			castRange(dst, to, src, from, 0, n)
			return
		}
		parallelCopy(dst[:n*to.Size()], src[:n*from.Size()])
		return
	}
	if w := split(n, 4); w > 1 {
		parallel(n, w, func(lo, hi int) { castRange(dst, to, src, from, lo, hi) })
		return
	}
	castRange(dst, to, src, from, 0, n)
}

func castRange(dst []byte, to kernels.DType, src []byte, from kernels.DType, lo, hi int) {
	// Fast paths for the common float conversions.
	switch {
	case from == kernels.Float16 && to == kernels.Float32:
		s, d := view[uint16](src, hi)[lo:], view[float32](dst, hi)[lo:]
		for i, h := range s {
			d[i] = kernels.Float16ToFloat32(h)
		}
		return
	case from == kernels.BFloat16 && to == kernels.Float32:
		s, d := view[uint16](src, hi)[lo:], view[uint32](dst, hi)[lo:]
		for i, h := range s {
			d[i] = uint32(h) << 16
		}
		return
	case from == kernels.Float32 && to == kernels.Float16:
		s, d := view[float32](src, hi)[lo:], view[uint16](dst, hi)[lo:]
		for i, v := range s {
			d[i] = kernels.Float16Bits(float64(v))
		}
		return
	case from == kernels.Float32 && to == kernels.BFloat16:
		s, d := view[float32](src, hi)[lo:], view[uint16](dst, hi)[lo:]
		for i, v := range s {
			d[i] = bf16FromF32(v)
		}
		return
	case from == kernels.Float32 && to == kernels.Float64:
		s, d := view[float32](src, hi)[lo:], view[float64](dst, hi)[lo:]
		for i, v := range s {
			d[i] = float64(v)
		}
		return
	case from == kernels.Float64 && to == kernels.Float32:
		s, d := view[float64](src, hi)[lo:], view[float32](dst, hi)[lo:]
		for i, v := range s {
			d[i] = float32(v)
		}
		return
	}
	var fb [castChunk]float64
	var ib [castChunk]int64
	for c := lo; c < hi; c += castChunk {
		e := min(c+castChunk, hi)
		if from.IsFloat() {
			f := fb[:e-c]
			loadFloat(f, src, from, c, e)
			storeFloat(dst, to, f, c, e)
		} else {
			v := ib[:e-c]
			loadInt(v, src, from, c, e)
			storeInt(dst, to, v, c, e)
		}
	}
}

// bf16FromF32 rounds f to bfloat16, half to even; NaN stays a quiet NaN.
func bf16FromF32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16)&0x8000 | 0x7fc0
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}

// loadFloat reads elements [lo, hi) of a float dtype as float64.
func loadFloat(f []float64, src []byte, dt kernels.DType, lo, hi int) {
	switch dt {
	case kernels.Float32:
		for i, v := range view[float32](src, hi)[lo:] {
			f[i] = float64(v)
		}
	case kernels.Float64:
		copy(f, view[float64](src, hi)[lo:])
	case kernels.Float16:
		for i, h := range view[uint16](src, hi)[lo:] {
			f[i] = float64(kernels.Float16ToFloat32(h))
		}
	case kernels.BFloat16:
		for i, h := range view[uint16](src, hi)[lo:] {
			f[i] = float64(kernels.BFloat16ToFloat32(h))
		}
	}
}

// loadInt reads elements [lo, hi) of an integer or bool dtype as int64.
func loadInt(v []int64, src []byte, dt kernels.DType, lo, hi int) {
	switch dt {
	case kernels.Int32:
		for i, x := range view[int32](src, hi)[lo:] {
			v[i] = int64(x)
		}
	case kernels.Int64:
		copy(v, view[int64](src, hi)[lo:])
	case kernels.Uint8:
		for i, x := range src[lo:hi] {
			v[i] = int64(x)
		}
	case kernels.Bool:
		for i, x := range src[lo:hi] {
			v[i] = int64(b2u(x != 0))
		}
	}
}

// storeFloat writes float64 values as elements [lo, hi) of dtype dt.
func storeFloat(dst []byte, dt kernels.DType, f []float64, lo, hi int) {
	switch dt {
	case kernels.Float32:
		d := view[float32](dst, hi)[lo:]
		for i, x := range f {
			d[i] = float32(x)
		}
	case kernels.Float64:
		copy(view[float64](dst, hi)[lo:], f)
	case kernels.Float16:
		d := view[uint16](dst, hi)[lo:]
		for i, x := range f {
			d[i] = kernels.Float16Bits(x)
		}
	case kernels.BFloat16:
		d := view[uint16](dst, hi)[lo:]
		for i, x := range f {
			d[i] = kernels.BFloat16Bits(x)
		}
	case kernels.Int32:
		d := view[int32](dst, hi)[lo:]
		for i, x := range f {
			d[i] = int32(satInt(x, math.MinInt32, math.MaxInt32))
		}
	case kernels.Int64:
		d := view[int64](dst, hi)[lo:]
		for i, x := range f {
			d[i] = satInt(x, math.MinInt64, math.MaxInt64)
		}
	case kernels.Uint8:
		d := dst[lo:hi]
		for i, x := range f {
			d[i] = uint8(satInt(x, 0, math.MaxUint8))
		}
	case kernels.Bool:
		d := dst[lo:hi]
		for i, x := range f {
			d[i] = b2u(x != 0)
		}
	}
}

// storeInt writes int64 values as elements [lo, hi) of dtype dt.
func storeInt(dst []byte, dt kernels.DType, v []int64, lo, hi int) {
	switch dt {
	case kernels.Float32:
		d := view[float32](dst, hi)[lo:]
		for i, x := range v {
			d[i] = float32(x)
		}
	case kernels.Float64:
		d := view[float64](dst, hi)[lo:]
		for i, x := range v {
			d[i] = float64(x)
		}
	case kernels.Float16:
		d := view[uint16](dst, hi)[lo:]
		for i, x := range v {
			d[i] = kernels.Float16Bits(kernels.Int64ToFloat64Odd(x))
		}
	case kernels.BFloat16:
		d := view[uint16](dst, hi)[lo:]
		for i, x := range v {
			d[i] = kernels.BFloat16Bits(kernels.Int64ToFloat64Odd(x))
		}
	case kernels.Int32:
		d := view[int32](dst, hi)[lo:]
		for i, x := range v {
			d[i] = int32(x)
		}
	case kernels.Int64:
		copy(view[int64](dst, hi)[lo:], v)
	case kernels.Uint8:
		d := dst[lo:hi]
		for i, x := range v {
			d[i] = uint8(x)
		}
	case kernels.Bool:
		d := dst[lo:hi]
		for i, x := range v {
			d[i] = b2u(x != 0)
		}
	}
}

// satInt truncates x toward zero and clamps it to [lo, hi]; NaN is 0.
func satInt(x float64, lo, hi int64) int64 {
	switch {
	case x != x:
		return 0
	case x <= float64(lo):
		return lo
	case x >= float64(hi):
		return hi
	}
	return int64(x)
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
