package nn

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// The ops below enqueue one op of the op set (docs/PROTOCOL.md) each,
// after checking it with shape inference; elementwise binary ops
// broadcast as numpy does. They never fail at once: a tensor that cannot
// be computed carries the error (see Tensor.Err), and so does everything
// computed from it.

func op1(name string, x *Tensor) *Tensor { return apply(&opDesc{k: kernels.Op{Name: name}}, x) }
func op2(name string, a, b *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: name}}, a, b)
}

// Elementwise unary ops.
func Neg(x *Tensor) *Tensor        { return op1(kernels.OpNeg, x) }
func Exp(x *Tensor) *Tensor        { return op1(kernels.OpExp, x) }
func Log(x *Tensor) *Tensor        { return op1(kernels.OpLog, x) }
func Sqrt(x *Tensor) *Tensor       { return op1(kernels.OpSqrt, x) }
func Rsqrt(x *Tensor) *Tensor      { return op1(kernels.OpRsqrt, x) }
func Reciprocal(x *Tensor) *Tensor { return op1(kernels.OpReciprocal, x) }
func Relu(x *Tensor) *Tensor       { return op1(kernels.OpRelu, x) }
func Gelu(x *Tensor) *Tensor       { return op1(kernels.OpGelu, x) }
func GeluTanh(x *Tensor) *Tensor   { return op1(kernels.OpGeluTanh, x) }
func Silu(x *Tensor) *Tensor       { return op1(kernels.OpSilu, x) }
func Sigmoid(x *Tensor) *Tensor    { return op1(kernels.OpSigmoid, x) }
func Tanh(x *Tensor) *Tensor       { return op1(kernels.OpTanh, x) }
func Abs(x *Tensor) *Tensor        { return op1(kernels.OpAbs, x) }
func Sin(x *Tensor) *Tensor        { return op1(kernels.OpSin, x) }
func Cos(x *Tensor) *Tensor        { return op1(kernels.OpCos, x) }
func Erf(x *Tensor) *Tensor        { return op1(kernels.OpErf, x) }
func Expm1(x *Tensor) *Tensor      { return op1(kernels.OpExpm1, x) }
func Log1p(x *Tensor) *Tensor      { return op1(kernels.OpLog1p, x) }

// Ops without a gradient (their gradient is zero almost everywhere, or
// their result is not a float): tensors they make never require one.
func Sign(x *Tensor) *Tensor  { return op1(kernels.OpSign, x) }
func Floor(x *Tensor) *Tensor { return op1(kernels.OpFloor, x) }
func Ceil(x *Tensor) *Tensor  { return op1(kernels.OpCeil, x) }
func Round(x *Tensor) *Tensor { return op1(kernels.OpRound, x) }
func Not(x *Tensor) *Tensor   { return op1(kernels.OpNot, x) }
func IsNaN(x *Tensor) *Tensor { return op1(kernels.OpIsNaN, x) }

// Elementwise binary ops, with broadcasting.
func Add(a, b *Tensor) *Tensor     { return op2(kernels.OpAdd, a, b) }
func Sub(a, b *Tensor) *Tensor     { return op2(kernels.OpSub, a, b) }
func Mul(a, b *Tensor) *Tensor     { return op2(kernels.OpMul, a, b) }
func Div(a, b *Tensor) *Tensor     { return op2(kernels.OpDiv, a, b) }
func Pow(a, b *Tensor) *Tensor     { return op2(kernels.OpPow, a, b) }
func Maximum(a, b *Tensor) *Tensor { return op2(kernels.OpMaximum, a, b) }
func Minimum(a, b *Tensor) *Tensor { return op2(kernels.OpMinimum, a, b) }
func Mod(a, b *Tensor) *Tensor     { return op2(kernels.OpMod, a, b) }
func And(a, b *Tensor) *Tensor     { return op2(kernels.OpAnd, a, b) }
func Or(a, b *Tensor) *Tensor      { return op2(kernels.OpOr, a, b) }
func Xor(a, b *Tensor) *Tensor     { return op2(kernels.OpXor, a, b) }

