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

	OpNeg  = "neg"
	OpExp  = "exp"
	OpLog  = "log"
	OpSqrt = "sqrt"
	OpRelu = "relu"
	OpTanh = "tanh"

	OpAdd = "add"
	OpSub = "sub"
	OpMul = "mul"
	OpDiv = "div"

	OpSum  = "sum"
	OpMean = "mean"
	OpMax  = "max"

	OpMatmul  = "matmul"
	OpReshape = "reshape"
	OpPermute = "permute"
	OpCast    = "cast"
)

// Unary lists the elementwise unary ops (float inputs, same meta out).
var Unary = []string{OpNeg, OpExp, OpLog, OpSqrt, OpRelu, OpTanh}

// Binary lists the elementwise binary ops with numpy broadcasting.
var Binary = []string{OpAdd, OpSub, OpMul, OpDiv}

// Reductions lists the reductions over axes.
var Reductions = []string{OpSum, OpMean, OpMax}

func init() {
	for _, name := range Unary {
		register(name, 1, inferUnary(name))
	}
	for _, name := range Binary {
		register(name, 2, inferBinary(name))
	}
	for _, name := range Reductions {
		register(name, 1, inferReduce(name))
	}
	register(OpFull, 0, inferCreate)
	register(OpUniform, 0, inferRandom)
	register(OpNormal, 0, inferRandom)
	register(OpArange, 0, inferArange)
	register(OpMatmul, 2, inferMatmul)
	register(OpReshape, 1, inferReshape)
	register(OpPermute, 1, inferPermute)
	register(OpCast, 1, inferCast)
}

func inferUnary(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		if name != OpNeg && name != OpRelu {
			if err := requireFloat(name, in...); err != nil {
				return nil, err
			}
		} else if err := requireNumeric(name, in...); err != nil {
			return nil, err
		}
		return []Meta{{DType: in[0].DType, Shape: slices.Clone(in[0].Shape)}}, nil
	}
}

func inferBinary(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		if err := requireNumeric(name, in...); err != nil {
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

func inferReduce(name string) func(*Op, []Meta) ([]Meta, error) {
	return func(op *Op, in []Meta) ([]Meta, error) {
		if err := requireNumeric(name, in...); err != nil {
			return nil, err
		}
		axes, err := NormAxes(op.Axes, len(in[0].Shape))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if name == OpMax {
			for _, a := range axes {
				if in[0].Shape[a] == 0 {
					return nil, fmt.Errorf("%w: max over empty axis %d", ErrShape, a)
				}
			}
		}
		return []Meta{{DType: in[0].DType, Shape: ReduceShape(in[0].Shape, axes, op.Keepdims)}}, nil
	}
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
