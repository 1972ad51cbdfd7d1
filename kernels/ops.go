package kernels

import (
	"fmt"
	"math"
	"slices"
)

// Op names. The op set and the attributes each op reads are documented in
// docs/PROTOCOL.md.
const (
	OpFull    = "full"
	OpArange  = "arange"
	OpUniform = "uniform"
	OpNormal  = "normal"

	OpNeg        = "neg"
	OpExp        = "exp"
	OpLog        = "log"
	OpSqrt       = "sqrt"
	OpRelu       = "relu"
	OpTanh       = "tanh"
	OpAbs        = "abs"
	OpSign       = "sign" // -1, 0 or 1; NaN stays NaN
	OpExpm1      = "expm1"
	OpLog1p      = "log1p"
	OpRsqrt      = "rsqrt"
	OpReciprocal = "reciprocal"
	OpSin        = "sin"
	OpCos        = "cos"
	OpSigmoid    = "sigmoid"
	OpGelu       = "gelu"      // x·Φ(x), with the error function
	OpGeluTanh   = "gelu_tanh" // the tanh approximation of gelu
	OpSilu       = "silu"      // x·sigmoid(x)
	OpErf        = "erf"
	OpFloor      = "floor"
	OpCeil       = "ceil"
	OpRound      = "round" // half to even
	OpNot        = "not"   // logical on bool, bitwise on integers
	OpIsNaN      = "isnan" // bool result

	OpAdd     = "add"
	OpSub     = "sub"
	OpMul     = "mul"
	OpDiv     = "div" // integers: truncated toward zero, x/0 = 0
	OpPow     = "pow"
	OpMaximum = "maximum" // NaN if either is NaN
	OpMinimum = "minimum" // NaN if either is NaN
	OpMod     = "mod"     // floored: the result has the divisor's sign; integers: x mod 0 = 0
	OpAnd     = "and"     // logical on bool, bitwise on integers
	OpOr      = "or"
	OpXor     = "xor"

	OpEq = "eq" // comparisons: bool results; NaN compares unequal to everything
	OpNe = "ne"
	OpLt = "lt"
	OpLe = "le"
	OpGt = "gt"
	OpGe = "ge"

	OpWhere = "where" // where(cond, a, b): a where cond is true, else b
	OpClamp = "clamp" // clamp(x, lo, hi) = minimum(maximum(x, lo), hi)

	OpSum       = "sum"
	OpMean      = "mean"
	OpMax       = "max"
	OpMin       = "min"
	OpProd      = "prod"
	OpArgmax    = "argmax" // i64 index of the first largest, flattened over the axes; NaN counts as largest
	OpArgmin    = "argmin" // likewise; NaN counts as smallest
	OpLogsumexp = "logsumexp"
	OpVar       = "var" // divides by the count minus Correction

	OpSoftmax    = "softmax"     // over Axis
	OpLogSoftmax = "log_softmax" // over Axis

	OpMatmul  = "matmul"
	OpReshape = "reshape"
	OpPermute = "permute"
	OpCast    = "cast"
)

// Unary lists the elementwise unary ops whose output has the input's meta.
// neg, relu, abs and sign take every numeric dtype, not takes bool and the
// integers, the others take float dtypes.
var Unary = []string{OpNeg, OpExp, OpLog, OpSqrt, OpRelu, OpTanh, OpAbs, OpSign, OpExpm1,
	OpLog1p, OpRsqrt, OpReciprocal, OpSin, OpCos, OpSigmoid, OpGelu, OpGeluTanh, OpSilu, OpErf,
	OpFloor, OpCeil, OpRound, OpNot}

// Binary lists the elementwise binary ops with numpy broadcasting whose
// output has the inputs' dtype. pow takes float dtypes; and, or and xor
// take bool and the integers; the others every numeric dtype.
var Binary = []string{OpAdd, OpSub, OpMul, OpDiv, OpPow, OpMaximum, OpMinimum, OpMod, OpAnd, OpOr, OpXor}

// Compare lists the comparisons: broadcasting binary ops on two inputs of
// any one dtype, with a bool result.
var Compare = []string{OpEq, OpNe, OpLt, OpLe, OpGt, OpGe}

// Reductions lists the reductions over axes. logsumexp and var take float
// dtypes, the others every numeric dtype; argmax and argmin give i64.
var Reductions = []string{OpSum, OpMean, OpMax, OpMin, OpProd, OpArgmax, OpArgmin, OpLogsumexp, OpVar}

func init() {
	for _, name := range Unary {
		register(name, 1, inferUnary(name))
	}
	for _, name := range Binary {
		register(name, 2, inferBinary(name))
	}
	for _, name := range Compare {
		register(name, 2, inferCompare)
	}
	for _, name := range Reductions {
		register(name, 1, inferReduce(name))
	}
	register(OpFull, 0, inferCreate)
	register(OpUniform, 0, inferRandom)
	register(OpNormal, 0, inferRandom)
	register(OpArange, 0, inferArange)
	register(OpIsNaN, 1, inferIsNaN)
	register(OpWhere, 3, inferWhere)
	register(OpClamp, 3, inferClamp)
	register(OpSoftmax, 1, inferSoftmax)
	register(OpLogSoftmax, 1, inferSoftmax)
	register(OpMatmul, 2, inferMatmul)
	register(OpReshape, 1, inferReshape)
	register(OpPermute, 1, inferPermute)
	register(OpCast, 1, inferCast)
}

