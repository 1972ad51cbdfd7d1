package kernels

import (
	"fmt"
	"math"
	"slices"
)

// Movement, indexing, normalisation and creation ops beyond the first set.
// Their attributes are documented on Op and in docs/PROTOCOL.md.
const (
	OpExpand      = "expand"       // broadcast to Shape
	OpSlice       = "slice"        // Starts, Ends, Steps per axis
	OpPad         = "pad"          // Pads per axis, filled with Value
	OpConcat      = "concat"       // variadic, along Axis
	OpStack       = "stack"        // variadic, along a new Axis
	OpSplit       = "split"        // into Sizes along Axis: several outputs
	OpFlip        = "flip"         // reverse Axes (empty: all)
	OpSqueeze     = "squeeze"      // drop unit Axes (empty: all unit axes)
	OpUnsqueeze   = "unsqueeze"    // insert unit Axes, positions in the output
	OpGather      = "gather"       // gather(x, index) along Axis
	OpScatterAdd  = "scatter_add"  // scatter_add(x, index, src) along Axis
	OpIndexSelect = "index_select" // index_select(x, index) along Axis, index 1-D
	OpOneHot      = "one_hot"      // one_hot(index), Depth classes, DType
	OpTril        = "tril"         // keep elements on and below diagonal K
	OpTriu        = "triu"         // keep elements on and above diagonal K

	OpLayerNorm = "layer_norm" // layer_norm(x[, weight[, bias]]) over trailing Axes
	OpRMSNorm   = "rms_norm"   // rms_norm(x[, weight[, bias]]) over trailing Axes

	OpZeros     = "zeros"
	OpOnes      = "ones"
	OpLinspace  = "linspace"  // Num points from Start to Stop, both included
	OpEye       = "eye"       // N x M, ones on diagonal K
	OpBernoulli = "bernoulli" // 1 where UniformAt(seed, key, i, 0, 1) < P
)

// Movement lists the ops that move elements without arithmetic. They take
// every dtype (index inputs are i32 or i64).
var Movement = []string{OpExpand, OpSlice, OpPad, OpConcat, OpStack, OpSplit, OpFlip, OpSqueeze,
	OpUnsqueeze, OpGather, OpIndexSelect, OpTril, OpTriu}

// Indexing lists the ops whose index inputs are checked against the axis
// they index while running: an index i of an axis of length n must lie in
// [-n, n), negative values counting from the end, or Exec fails with an
// error wrapping ErrIndex. scatter_add takes numeric dtypes; one_hot makes
// any dtype from i32 or i64 classes.
var Indexing = []string{OpGather, OpScatterAdd, OpIndexSelect, OpOneHot}

// Norms lists the normalisations: float dtypes, over trailing axes.
var Norms = []string{OpLayerNorm, OpRMSNorm}

// Creation lists the creation ops beyond full, arange, uniform and normal.
// zeros, ones, eye and bernoulli make every dtype; linspace every numeric
// dtype.
var Creation = []string{OpZeros, OpOnes, OpLinspace, OpEye, OpBernoulli}

func init() {
	register(OpExpand, 1, inferExpand)
	register(OpSlice, 1, inferSlice)
	register(OpPad, 1, inferPad)
	register(OpConcat, -1, inferConcat)
	register(OpStack, -1, inferStack)
	register(OpSplit, 1, inferSplit)
	register(OpFlip, 1, inferFlip)
	register(OpSqueeze, 1, inferSqueeze)
	register(OpUnsqueeze, 1, inferUnsqueeze)
	register(OpGather, 2, inferGather)
	register(OpScatterAdd, 3, inferScatterAdd)
	register(OpIndexSelect, 2, inferIndexSelect)
	register(OpOneHot, 1, inferOneHot)
	register(OpTril, 1, inferTri)
	register(OpTriu, 1, inferTri)
	register(OpLayerNorm, -1, inferNorm)
	register(OpRMSNorm, -1, inferNorm)
	register(OpZeros, 0, inferCreate)
	register(OpOnes, 0, inferCreate)
	register(OpLinspace, 0, inferLinspace)
	register(OpEye, 0, inferEye)
	register(OpBernoulli, 0, inferBernoulli)
}

