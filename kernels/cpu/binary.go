package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

// kern2 computes len(y) elements of a binary op over a run in mode m; for
// a scalar operand only element 0 of its slice is read.
type kern2[T, U any] func(y []U, a, b []T, m mode)

// binKernels are the kernels of one binary op, per dtype; nil where the op
// does not take the dtype.
type binKernels struct {
	f32 kern2[float32, float32]
	f64 kern2[float64, float64]
	i32 kern2[int32, int32]
	i64 kern2[int64, int64]
	u8  kern2[uint8, uint8]
	b8  kern2[uint8, uint8] // bool
	// vec32: f32 runs same-shaped runs on vectors (see vecGrain).
	vec32 bool
}

// cmpKernels are the kernels of one comparison, per dtype (bool as u8).
type cmpKernels struct {
	f32 kern2[float32, uint8]
	f64 kern2[float64, uint8]
	i32 kern2[int32, uint8]
	i64 kern2[int64, uint8]
	u8  kern2[uint8, uint8]
}

func init() {
	for name, k := range map[string]binKernels{
		kernels.OpAdd:     {addF32, addK[float64], addK[int32], addK[int64], addK[uint8], nil, true},
		kernels.OpSub:     {subF32, subK[float64], subK[int32], subK[int64], subK[uint8], nil, true},
		kernels.OpMul:     {mulF32, mulK[float64], mulK[int32], mulK[int64], mulK[uint8], nil, true},
		kernels.OpDiv:     {divF32, divK[float64], idivK[int32], idivK[int64], idivK[uint8], nil, true},
		kernels.OpMaximum: {maxK[float32], maxK[float64], maxK[int32], maxK[int64], maxK[uint8], nil, false},
		kernels.OpMinimum: {minK[float32], minK[float64], minK[int32], minK[int64], minK[uint8], nil, false},
		kernels.OpPow:     {mapK(powf[float32]), mapK(powf[float64]), nil, nil, nil, nil, false},
		kernels.OpMod:     {mapK(fmod[float32]), mapK(fmod[float64]), mapK(imod[int32]), mapK(imod[int64]), mapK(imod[uint8]), nil, false},
		kernels.OpAnd:     {nil, nil, andK[int32], andK[int64], andK[uint8], landK[uint8], false},
		kernels.OpOr:      {nil, nil, orK[int32], orK[int64], orK[uint8], lorK[uint8], false},
		kernels.OpXor:     {nil, nil, xorK[int32], xorK[int64], xorK[uint8], lxorK[uint8], false},
	} {
		elementwise[name] = true
		def(func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
			return b.binary(k, op, in, out)
		}, 2, name)
	}
	for name, k := range map[string]cmpKernels{
		kernels.OpEq: {eqK[float32], eqK[float64], eqK[int32], eqK[int64], eqK[uint8]},
		kernels.OpNe: {neK[float32], neK[float64], neK[int32], neK[int64], neK[uint8]},
		kernels.OpLt: {ltK[float32], ltK[float64], ltK[int32], ltK[int64], ltK[uint8]},
		kernels.OpLe: {leK[float32], leK[float64], leK[int32], leK[int64], leK[uint8]},
		kernels.OpGt: {gtK[float32], gtK[float64], gtK[int32], gtK[int64], gtK[uint8]},
		kernels.OpGe: {geK[float32], geK[float64], geK[int32], geK[int64], geK[uint8]},
	} {
		def(func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
			return b.compare(k, op, in, out)
		}, 2, name)
	}
}