// Comparisons, with broadcasting: bool results.
func Eq(a, b *Tensor) *Tensor { return op2(kernels.OpEq, a, b) }
func Ne(a, b *Tensor) *Tensor { return op2(kernels.OpNe, a, b) }
func Lt(a, b *Tensor) *Tensor { return op2(kernels.OpLt, a, b) }
func Le(a, b *Tensor) *Tensor { return op2(kernels.OpLe, a, b) }
func Gt(a, b *Tensor) *Tensor { return op2(kernels.OpGt, a, b) }
func Ge(a, b *Tensor) *Tensor { return op2(kernels.OpGe, a, b) }

// Where is a where cond (bool) is true, else b, with broadcasting.
func Where(cond, a, b *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpWhere}}, cond, a, b)
}

// Clamp is minimum(maximum(x, lo), hi), with broadcasting.
func Clamp(x, lo, hi *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpClamp}}, x, lo, hi)
}

// Scalar is a scalar tensor of x's dtype and session holding v.
func Scalar(x *Tensor, v float64) *Tensor {
	if x == nil {
		return failed(nil, fmt.Errorf("%w: Scalar of a nil tensor", ErrInvalidArgument))
	}
	if x.err != nil {
		return x
	}
	return Full(x.s, x.meta.DType, nil, v)
}

// AddScalar is x + v.
func AddScalar(x *Tensor, v float64) *Tensor { return Add(x, Scalar(x, v)) }

// ScalarMul is x · v.
func ScalarMul(x *Tensor, v float64) *Tensor { return Mul(x, Scalar(x, v)) }

// PowScalar is x raised to the power p.
func PowScalar(x *Tensor, p float64) *Tensor { return Pow(x, Scalar(x, p)) }

// Square is x · x.
func Square(x *Tensor) *Tensor { return Mul(x, x) }

func reduce(name string, x *Tensor, axes []int, keepdims bool) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: name, Axes: slices.Clone(axes), Keepdims: keepdims}}, x)
}

// Reductions over axes (nil or empty: every axis), keeping them as size 1
// when keepdims.
func Sum(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpSum, x, axes, keepdims)
}
func Mean(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpMean, x, axes, keepdims)
}
func Max(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpMax, x, axes, keepdims)
}
func Min(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpMin, x, axes, keepdims)
}
func Prod(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpProd, x, axes, keepdims)
}
func Logsumexp(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpLogsumexp, x, axes, keepdims)
}

// Argmax and Argmin are the i64 index of the first largest (smallest)
// element, flattened over axes.
func Argmax(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpArgmax, x, axes, keepdims)
}
func Argmin(x *Tensor, axes []int, keepdims bool) *Tensor {
	return reduce(kernels.OpArgmin, x, axes, keepdims)
}

// Var is the variance over axes, dividing by the count minus correction
// (0: population, 1: sample).
func Var(x *Tensor, axes []int, correction int, keepdims bool) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpVar, Axes: slices.Clone(axes), Keepdims: keepdims, Correction: correction}}, x)
}

// Softmax normalises exp(x) over axis (-1: the last).
func Softmax(x *Tensor, axis int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpSoftmax, Axis: axis}}, x)
}

// LogSoftmax is log(softmax(x)) over axis, computed stably.
func LogSoftmax(x *Tensor, axis int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpLogSoftmax, Axis: axis}}, x)
}

// Matmul is the matrix product, batched over leading dims with
// broadcasting; rank-1 operands are a row (a) or a column (b) vector whose
// unit dimension is dropped from the result, as in numpy.
func Matmul(a, b *Tensor) *Tensor { return op2(kernels.OpMatmul, a, b) }

// Reshape gives x a new shape with the same elements; one dim may be -1.
func Reshape(x *Tensor, shape ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpReshape, Shape: slices.Clone(shape)}}, x)
}

// Flatten reshapes x to [d0, ..., d(axis-1), rest]: the axes from axis on
// (negative: counted from the end) become one.
func Flatten(x *Tensor, axis int) *Tensor {
	if x == nil || x.err != nil {
		return op1(kernels.OpReshape, x)
	}
	r := len(x.meta.Shape)
	a, err := kernels.NormAxis("flatten", axis, r)
	if err != nil {
		return failed(x.s, fmt.Errorf("nn: flatten of %v: %w", x, err))
	}
	shape := append(slices.Clone(x.meta.Shape[:a]), kernels.Numel(x.meta.Shape[a:]))
	return Reshape(x, shape...)
}

