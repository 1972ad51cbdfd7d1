package kernels

import (
	"fmt"
	"slices"
)

// Op is one operation with its attributes. Which attributes matter depends
// on Name; Infer checks them.
type Op struct {
	Name string

	Shape    []int // full, zeros, ones, reshape, uniform, normal, bernoulli, expand
	Axes     []int // reductions (empty means all axes), flip, squeeze, unsqueeze, layer_norm, rms_norm
	Keepdims bool  // reductions
	Perm     []int // permute
	DType    DType // cast and the creation ops, one_hot (Invalid means Float32)

	Value             float64 // full, pad
	Start, Stop, Step float64 // arange; Start and Stop also linspace
	Low, High         float64 // uniform
	Mean, Std         float64 // normal

	// Axis is the axis softmax and log_softmax normalise over, and the axis
	// of concat, stack, split, gather, scatter_add and index_select;
	// negative values count from the end, so -1 is the last axis.
	Axis int
	// Correction is subtracted from the element count in var's divisor:
	// 0 gives the population variance, 1 the sample variance. It may not
	// be negative.
	Correction int

	// Starts, Ends and Steps are slice's per-axis bounds and strides, as in
	// Python's basic slicing: negative values count from the end, bounds are
	// clamped to the axis, and axes past the end of a list take their
	// defaults (start 0, end the axis length and step 1; with a negative
	// step, start at the last element and end before the first). A step may
	// not be 0.
	Starts, Ends, Steps []int
	// Pads is pad's widths, one pair per axis: before0, after0, before1,
	// after1, ... Pad writes Value in the new elements.
	Pads []int
	// Sizes is split's output sizes along Axis; they sum to its length.
	Sizes []int
	// K is the diagonal offset of tril, triu and eye: 0 is the main
	// diagonal, positive above it, negative below.
	K int
	// Depth is one_hot's number of classes.
	Depth int
	// Eps is added to the variance of layer_norm and rms_norm, and to
	// adam_step's denominator.
	Eps float64
	// P is bernoulli's probability of a 1.
	P float64
	// Num is linspace's number of points.
	Num int
	// N and M are eye's rows and columns; M = 0 means N.
	N, M int

	// Stride, Padding and Dilation are the [h, w] window attributes of
	// conv2d, its gradients and the pools; empty means the default: stride
	// [1, 1] (the kernel for pools), padding [0, 0], dilation [1, 1].
	// Padding is zeros for conv2d and avg_pool2d, and never wins in
	// max_pool2d.
	Stride, Padding, Dilation []int
	// Groups splits conv2d's channels into groups convolved apart; 0 means 1.
	Groups int
	// Kernel is a pool's window [kh, kw]; pools require it.
	Kernel []int
	// Reduce is cross_entropy's reduction: "mean" (also ""), "sum" or "none".
	Reduce string

	// LR, Beta1, Beta2, WeightDecay, Decoupled and T are adam_step's
	// learning rate, moment decay rates (each in [0, 1)), weight decay
	// (added to the gradient, or with Decoupled applied to the parameter
	// as AdamW does) and step, counted from 1, for the bias corrections;
	// Eps is added to the denominator. sgd_step reads LR, WeightDecay,
	// Momentum, Dampening and Nesterov (which needs a momentum and no
	// dampening). Every value must be finite and, Dampening aside, not
	// negative.
	LR, Beta1, Beta2, WeightDecay float64
	Momentum, Dampening           float64
	Decoupled, Nesterov           bool
	T                             int

	// Seed and Key key the random generator: the session seed and the id of
	// the op's output tensor. See Random.
	Seed, Key uint64
}

// Limits bound what Infer accepts.
type Limits struct {
	MaxRank     int // dimensions per tensor
	MaxElements int // elements per tensor
}

// DefaultLimits: rank 8, 1<<30 elements (4 GiB of float32).
func DefaultLimits() Limits { return Limits{MaxRank: 8, MaxElements: 1 << 30} }

// Numel is the product of dims (1 for a scalar).
func Numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

type spec struct {
	arity int // -1: variadic, checked by infer
	infer func(op *Op, in []Meta) ([]Meta, error)
}

var specs = map[string]spec{}

func register(name string, arity int, infer func(op *Op, in []Meta) ([]Meta, error)) {
	specs[name] = spec{arity, infer}
}

// Known reports whether name is in the op set.
func Known(name string) bool { _, ok := specs[name]; return ok }

// OpNames lists the op set, sorted.
func OpNames() []string {
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Infer checks op against its inputs and returns the metas of its outputs.
// Errors wrap ErrUnknownOp, ErrArity, ErrShape, ErrDType, ErrAttr or
// ErrTooLarge and say what is wrong.
func Infer(op *Op, in []Meta, lim Limits) ([]Meta, error) {
	s, ok := specs[op.Name]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownOp, op.Name)
	}
	if s.arity >= 0 && len(in) != s.arity {
		return nil, fmt.Errorf("%w: %s takes %d, got %d", ErrArity, op.Name, s.arity, len(in))
	}
	out, err := s.infer(op, in)
	if err != nil {
		return nil, err
	}
	for _, m := range out {
		if err := CheckShape(m.Shape, lim); err != nil {
			return nil, fmt.Errorf("%s output: %w", op.Name, err)
		}
	}
	return out, nil
}