func (b *Backend) binary(k binKernels, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, z, y := in[0], in[1], out[0]
	if z.DType != x.DType {
		return dtypeErr(op, "input", 1, z.DType)
	}
	if y.DType != x.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	m, bc, err := plan2(op, x, z, y)
	if err != nil {
		return err
	}
	xd, zd, yd := data(x), data(z), data(y)
	nx, nz, n := x.Numel(), z.Numel(), y.Numel()
	switch x.DType {
	case kernels.Float32:
		grain := 1
		if k.vec32 {
			grain = vecGrain
		}
		return binaryRunGrain(op, k.f32, m, &bc, view[float32](yd, n), view[float32](xd, nx), view[float32](zd, nz), grain)
	case kernels.Float64:
		return binaryRun(op, k.f64, m, &bc, view[float64](yd, n), view[float64](xd, nx), view[float64](zd, nz))
	case kernels.Int32:
		return binaryRun(op, k.i32, m, &bc, view[int32](yd, n), view[int32](xd, nx), view[int32](zd, nz))
	case kernels.Int64:
		return binaryRun(op, k.i64, m, &bc, view[int64](yd, n), view[int64](xd, nx), view[int64](zd, nz))
	case kernels.Uint8:
		return binaryRun(op, k.u8, m, &bc, view[uint8](yd, n), view[uint8](xd, nx), view[uint8](zd, nz))
	case kernels.Bool:
		return binaryRun(op, k.b8, m, &bc, yd[:n], xd[:nx], zd[:nz])
	case kernels.Float16, kernels.BFloat16:
		if k.f32 == nil {
			return dtypeErr(op, "input", 0, x.DType)
		}
		return b.viaF32(op, in, out)
	}
	return dtypeErr(op, "input", 0, x.DType)
}

func (b *Backend) compare(k cmpKernels, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, z, y := in[0], in[1], out[0]
	if z.DType != x.DType {
		return dtypeErr(op, "input", 1, z.DType)
	}
	if y.DType != kernels.Bool {
		return dtypeErr(op, "output", 0, y.DType)
	}
	m, bc, err := plan2(op, x, z, y)
	if err != nil {
		return err
	}
	xd, zd, yd := data(x), data(z), data(y)
	nx, nz, n := x.Numel(), z.Numel(), y.Numel()
	switch x.DType {
	case kernels.Float32:
		return binaryRun(op, k.f32, m, &bc, yd[:n], view[float32](xd, nx), view[float32](zd, nz))
	case kernels.Float64:
		return binaryRun(op, k.f64, m, &bc, yd[:n], view[float64](xd, nx), view[float64](zd, nz))
	case kernels.Int32:
		return binaryRun(op, k.i32, m, &bc, yd[:n], view[int32](xd, nx), view[int32](zd, nz))
	case kernels.Int64:
		return binaryRun(op, k.i64, m, &bc, yd[:n], view[int64](xd, nx), view[int64](zd, nz))
	case kernels.Uint8, kernels.Bool:
		return binaryRun(op, k.u8, m, &bc, yd[:n], xd[:nx], zd[:nz])
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	}
	return dtypeErr(op, "input", 0, x.DType)
}

// plan2 picks how a binary op walks its operands: the common cases skip
// the broadcast plan (equal shapes, or a scalar and an operand shaped like
// the output); the others get one, in bc.
func plan2(op *kernels.Op, x, z, y *kernels.Tensor) (m mode, bc bcast, err error) {
	nx, nz := x.Numel(), z.Numel()
	switch {
	case sameShape(x.Shape, y.Shape) && sameShape(z.Shape, y.Shape):
		return vv, bc, nil
	case nz == 1 && len(z.Shape) <= len(y.Shape) && sameShape(x.Shape, y.Shape):
		return vs, bc, nil
	case nx == 1 && len(x.Shape) <= len(y.Shape) && sameShape(z.Shape, y.Shape):
		return sv, bc, nil
	}
	bc, ok := newBcast(y.Shape, x.Shape, z.Shape)
	if !ok {
		return walk, bc, shapeErr(op, "inputs %v and %v do not broadcast to output %v", x.Shape, z.Shape, y.Shape)
	}
	return walk, bc, nil
}

// binaryRun runs k over y in mode m, or over the broadcast bc if m is
// walk, in parallel when y is large.
func binaryRun[T, U any](op *kernels.Op, k kern2[T, U], m mode, bc *bcast, y []U, a, b []T) error {
	return binaryRunGrain(op, k, m, bc, y, a, b, 1)
}