func inferUnary(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		var err error
		switch name {
		case OpNeg, OpRelu, OpAbs, OpSign:
			err = requireNumeric(name, in...)
		case OpNot:
			err = requireLogical(name, in...)
		default:
			err = requireFloat(name, in...)
		}
		if err != nil {
			return nil, err
		}
		return []Meta{{DType: in[0].DType, Shape: slices.Clone(in[0].Shape)}}, nil
	}
}

func inferIsNaN(op *Op, in []Meta) ([]Meta, error) {
	if err := requireNumeric(op.Name, in...); err != nil {
		return nil, err
	}
	return []Meta{{DType: Bool, Shape: slices.Clone(in[0].Shape)}}, nil
}

func inferBinary(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		var err error
		switch name {
		case OpPow:
			err = requireFloat(name, in...)
		case OpAnd, OpOr, OpXor:
			err = requireLogical(name, in...)
		default:
			err = requireNumeric(name, in...)
		}
		if err != nil {
			return nil, err
		}
		if err := sameDType(name, in...); err != nil {
			return nil, err
		}
		shape, err := BroadcastShapes(in[0].Shape, in[1].Shape)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return []Meta{{DType: in[0].DType, Shape: shape}}, nil
	}
}

func inferCompare(op *Op, in []Meta) ([]Meta, error) {
	for i, m := range in {
		if !m.DType.Valid() {
			return nil, fmt.Errorf("%w: %s input %d is %v", ErrDType, op.Name, i, m.DType)
		}
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	shape, err := BroadcastShapes(in[0].Shape, in[1].Shape)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op.Name, err)
	}
	return []Meta{{DType: Bool, Shape: shape}}, nil
}

// broadcast3 is the broadcast of three shapes.
func broadcast3(name string, a, b, c []int) ([]int, error) {
	ab, err := BroadcastShapes(a, b)
	if err == nil {
		ab, err = BroadcastShapes(ab, c)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return ab, nil
}

func inferWhere(op *Op, in []Meta) ([]Meta, error) {
	if in[0].DType != Bool {
		return nil, fmt.Errorf("%w: where condition is %v, want bool", ErrDType, in[0].DType)
	}
	if !in[1].DType.Valid() {
		return nil, fmt.Errorf("%w: where input 1 is %v", ErrDType, in[1].DType)
	}
	if err := sameDType(op.Name, in[1:]...); err != nil {
		return nil, err
	}
	shape, err := broadcast3(op.Name, in[0].Shape, in[1].Shape, in[2].Shape)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[1].DType, Shape: shape}}, nil
}

func inferClamp(op *Op, in []Meta) ([]Meta, error) {
	if err := requireNumeric(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	shape, err := broadcast3(op.Name, in[0].Shape, in[1].Shape, in[2].Shape)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[0].DType, Shape: shape}}, nil
}

func inferReduce(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		var err error
		switch name {
		case OpLogsumexp, OpVar:
			err = requireFloat(name, in...)
		default:
			err = requireNumeric(name, in...)
		}
		if err != nil {
			return nil, err
		}
		if name == OpVar && op.Correction < 0 {
			return nil, fmt.Errorf("%w: var correction %d is negative", ErrAttr, op.Correction)
		}
		axes, err := NormAxes(op.Axes, len(in[0].Shape))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		switch name {
		case OpMax, OpMin, OpArgmax, OpArgmin:
			for _, a := range axes {
				if in[0].Shape[a] == 0 {
					return nil, fmt.Errorf("%w: %s over empty axis %d", ErrShape, name, a)
				}
			}
		}
		dt := in[0].DType
		if name == OpArgmax || name == OpArgmin {
			dt = Int64
		}
		return []Meta{{DType: dt, Shape: ReduceShape(in[0].Shape, axes, op.Keepdims)}}, nil
	}
}

func inferSoftmax(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if r := len(in[0].Shape); op.Axis < -r || op.Axis >= r {
		return nil, fmt.Errorf("%w: %s axis %d out of range for rank %d", ErrAttr, op.Name, op.Axis, r)
	}
	return []Meta{{DType: in[0].DType, Shape: slices.Clone(in[0].Shape)}}, nil
}

func inferCreate(op *Op, _ []Meta) ([]Meta, error) {
	dt, err := outDType(op)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: dt, Shape: slices.Clone(op.Shape)}}, nil
}