// CheckShape checks a shape against lim: no negative dims, rank and element
// count within the limits. Errors wrap ErrShape or ErrTooLarge.
func CheckShape(shape []int, lim Limits) error {
	if lim.MaxRank > 0 && len(shape) > lim.MaxRank {
		return fmt.Errorf("%w: rank %d over the limit %d", ErrTooLarge, len(shape), lim.MaxRank)
	}
	n := 1
	for i, d := range shape {
		if d < 0 {
			return fmt.Errorf("%w: dimension %d is negative (%d)", ErrShape, i, d)
		}
		if d != 0 && n > (1<<62)/d {
			return fmt.Errorf("%w: element count overflows", ErrTooLarge)
		}
		n *= d
	}
	if lim.MaxElements > 0 && n > lim.MaxElements {
		return fmt.Errorf("%w: %d elements over the limit %d", ErrTooLarge, n, lim.MaxElements)
	}
	return nil
}

// BroadcastShapes returns the numpy broadcast of a and b.
func BroadcastShapes(a, b []int) ([]int, error) {
	n := max(len(a), len(b))
	out := make([]int, n)
	for i := range n {
		da, db := 1, 1
		if j := len(a) - n + i; j >= 0 {
			da = a[j]
		}
		if j := len(b) - n + i; j >= 0 {
			db = b[j]
		}
		switch {
		case da == db, db == 1:
			out[i] = da
		case da == 1:
			out[i] = db
		default:
			return nil, fmt.Errorf("%w: shapes %v and %v do not broadcast (dim %d: %d vs %d)", ErrShape, a, b, i, da, db)
		}
	}
	return out, nil
}

// NormAxes turns possibly negative axes into sorted unique axes of a
// rank-r tensor; nil or empty means every axis.
func NormAxes(axes []int, r int) ([]int, error) {
	if len(axes) == 0 {
		all := make([]int, r)
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	seen := make([]bool, r)
	out := make([]int, 0, len(axes))
	for _, a := range axes {
		if a < -r || a >= r {
			return nil, fmt.Errorf("%w: axis %d out of range for rank %d", ErrAttr, a, r)
		}
		if a < 0 {
			a += r
		}
		if seen[a] {
			return nil, fmt.Errorf("%w: axis %d repeated", ErrAttr, a)
		}
		seen[a] = true
		out = append(out, a)
	}
	slices.Sort(out)
	return out, nil
}

// ReduceShape is the shape of reducing shape over normalised axes.
func ReduceShape(shape, axes []int, keepdims bool) []int {
	out := make([]int, 0, len(shape))
	for i, d := range shape {
		if slices.Contains(axes, i) {
			if keepdims {
				out = append(out, 1)
			}
			continue
		}
		out = append(out, d)
	}
	return out
}

func outDType(op *Op) (DType, error) {
	if op.DType == Invalid {
		return Float32, nil
	}
	if !op.DType.Valid() {
		return Invalid, fmt.Errorf("%w: %v", ErrDType, op.DType)
	}
	return op.DType, nil
}

func requireFloat(name string, in ...Meta) error {
	for i, m := range in {
		if !m.DType.IsFloat() {
			return fmt.Errorf("%w: %s input %d is %v, want a float dtype", ErrDType, name, i, m.DType)
		}
	}
	return nil
}

func requireNumeric(name string, in ...Meta) error {
	for i, m := range in {
		if m.DType == Bool || !m.DType.Valid() {
			return fmt.Errorf("%w: %s input %d is %v, want a numeric dtype", ErrDType, name, i, m.DType)
		}
	}
	return nil
}

func requireLogical(name string, in ...Meta) error {
	for i, m := range in {
		if m.DType != Bool && !m.DType.IsInt() {
			return fmt.Errorf("%w: %s input %d is %v, want bool or an integer dtype", ErrDType, name, i, m.DType)
		}
	}
	return nil
}

func sameDType(name string, in ...Meta) error {
	for i := 1; i < len(in); i++ {
		if in[i].DType != in[0].DType {
			return fmt.Errorf("%w: %s inputs are %v and %v; cast one first", ErrDType, name, in[0].DType, in[i].DType)
		}
	}
	return nil
}

// Clone returns a copy of op that shares no memory with it.
func (op *Op) Clone() Op {
	c := *op
	for _, s := range []*[]int{&c.Shape, &c.Axes, &c.Perm, &c.Starts, &c.Ends, &c.Steps, &c.Pads, &c.Sizes, &c.Stride, &c.Padding, &c.Dilation, &c.Kernel} {
		if *s != nil {
			*s = append([]int{}, (*s)...)
		}
	}
	return c
}
