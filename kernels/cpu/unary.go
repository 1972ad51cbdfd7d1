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
		{kernels.OpSqrt, math.Sqrt, 2},
		{kernels.OpExp, math.Exp, 8},
		{kernels.OpLog, math.Log, 8},
		{kernels.OpTanh, math.Tanh, 12},
	} {
		elementwise[u.name] = true
		def(func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
			return b.unary(u, op, in, out)
		}, 1, u.name)
	}
}

func relu(x float64) float64 {
	if x < 0 {
		return 0
	}
	return x
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
		unaryRun(u, view[float32](xd, n), view[float32](yd, n))
	case kernels.Float64:
		unaryRun(u, view[float64](xd, n), view[float64](yd, n))
	case kernels.Int32:
		return unaryIntRun(u, op, view[int32](xd, n), view[int32](yd, n))
	case kernels.Int64:
		return unaryIntRun(u, op, view[int64](xd, n), view[int64](yd, n))
	case kernels.Uint8:
		return unaryIntRun(u, op, view[uint8](xd, n), view[uint8](yd, n))
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

func unaryRun[T float](u unaryOp, x, y []T) {
	if w := split(len(y), u.cost); w > 1 {
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
		for i, v := range x {
			if v < 0 {
				v = 0
			}
			y[i] = v
		}
	case kernels.OpSqrt:
		for i, v := range x {
			y[i] = T(math.Sqrt(float64(v)))
		}
	default:
		f := u.fn
		for i, v := range x {
			y[i] = T(f(float64(v)))
		}
	}
}

func unaryIntRun[T integer](u unaryOp, op *kernels.Op, x, y []T) error {
	switch u.name {
	case kernels.OpNeg, kernels.OpRelu:
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
	}
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