func inferRandom(op *Op, in []Meta) ([]Meta, error) {
	m, err := inferCreate(op, in)
	if err != nil {
		return nil, err
	}
	if !m[0].DType.IsFloat() {
		return nil, fmt.Errorf("%w: %s makes float tensors, not %v", ErrDType, op.Name, m[0].DType)
	}
	if op.Name == OpUniform && !(op.Low <= op.High) {
		return nil, fmt.Errorf("%w: uniform low %v above high %v", ErrAttr, op.Low, op.High)
	}
	if op.Name == OpNormal && !(op.Std >= 0) {
		return nil, fmt.Errorf("%w: normal std %v is negative", ErrAttr, op.Std)
	}
	return m, nil
}

// ArangeLen is the length of arange(start, stop, step).
func ArangeLen(start, stop, step float64) (int, error) {
	if step == 0 || math.IsNaN(step) || math.IsNaN(start) || math.IsNaN(stop) || math.IsInf(start, 0) || math.IsInf(stop, 0) {
		return 0, fmt.Errorf("%w: arange(%v, %v, %v)", ErrAttr, start, stop, step)
	}
	n := math.Ceil((stop - start) / step)
	if n <= 0 {
		return 0, nil
	}
	if n > 1<<40 {
		return 0, fmt.Errorf("%w: arange of %v elements", ErrTooLarge, n)
	}
	return int(n), nil
}

func inferArange(op *Op, _ []Meta) ([]Meta, error) {
	dt, err := outDType(op)
	if err != nil {
		return nil, err
	}
	n, err := ArangeLen(op.Start, op.Stop, op.Step)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: dt, Shape: []int{n}}}, nil
}

// MatmulShapes splits a matmul into batch shape and m, k, n. Operands of
// rank 1 are treated as numpy does (a row or a column vector, the unit
// dimension dropped from the result).
func MatmulShapes(a, b []int) (batch []int, m, k, n int, out []int, err error) {
	if len(a) == 0 || len(b) == 0 {
		return nil, 0, 0, 0, nil, fmt.Errorf("%w: matmul of a scalar", ErrShape)
	}
	aa, bb := a, b
	if len(a) == 1 {
		aa = []int{1, a[0]}
	}
	if len(b) == 1 {
		bb = []int{b[0], 1}
	}
	m, k = aa[len(aa)-2], aa[len(aa)-1]
	k2 := bb[len(bb)-2]
	n = bb[len(bb)-1]
	if k != k2 {
		return nil, 0, 0, 0, nil, fmt.Errorf("%w: matmul %v x %v: inner dimensions %d and %d differ", ErrShape, a, b, k, k2)
	}
	batch, err = BroadcastShapes(aa[:len(aa)-2], bb[:len(bb)-2])
	if err != nil {
		return nil, 0, 0, 0, nil, fmt.Errorf("matmul batch: %w", err)
	}
	out = slices.Clone(batch)
	if len(a) > 1 {
		out = append(out, m)
	}
	if len(b) > 1 {
		out = append(out, n)
	}
	return batch, m, k, n, out, nil
}

func inferMatmul(op *Op, in []Meta) ([]Meta, error) {
	if err := requireNumeric(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	_, _, _, _, out, err := MatmulShapes(in[0].Shape, in[1].Shape)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

// ResolveReshape fills a single -1 in shape so that it holds n elements.
func ResolveReshape(shape []int, n int) ([]int, error) {
	out := slices.Clone(shape)
	hole, known := -1, 1
	for i, d := range out {
		switch {
		case d == -1 && hole < 0:
			hole = i
		case d < 0:
			return nil, fmt.Errorf("%w: reshape to %v", ErrShape, shape)
		default:
			known *= d
		}
	}
	if hole >= 0 {
		if known == 0 || n%known != 0 {
			return nil, fmt.Errorf("%w: cannot reshape %d elements to %v", ErrShape, n, shape)
		}
		out[hole] = n / known
		known *= out[hole]
	}
	if known != n {
		return nil, fmt.Errorf("%w: cannot reshape %d elements to %v", ErrShape, n, shape)
	}
	return out, nil
}

func inferReshape(op *Op, in []Meta) ([]Meta, error) {
	shape, err := ResolveReshape(op.Shape, in[0].Numel())
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[0].DType, Shape: shape}}, nil
}

func inferPermute(op *Op, in []Meta) ([]Meta, error) {
	r := len(in[0].Shape)
	if len(op.Perm) != r {
		return nil, fmt.Errorf("%w: permute of rank %d needs %d axes, got %v", ErrAttr, r, r, op.Perm)
	}
	seen := make([]bool, r)
	out := make([]int, r)
	for i, p := range op.Perm {
		if p < 0 {
			p += r
		}
		if p < 0 || p >= r || seen[p] {
			return nil, fmt.Errorf("%w: %v is not a permutation of %d axes", ErrAttr, op.Perm, r)
		}
		seen[p] = true
		out[i] = in[0].Shape[p]
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferCast(op *Op, in []Meta) ([]Meta, error) {
	if !op.DType.Valid() {
		return nil, fmt.Errorf("%w: cast needs a target dtype", ErrAttr)
	}
	return []Meta{{DType: op.DType, Shape: slices.Clone(in[0].Shape)}}, nil
}