func same(m Meta) []Meta { return []Meta{{DType: m.DType, Shape: slices.Clone(m.Shape)}} }

func requireValid(name string, in ...Meta) error {
	for i, m := range in {
		if !m.DType.Valid() {
			return fmt.Errorf("%w: %s input %d is %v", ErrDType, name, i, m.DType)
		}
	}
	return nil
}

func requireIndex(name string, i int, m Meta) error {
	if m.DType != Int32 && m.DType != Int64 {
		return fmt.Errorf("%w: %s input %d is %v, want i32 or i64 indices", ErrDType, name, i, m.DType)
	}
	return nil
}

// NormAxis turns a possibly negative axis of a rank-r tensor into [0, r).
// Errors wrap ErrAttr.
func NormAxis(name string, axis, r int) (int, error) {
	if axis < -r || axis >= r {
		return 0, fmt.Errorf("%w: %s axis %d out of range for rank %d", ErrAttr, name, axis, r)
	}
	if axis < 0 {
		axis += r
	}
	return axis, nil
}

func inferExpand(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	shape, err := BroadcastShapes(in[0].Shape, op.Shape)
	if err != nil || !slices.Equal(shape, op.Shape) {
		return nil, fmt.Errorf("%w: expand of %v to %v", ErrShape, in[0].Shape, op.Shape)
	}
	return []Meta{{DType: in[0].DType, Shape: shape}}, nil
}

// SliceRanges resolves slice's attributes against shape: for each axis the
// first index taken, the step and the number taken. Errors wrap ErrAttr.
func SliceRanges(op *Op, shape []int) (start, step, n []int, err error) {
	r := len(shape)
	if len(op.Starts) > r || len(op.Ends) > r || len(op.Steps) > r {
		return nil, nil, nil, fmt.Errorf("%w: slice of rank %d with %d starts, %d ends, %d steps",
			ErrAttr, r, len(op.Starts), len(op.Ends), len(op.Steps))
	}
	start, step, n = make([]int, r), make([]int, r), make([]int, r)
	for i, d := range shape {
		st := 1
		if i < len(op.Steps) {
			st = op.Steps[i]
		}
		if st == 0 || st == math.MinInt {
			return nil, nil, nil, fmt.Errorf("%w: slice step %d on axis %d", ErrAttr, st, i)
		}
		// Python's PySlice_AdjustIndices.
		bound := func(v int) int {
			if v < 0 {
				v += d
				if v < 0 {
					v = 0
					if st < 0 {
						v = -1
					}
				}
			} else if v >= d {
				v = d
				if st < 0 {
					v = d - 1
				}
			}
			return v
		}
		var s, e int
		switch {
		case i < len(op.Starts):
			s = bound(op.Starts[i])
		case st > 0:
			s = 0
		default:
			s = d - 1
		}
		switch {
		case i < len(op.Ends):
			e = bound(op.Ends[i])
		case st > 0:
			e = d
		default:
			e = -1
		}
		cnt := 0
		if st > 0 && e > s {
			cnt = (e-s-1)/st + 1
		} else if st < 0 && s > e {
			cnt = (s-e-1)/-st + 1
		}
		start[i], step[i], n[i] = s, st, cnt
		if cnt == 0 {
			start[i] = 0
		}
	}
	return start, step, n, nil
}

func inferSlice(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	_, _, n, err := SliceRanges(op, in[0].Shape)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[0].DType, Shape: n}}, nil
}

