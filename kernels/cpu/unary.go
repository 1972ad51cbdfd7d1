package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

type float interface{ ~float32 | ~float64 }

type integer interface{ ~int32 | ~int64 | ~uint8 }

type number interface{ float | integer }

// A unary op: fast is a loop written out for the cheap ones; fn, in
// float64, serves every float dtype of the others; cost is its price in
// cheap element operations, for split.
type unaryOp struct {
	name string
	fn   func(float64) float64
	cost int
}

func init() {
	for _, u := range []unaryOp{
		{kernels.OpNeg, func(x float64) float64 { return -x }, 1},
		{kernels.OpRelu, relu, 1},
		{kernels.OpAbs, math.Abs, 1},
		{kernels.OpSign, sign, 1},
		{kernels.OpSqrt, math.Sqrt, 2},
		{kernels.OpRsqrt, func(x float64) float64 { return 1 / math.Sqrt(x) }, 3},
		{kernels.OpReciprocal, func(x float64) float64 { return 1 / x }, 2},
		{kernels.OpFloor, math.Floor, 2},
		{kernels.OpCeil, math.Ceil, 2},
		{kernels.OpRound, math.RoundToEven, 2},
		{kernels.OpExp, math.Exp, 8},
		{kernels.OpExpm1, math.Expm1, 8},
		{kernels.OpLog, math.Log, 8},
		{kernels.OpLog1p, math.Log1p, 8},
		{kernels.OpSin, math.Sin, 8},
		{kernels.OpCos, math.Cos, 8},
		{kernels.OpTanh, math.Tanh, 12},
		{kernels.OpErf, math.Erf, 12},
		{kernels.OpSigmoid, sigmoid, 10},
		{kernels.OpSilu, func(x float64) float64 { return x * sigmoid(x) }, 10},
		{kernels.OpGelu, gelu, 14},
		{kernels.OpGeluTanh, geluTanh, 14},
		{kernels.OpNot, nil, 1},
	} {
		elementwise[u.name] = true
		fusedCost[u.name] = u.cost
		def(func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
			return b.unary(u, op, in, out)
		}, 1, u.name)
	}
	elementwise[kernels.OpIsNaN] = true
	fusedCost[kernels.OpIsNaN] = 1
	def(execIsNaN, 1, kernels.OpIsNaN)
}

func relu(x float64) float64 {
	if x < 0 {
		return 0
	}
	return x
}

// sign is -1, 0 or 1, and NaN for NaN.
func sign(x float64) float64 {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return x // ±0, NaN
}