// binaryRunGrain is binaryRun for a kernel that takes grain elements in
// the time of one cheap operation where its runs are same-shaped (vv).
func binaryRunGrain[T, U any](op *kernels.Op, k kern2[T, U], m mode, bc *bcast, y []U, a, b []T, grain int) error {
	if k == nil {
		return dtypeErr(op, "input", 0, dtypeOf[T]())
	}
	n := len(y)
	if n == 0 {
		return nil
	}
	flat := m
	if m == walk && bc.rank <= 1 { // one flat run after merging dims
		flat = bc.mode()
	}
	if flat != walk {
		if flat != vv {
			grain = 1
		}
		if w := split(n/grain, 1); w > 1 {
			sa, sb := b2i(flat == vv || flat == vs), b2i(flat == vv || flat == sv)
			parallel(n, w, func(lo, hi int) { k(y[lo:hi], a[lo*sa:], b[lo*sb:], flat) })
			return nil
		}
		k(y, a, b, flat)
		return nil
	}
	inner := bc.mode()
	if inner != vv {
		grain = 1
	}
	if w := split(n/grain, 1); w > 1 {
		bb := *bc // a copy, so that bc itself stays on the caller's stack
		parallel(n, w, func(lo, hi int) { binaryWalk(k, &bb, inner, y, a, b, lo, hi) })
		return nil
	}
	binaryWalk(k, bc, inner, y, a, b, 0, n)
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func binaryWalk[T, U any](k kern2[T, U], bc *bcast, m mode, y []U, a, b []T, lo, hi int) {
	bc.walk(lo, hi, func(o int, off [3]int, n int) {
		k(y[o:o+n], a[off[0]:], b[off[1]:], m)
	})
}

// fill sets every element of y to y[0].
func fill[T any](y []T) {
	if len(y) == 0 {
		return
	}
	v := y[0]
	for i := range y {
		y[i] = v
	}
}

func addK[T number](y, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] + b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] + s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s + b[i]
		}
	default:
		y[0] = a[0] + b[0]
		fill(y)
	}
}

func subK[T number](y, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] - b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] - s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s - b[i]
		}
	default:
		y[0] = a[0] - b[0]
		fill(y)
	}
}

func mulK[T number](y, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] * b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] * s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s * b[i]
		}
	default:
		y[0] = a[0] * b[0]
		fill(y)
	}
}

func divK[T float](y, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = a[i] / b[i]
		}
	case vs:
		a, s := a[:len(y)], b[0]
		for i := range y {
			y[i] = a[i] / s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = s / b[i]
		}
	default:
		y[0] = a[0] / b[0]
		fill(y)
	}
}

// idiv is integer division truncating toward zero, with x/0 = 0.
func idiv[T integer](a, b T) T {
	if b == 0 {
		return 0
	}
	return a / b
}

func idivK[T integer](y, a, b []T, m mode) {
	switch m {
	case vv:
		a, b := a[:len(y)], b[:len(y)]
		for i := range y {
			y[i] = idiv(a[i], b[i])
		}
	case vs:
		a, s := a[:len(y)], b[0]
		if s == 0 {
			clear(y)
			return
		}
		for i := range y {
			y[i] = a[i] / s
		}
	case sv:
		s, b := a[0], b[:len(y)]
		for i := range y {
			y[i] = idiv(s, b[i])
		}
	default:
		y[0] = idiv(a[0], b[0])
		fill(y)
	}
}

// mapK makes a kernel of an op given per element, for the ops that cost
// more than a call.
func mapK[T, U any](f func(a, b T) U) kern2[T, U] {
	return func(y []U, a, b []T, m mode) {
		switch m {
		case vv:
			a, b := a[:len(y)], b[:len(y)]
			for i := range y {
				y[i] = f(a[i], b[i])
			}
		case vs:
			a, s := a[:len(y)], b[0]
			for i := range y {
				y[i] = f(a[i], s)
			}
		case sv:
			s, b := a[0], b[:len(y)]
			for i := range y {
				y[i] = f(s, b[i])
			}
		default:
			y[0] = f(a[0], b[0])
			fill(y)
		}
	}
}

func powf[T float](a, b T) T { return T(math.Pow(float64(a), float64(b))) }

// fmod is the floored remainder: a - floor(a/b)*b, with b's sign.
func fmod[T float](a, b T) T {
	r := math.Mod(float64(a), float64(b))
	if r != 0 && (r < 0) != (b < 0) {
		r += float64(b)
	}
	return T(r)
}

// imod is the floored remainder of integers, with x mod 0 = 0.
func imod[T integer](a, b T) T {
	if b == 0 {
		return 0
	}
	r := a % b
	var zero T
	if r != 0 && (r < zero) != (b < zero) {
		r += b
	}
	return r
}