func inferPad(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	r := len(in[0].Shape)
	if len(op.Pads) != 2*r {
		return nil, fmt.Errorf("%w: pad of rank %d needs %d widths, got %v", ErrAttr, r, 2*r, op.Pads)
	}
	out := make([]int, r)
	for i, d := range in[0].Shape {
		b, a := op.Pads[2*i], op.Pads[2*i+1]
		if b < 0 || a < 0 || b > 1<<40 || a > 1<<40 {
			return nil, fmt.Errorf("%w: pad widths %d, %d on axis %d", ErrAttr, b, a, i)
		}
		out[i] = d + b + a
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferConcat(op *Op, in []Meta) ([]Meta, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("%w: concat takes at least 1 input", ErrArity)
	}
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	r := len(in[0].Shape)
	axis, err := NormAxis(op.Name, op.Axis, r)
	if err != nil {
		return nil, err
	}
	out := slices.Clone(in[0].Shape)
	out[axis] = 0
	for i, m := range in {
		if len(m.Shape) != r {
			return nil, fmt.Errorf("%w: concat input %d has rank %d, input 0 rank %d", ErrShape, i, len(m.Shape), r)
		}
		for d := range r {
			if d != axis && m.Shape[d] != in[0].Shape[d] {
				return nil, fmt.Errorf("%w: concat input %d is %v, input 0 %v", ErrShape, i, m.Shape, in[0].Shape)
			}
		}
		if out[axis] > 1<<50 {
			return nil, fmt.Errorf("%w: concat along axis %d", ErrTooLarge, axis)
		}
		out[axis] += m.Shape[axis]
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferStack(op *Op, in []Meta) ([]Meta, error) {
	if len(in) == 0 {
		return nil, fmt.Errorf("%w: stack takes at least 1 input", ErrArity)
	}
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	for i, m := range in {
		if !slices.Equal(m.Shape, in[0].Shape) {
			return nil, fmt.Errorf("%w: stack input %d is %v, input 0 %v", ErrShape, i, m.Shape, in[0].Shape)
		}
	}
	r := len(in[0].Shape)
	axis, err := NormAxis(op.Name, op.Axis, r+1)
	if err != nil {
		return nil, err
	}
	out := slices.Insert(slices.Clone(in[0].Shape), axis, len(in))
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferSplit(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	axis, err := NormAxis(op.Name, op.Axis, len(in[0].Shape))
	if err != nil {
		return nil, err
	}
	if len(op.Sizes) == 0 {
		return nil, fmt.Errorf("%w: split needs sizes", ErrAttr)
	}
	d := in[0].Shape[axis]
	sum := 0
	out := make([]Meta, len(op.Sizes))
	for i, n := range op.Sizes {
		if n < 0 || n > d {
			return nil, fmt.Errorf("%w: split size %d of an axis of %d", ErrAttr, n, d)
		}
		sum += n
		sh := slices.Clone(in[0].Shape)
		sh[axis] = n
		out[i] = Meta{DType: in[0].DType, Shape: sh}
	}
	if sum != d {
		return nil, fmt.Errorf("%w: split sizes %v sum to %d, axis %d has %d", ErrAttr, op.Sizes, sum, axis, d)
	}
	return out, nil
}

func inferFlip(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	if _, err := NormAxes(op.Axes, len(in[0].Shape)); err != nil {
		return nil, fmt.Errorf("flip: %w", err)
	}
	return same(in[0]), nil
}

func inferSqueeze(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	shape := in[0].Shape
	out := make([]int, 0, len(shape))
	if len(op.Axes) == 0 {
		for _, d := range shape {
			if d != 1 {
				out = append(out, d)
			}
		}
		return []Meta{{DType: in[0].DType, Shape: out}}, nil
	}
	axes, err := NormAxes(op.Axes, len(shape))
	if err != nil {
		return nil, fmt.Errorf("squeeze: %w", err)
	}
	for i, d := range shape {
		if slices.Contains(axes, i) {
			if d != 1 {
				return nil, fmt.Errorf("%w: squeeze of axis %d of length %d", ErrShape, i, d)
			}
			continue
		}
		out = append(out, d)
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferUnsqueeze(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	if len(op.Axes) == 0 {
		return nil, fmt.Errorf("%w: unsqueeze needs axes", ErrAttr)
	}
	r := len(in[0].Shape) + len(op.Axes)
	if r > 64 {
		return nil, fmt.Errorf("%w: unsqueeze to rank %d", ErrTooLarge, r)
	}
	axes, err := NormAxes(op.Axes, r)
	if err != nil {
		return nil, fmt.Errorf("unsqueeze: %w", err)
	}
	out := make([]int, 0, r)
	src := in[0].Shape
	for i := range r {
		if slices.Contains(axes, i) {
			out = append(out, 1)
			continue
		}
		out = append(out, src[0])
		src = src[1:]
	}
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferGather(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in[0]); err != nil {
		return nil, err
	}
	if err := requireIndex(op.Name, 1, in[1]); err != nil {
		return nil, err
	}
	x, idx := in[0].Shape, in[1].Shape
	axis, err := NormAxis(op.Name, op.Axis, len(x))
	if err != nil {
		return nil, err
	}
	if len(idx) != len(x) {
		return nil, fmt.Errorf("%w: gather index %v and input %v differ in rank", ErrShape, idx, x)
	}
	for d := range x {
		if d != axis && idx[d] > x[d] {
			return nil, fmt.Errorf("%w: gather index %v exceeds input %v on axis %d", ErrShape, idx, x, d)
		}
	}
	return []Meta{{DType: in[0].DType, Shape: slices.Clone(idx)}}, nil
}

func inferScatterAdd(op *Op, in []Meta) ([]Meta, error) {
	if err := requireNumeric(op.Name, in[0], in[2]); err != nil {
		return nil, err
	}
	if err := requireIndex(op.Name, 1, in[1]); err != nil {
		return nil, err
	}
	if in[2].DType != in[0].DType {
		return nil, fmt.Errorf("%w: scatter_add source is %v, input %v", ErrDType, in[2].DType, in[0].DType)
	}
	x, idx, src := in[0].Shape, in[1].Shape, in[2].Shape
	axis, err := NormAxis(op.Name, op.Axis, len(x))
	if err != nil {
		return nil, err
	}
	if !slices.Equal(idx, src) {
		return nil, fmt.Errorf("%w: scatter_add index %v and source %v differ", ErrShape, idx, src)
	}
	if len(idx) != len(x) {
		return nil, fmt.Errorf("%w: scatter_add index %v and input %v differ in rank", ErrShape, idx, x)
	}
	for d := range x {
		if d != axis && idx[d] > x[d] {
			return nil, fmt.Errorf("%w: scatter_add index %v exceeds input %v on axis %d", ErrShape, idx, x, d)
		}
	}
	return same(in[0]), nil
}

func inferIndexSelect(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in[0]); err != nil {
		return nil, err
	}
	if err := requireIndex(op.Name, 1, in[1]); err != nil {
		return nil, err
	}
	if len(in[1].Shape) != 1 {
		return nil, fmt.Errorf("%w: index_select index is %v, want a vector", ErrShape, in[1].Shape)
	}
	axis, err := NormAxis(op.Name, op.Axis, len(in[0].Shape))
	if err != nil {
		return nil, err
	}
	out := slices.Clone(in[0].Shape)
	out[axis] = in[1].Shape[0]
	return []Meta{{DType: in[0].DType, Shape: out}}, nil
}

func inferOneHot(op *Op, in []Meta) ([]Meta, error) {
	if err := requireIndex(op.Name, 0, in[0]); err != nil {
		return nil, err
	}
	dt, err := outDType(op)
	if err != nil {
		return nil, err
	}
	if op.Depth < 0 || op.Depth > 1<<40 {
		return nil, fmt.Errorf("%w: one_hot depth %d", ErrAttr, op.Depth)
	}
	return []Meta{{DType: dt, Shape: append(slices.Clone(in[0].Shape), op.Depth)}}, nil
}

func inferTri(op *Op, in []Meta) ([]Meta, error) {
	if err := requireValid(op.Name, in...); err != nil {
		return nil, err
	}
	if len(in[0].Shape) < 2 {
		return nil, fmt.Errorf("%w: %s of rank %d, want at least 2", ErrShape, op.Name, len(in[0].Shape))
	}
	return same(in[0]), nil
}

// NormGroup is the number of trailing axes layer_norm and rms_norm
// normalise over, from op.Axes (empty: the last axis) and the input rank.
// The axes must be the last ones. Errors wrap ErrAttr.
func NormGroup(op *Op, r int) (int, error) {
	if len(op.Axes) == 0 {
		if r == 0 {
			return 0, fmt.Errorf("%w: %s of a scalar", ErrAttr, op.Name)
		}
		return 1, nil
	}
	axes, err := NormAxes(op.Axes, r)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op.Name, err)
	}
	for i, a := range axes {
		if a != r-len(axes)+i {
			return 0, fmt.Errorf("%w: %s axes %v are not the trailing axes of rank %d", ErrAttr, op.Name, op.Axes, r)
		}
	}
	return len(axes), nil
}

func inferNorm(op *Op, in []Meta) ([]Meta, error) {
	if len(in) < 1 || len(in) > 3 {
		return nil, fmt.Errorf("%w: %s takes 1 to 3 inputs (x, weight, bias), got %d", ErrArity, op.Name, len(in))
	}
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	if _, err := NormGroup(op, len(in[0].Shape)); err != nil {
		return nil, err
	}
	if !(op.Eps >= 0) || math.IsInf(op.Eps, 0) {
		return nil, fmt.Errorf("%w: %s eps %v", ErrAttr, op.Name, op.Eps)
	}
	for i, m := range in[1:] {
		sh, err := BroadcastShapes(in[0].Shape, m.Shape)
		if err != nil || !slices.Equal(sh, in[0].Shape) {
			return nil, fmt.Errorf("%w: %s input %d %v does not broadcast to %v", ErrShape, op.Name, i+1, m.Shape, in[0].Shape)
		}
	}
	return same(in[0]), nil
}

func inferLinspace(op *Op, _ []Meta) ([]Meta, error) {
	dt, err := outDType(op)
	if err != nil {
		return nil, err
	}
	if dt == Bool {
		return nil, fmt.Errorf("%w: linspace makes numeric tensors, not bool", ErrDType)
	}
	if math.IsNaN(op.Start) || math.IsInf(op.Start, 0) || math.IsNaN(op.Stop) || math.IsInf(op.Stop, 0) {
		return nil, fmt.Errorf("%w: linspace from %v to %v", ErrAttr, op.Start, op.Stop)
	}
	if op.Num < 0 {
		return nil, fmt.Errorf("%w: linspace of %d points", ErrAttr, op.Num)
	}
	return []Meta{{DType: dt, Shape: []int{op.Num}}}, nil
}

// LinspaceAt is element i of linspace(start, stop, num) in float64, as
// numpy computes it: start + i*step with step = (stop-start)/(num-1), and
// the last element exactly stop.
func LinspaceAt(start, stop float64, num, i int) float64 {
	if num > 1 && i == num-1 {
		return stop
	}
	if num <= 1 {
		return start
	}
	step := (stop - start) / float64(num-1)
	return float64(i)*step + start
}

func inferEye(op *Op, _ []Meta) ([]Meta, error) {
	dt, err := outDType(op)
	if err != nil {
		return nil, err
	}
	m := op.M
	if m == 0 {
		m = op.N
	}
	if op.N < 0 || m < 0 {
		return nil, fmt.Errorf("%w: eye of %d x %d", ErrAttr, op.N, op.M)
	}
	return []Meta{{DType: dt, Shape: []int{op.N, m}}}, nil
}

func inferBernoulli(op *Op, in []Meta) ([]Meta, error) {
	if !(op.P >= 0 && op.P <= 1) {
		return nil, fmt.Errorf("%w: bernoulli p %v outside [0, 1]", ErrAttr, op.P)
	}
	return inferCreate(op, in)
}