// Permute reorders the axes: output axis i is input axis perm[i].
func Permute(x *Tensor, perm ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpPermute, Perm: slices.Clone(perm)}}, x)
}

// Transpose swaps axes a and b (negative values count from the end).
func Transpose(x *Tensor, a, b int) *Tensor {
	if x == nil || x.err != nil {
		return op1(kernels.OpPermute, x)
	}
	r := len(x.meta.Shape)
	ia, err := kernels.NormAxis("transpose", a, r)
	if err == nil {
		b, err = kernels.NormAxis("transpose", b, r)
	}
	if err != nil {
		return failed(x.s, fmt.Errorf("nn: transpose of %v: %w", x, err))
	}
	perm := make([]int, r)
	for i := range perm {
		perm[i] = i
	}
	perm[ia], perm[b] = perm[b], perm[ia]
	return Permute(x, perm...)
}

// Expand broadcasts x to shape.
func Expand(x *Tensor, shape ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpExpand, Shape: slices.Clone(shape)}}, x)
}

// Slice takes x[starts:ends:steps] per axis, with Python's rules:
// negative values count from the end, bounds clamp, and axes past the end
// of a list take their defaults.
func Slice(x *Tensor, starts, ends, steps []int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpSlice, Starts: slices.Clone(starts), Ends: slices.Clone(ends), Steps: slices.Clone(steps)}}, x)
}

// Pad widens x by pads (before0, after0, before1, after1, ... one pair per
// axis), writing value in the new elements.
func Pad(x *Tensor, pads []int, value float64) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpPad, Pads: slices.Clone(pads), Value: value}}, x)
}

// Concat joins xs along axis.
func Concat(axis int, xs ...*Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpConcat, Axis: axis}}, xs...)
}

// Stack joins xs, all of one shape, along a new axis.
func Stack(axis int, xs ...*Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpStack, Axis: axis}}, xs...)
}

// Split cuts x along axis into pieces of sizes, which sum to the axis.
func Split(x *Tensor, axis int, sizes ...int) []*Tensor {
	n := max(len(sizes), 1)
	return applyIn(nil, &opDesc{k: kernels.Op{Name: kernels.OpSplit, Axis: axis, Sizes: slices.Clone(sizes)}}, n, x)
}

// Flip reverses x along axes (none: every axis).
func Flip(x *Tensor, axes ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpFlip, Axes: slices.Clone(axes)}}, x)
}

// Squeeze drops unit axes (none: every unit axis).
func Squeeze(x *Tensor, axes ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpSqueeze, Axes: slices.Clone(axes)}}, x)
}

// Unsqueeze inserts unit axes at positions axes of the output.
func Unsqueeze(x *Tensor, axes ...int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpUnsqueeze, Axes: slices.Clone(axes)}}, x)
}

// Gather picks x's elements along axis at index (i32 or i64, x's rank):
// out[i][j][k] = x[index[i][j][k]][j][k] for axis 0.
func Gather(x *Tensor, axis int, index *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpGather, Axis: axis}}, x, index)
}

// IndexSelect takes the slices of x along axis at the positions in index
// (a vector).
func IndexSelect(x *Tensor, axis int, index *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpIndexSelect, Axis: axis}}, x, index)
}

// ScatterAdd is x with src added at index along axis (the inverse of
// Gather): out[index[i][j][k]][j][k] += src[i][j][k] for axis 0.
func ScatterAdd(x *Tensor, axis int, index, src *Tensor) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpScatterAdd, Axis: axis}}, x, index, src)
}

// OneHot is index's classes as one-hot vectors of depth, of dtype dt.
func OneHot(index *Tensor, depth int, dt kernels.DType) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpOneHot, Depth: depth, DType: dt}}, index)
}

// Tril keeps the elements on and below diagonal k of the last two axes.
func Tril(x *Tensor, k int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpTril, K: k}}, x)
}

// Triu keeps the elements on and above diagonal k of the last two axes.
func Triu(x *Tensor, k int) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpTriu, K: k}}, x)
}

// DefaultEps is the eps of LayerNorm and RMSNorm when 0 is given.
const DefaultEps = 1e-5