func sigmoid(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

func gelu(x float64) float64 { return 0.5 * x * (1 + math.Erf(x*(1/math.Sqrt2))) }

func geluTanh(x float64) float64 {
	const c = 0.7978845608028654 // sqrt(2/pi)
	return 0.5 * x * (1 + math.Tanh(c*(x+0.044715*x*x*x)))
}

func (b *Backend) unary(u unaryOp, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	if x.DType != y.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	n := x.Numel()
	if y.Numel() != n {
		return shapeErr(op, "input %v, output %v", x.Shape, y.Shape)
	}
	xd, yd := data(x), data(y)
	switch x.DType {
	case kernels.Float32:
		if u.fn == nil {
			return dtypeErr(op, "input", 0, x.DType)
		}
		unaryRun(u, view[float32](xd, n), view[float32](yd, n))
	case kernels.Float64:
		if u.fn == nil {
			return dtypeErr(op, "input", 0, x.DType)
		}
		unaryRun(u, view[float64](xd, n), view[float64](yd, n))
	case kernels.Int32:
		return unaryIntRun(u, op, view[int32](xd, n), view[int32](yd, n))
	case kernels.Int64:
		return unaryIntRun(u, op, view[int64](xd, n), view[int64](yd, n))
	case kernels.Uint8:
		return unaryIntRun(u, op, view[uint8](xd, n), view[uint8](yd, n))
	case kernels.Bool:
		if u.name != kernels.OpNot {
			return dtypeErr(op, "input", 0, x.DType)
		}
		x, y := xd[:n], yd[:n]
		for i, v := range x {
			y[i] = b2u(v == 0)
		}
	case kernels.Float16, kernels.BFloat16:
		if u.fn == nil {
			return dtypeErr(op, "input", 0, x.DType)
		}
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

func unaryRun[T float](u unaryOp, x, y []T) {
	n := len(y)
	if _, ok := any(y).([]float32); ok && (u.name == kernels.OpRelu || u.name == kernels.OpSign) {
		n /= vecGrain // on vectors (reluF32, signF32)
	}
	if w := split(n, u.cost); w > 1 {
		parallel(len(y), w, func(lo, hi int) { unaryFloat(u, x[lo:hi], y[lo:hi]) })
		return
	}
	unaryFloat(u, x, y)
}

func unaryFloat[T float](u unaryOp, x, y []T) {
	x = x[:len(y)]
	switch u.name {
	case kernels.OpNeg:
		for i, v := range x {
			y[i] = -v
		}
	case kernels.OpRelu:
		if x, ok := any(x).([]float32); ok {
			reluF32(x, any(y).([]float32))
			return
		}
		// max, not a branch: on data of random sign a branch is
		// mispredicted half the time. NaN stays NaN.
		for i, v := range x {
			y[i] = max(v, 0)
		}
	case kernels.OpAbs:
		for i, v := range x {
			y[i] = T(math.Abs(float64(v)))
		}
	case kernels.OpSqrt:
		for i, v := range x {
			y[i] = T(math.Sqrt(float64(v)))
		}
	case kernels.OpSign:
		if x, ok := any(x).([]float32); ok {
			signF32(x, any(y).([]float32))
			return
		}
		signFloat(x, y)
	default:
		f := u.fn
		for i, v := range x {
			y[i] = T(f(float64(v)))
		}
	}
}

// signFloat is sign on the bits, without branches that the data would
// mispredict (a relu's output is zero half the time): ±1 with x's sign
// bit, or x itself for ±0 (the magnitude bit below is 0) and NaN.
func signFloat[T float](x, y []T) {
	switch x := any(x).(type) {
	case []float32:
		y := any(y).([]float32)[:len(x)]
		for i, v := range x {
			u := math.Float32bits(v)
			a := u &^ (1 << 31)
			nz := uint32(-int32(a)) >> 31 // 1 unless a is 0
			r := u&(1<<31) | -nz&0x3f800000
			if a > 0x7f800000 {
				r = u
			}
			y[i] = math.Float32frombits(r)
		}
	case []float64:
		y := any(y).([]float64)[:len(x)]
		for i, v := range x {
			u := math.Float64bits(v)
			a := u &^ (1 << 63)
			nz := uint64(-int64(a)) >> 63
			r := u&(1<<63) | -nz&0x3ff0000000000000
			if a > 0x7ff0000000000000 {
				r = u
			}
			y[i] = math.Float64frombits(r)
		}
	}
}

func unaryIntRun[T integer](u unaryOp, op *kernels.Op, x, y []T) error {
	switch u.name {
	case kernels.OpNeg, kernels.OpRelu, kernels.OpAbs, kernels.OpSign, kernels.OpNot:
	default:
		return dtypeErr(op, "input", 0, dtypeOf[T]())
	}
	if w := split(len(y), u.cost); w > 1 {
		parallel(len(y), w, func(lo, hi int) { unaryInt(u, x[lo:hi], y[lo:hi]) })
		return nil
	}
	unaryInt(u, x, y)
	return nil
}

func unaryInt[T integer](u unaryOp, x, y []T) {
	x = x[:len(y)]
	switch u.name {
	case kernels.OpNeg:
		for i, v := range x {
			y[i] = -v
		}
	case kernels.OpRelu:
		for i, v := range x {
			y[i] = max(v, 0)
		}
	case kernels.OpAbs:
		for i, v := range x {
			if v < 0 {
				v = -v // wraps at the most negative value
			}
			y[i] = v
		}
	case kernels.OpSign:
		var zero T
		for i, v := range x {
			switch {
			case v > 0:
				y[i] = 1
			case v < 0:
				y[i] = zero - 1 // only signed types get here
			default:
				y[i] = 0
			}
		}
	case kernels.OpNot:
		for i, v := range x {
			y[i] = ^v
		}
	}
}

// execIsNaN writes x != x as bool.
func execIsNaN(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	if y.DType != kernels.Bool {
		return dtypeErr(op, "output", 0, y.DType)
	}
	n := x.Numel()
	if y.Numel() != n {
		return shapeErr(op, "input %v, output %v", x.Shape, y.Shape)
	}
	xd, yd := data(x), data(y)[:n]
	switch x.DType {
	case kernels.Float32:
		for i, v := range view[float32](xd, n) {
			yd[i] = b2u(v != v)
		}
	case kernels.Float64:
		for i, v := range view[float64](xd, n) {
			yd[i] = b2u(v != v)
		}
	case kernels.Float16:
		for i, h := range view[uint16](xd, n) {
			yd[i] = b2u(h&0x7fff > 0x7c00)
		}
	case kernels.BFloat16:
		for i, h := range view[uint16](xd, n) {
			yd[i] = b2u(h&0x7fff > 0x7f80)
		}
	case kernels.Int32, kernels.Int64, kernels.Uint8:
		clear(yd)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

// dtypeOf is the dtype of element type T.
func dtypeOf[T any]() kernels.DType {
	var z T
	switch any(z).(type) {
	case float32:
		return kernels.Float32
	case float64:
		return kernels.Float64
	case int32:
		return kernels.Int32
	case int64:
		return kernels.Int64
	case uint8:
		return kernels.Uint8
	}
	return kernels.Invalid
}