func norm(name string, x, weight, bias *Tensor, axes []int, eps float64) *Tensor {
	if eps == 0 {
		eps = DefaultEps
	}
	in := []*Tensor{x}
	switch {
	case bias != nil && weight == nil:
		if x == nil || x.err != nil {
			return op1(name, x)
		}
		weight = Ones(x.s, x.meta.DType, nil)
		fallthrough
	case bias != nil:
		in = append(in, weight, bias)
	case weight != nil:
		in = append(in, weight)
	}
	return apply(&opDesc{k: kernels.Op{Name: name, Axes: slices.Clone(axes), Eps: eps}}, in...)
}

// LayerNorm normalises x over its trailing axes (nil: the last) to zero
// mean and unit variance (population variance plus eps; 0 means
// DefaultEps), then scales by weight and adds bias, which broadcast to x;
// either may be nil.
func LayerNorm(x, weight, bias *Tensor, axes []int, eps float64) *Tensor {
	return norm(kernels.OpLayerNorm, x, weight, bias, axes, eps)
}

// RMSNorm is x / sqrt(mean(x²) + eps) over its trailing axes, times weight
// plus bias (either may be nil).
func RMSNorm(x, weight, bias *Tensor, axes []int, eps float64) *Tensor {
	return norm(kernels.OpRMSNorm, x, weight, bias, axes, eps)
}

// Cast converts x to dt.
func Cast(x *Tensor, dt kernels.DType) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpCast, DType: dt}}, x)
}

// Methods for chains such as x.Matmul(w).Add(b).Relu().

func (t *Tensor) Add(u *Tensor) *Tensor     { return Add(t, u) }
func (t *Tensor) Sub(u *Tensor) *Tensor     { return Sub(t, u) }
func (t *Tensor) Mul(u *Tensor) *Tensor     { return Mul(t, u) }
func (t *Tensor) Div(u *Tensor) *Tensor     { return Div(t, u) }
func (t *Tensor) Pow(u *Tensor) *Tensor     { return Pow(t, u) }
func (t *Tensor) Maximum(u *Tensor) *Tensor { return Maximum(t, u) }
func (t *Tensor) Minimum(u *Tensor) *Tensor { return Minimum(t, u) }
func (t *Tensor) Matmul(u *Tensor) *Tensor  { return Matmul(t, u) }
func (t *Tensor) Neg() *Tensor              { return Neg(t) }
func (t *Tensor) Exp() *Tensor              { return Exp(t) }
func (t *Tensor) Log() *Tensor              { return Log(t) }
func (t *Tensor) Sqrt() *Tensor             { return Sqrt(t) }
func (t *Tensor) Rsqrt() *Tensor            { return Rsqrt(t) }
func (t *Tensor) Relu() *Tensor             { return Relu(t) }
func (t *Tensor) Gelu() *Tensor             { return Gelu(t) }
func (t *Tensor) Silu() *Tensor             { return Silu(t) }
func (t *Tensor) Sigmoid() *Tensor          { return Sigmoid(t) }
func (t *Tensor) Tanh() *Tensor             { return Tanh(t) }
func (t *Tensor) Abs() *Tensor              { return Abs(t) }
func (t *Tensor) AddScalar(v float64) *Tensor {
	return AddScalar(t, v)
}
func (t *Tensor) ScalarMul(v float64) *Tensor { return ScalarMul(t, v) }
func (t *Tensor) Sum(axes []int, keepdims bool) *Tensor {
	return Sum(t, axes, keepdims)
}
func (t *Tensor) Mean(axes []int, keepdims bool) *Tensor {
	return Mean(t, axes, keepdims)
}
func (t *Tensor) Max(axes []int, keepdims bool) *Tensor {
	return Max(t, axes, keepdims)
}
func (t *Tensor) Reshape(shape ...int) *Tensor  { return Reshape(t, shape...) }
func (t *Tensor) Permute(perm ...int) *Tensor   { return Permute(t, perm...) }
func (t *Tensor) Transpose(a, b int) *Tensor    { return Transpose(t, a, b) }
func (t *Tensor) Expand(shape ...int) *Tensor   { return Expand(t, shape...) }
func (t *Tensor) Cast(dt kernels.DType) *Tensor { return Cast(t, dt) }
func (t *Tensor) Softmax(axis int) *Tensor      { return Softmax(t, axis) }
func (t *Tensor) LogSoftmax(axis int) *Tensor   { return LogSoftmax(t, axis) }
