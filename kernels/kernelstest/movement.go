package kernelstest

import (
	"errors"
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Tests of the movement, indexing, normalisation and creation ops.

func init() {
	opTests[kernels.OpExpand] = (*suite).expand
	opTests[kernels.OpSlice] = (*suite).slice
	opTests[kernels.OpPad] = (*suite).pad
	opTests[kernels.OpConcat] = (*suite).concat
	opTests[kernels.OpStack] = (*suite).stack
	opTests[kernels.OpSplit] = (*suite).split
	opTests[kernels.OpFlip] = (*suite).flip
	opTests[kernels.OpSqueeze] = (*suite).squeeze
	opTests[kernels.OpUnsqueeze] = (*suite).unsqueeze
	opTests[kernels.OpGather] = (*suite).gather
	opTests[kernels.OpScatterAdd] = (*suite).scatterAdd
	opTests[kernels.OpIndexSelect] = (*suite).indexSelect
	opTests[kernels.OpOneHot] = (*suite).oneHot
	opTests[kernels.OpTril] = func(s *suite) { s.tri(kernels.OpTril) }
	opTests[kernels.OpTriu] = func(s *suite) { s.tri(kernels.OpTriu) }
	opTests[kernels.OpLayerNorm] = func(s *suite) { s.norm(kernels.OpLayerNorm) }
	opTests[kernels.OpRMSNorm] = func(s *suite) { s.norm(kernels.OpRMSNorm) }
	opTests[kernels.OpZeros] = func(s *suite) { s.constant(kernels.OpZeros) }
	opTests[kernels.OpOnes] = func(s *suite) { s.constant(kernels.OpOnes) }
	opTests[kernels.OpLinspace] = (*suite).linspace
	opTests[kernels.OpEye] = (*suite).eye
	opTests[kernels.OpBernoulli] = (*suite).bernoulli
	extraInferErrors = append(extraInferErrors, movementInferErrors...)
}

var movementInferErrors = []struct {
	op   kernels.Op
	in   []kernels.Meta
	want error
}{
	{kernels.Op{Name: kernels.OpExpand, Shape: []int{4}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpExpand, Shape: []int{3}}, []kernels.Meta{meta(kernels.Float32, 2, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpSlice, Steps: []int{0}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSlice, Starts: []int{0, 0}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpPad, Pads: []int{1}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpPad, Pads: []int{-1, 0}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConcat}, nil, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpConcat}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float32, 3, 1)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConcat}, []kernels.Meta{meta(kernels.Float32, 2, 3), meta(kernels.Float32, 2, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConcat}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Int32, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConcat, Axis: 1}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConcat}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpStack}, nil, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpStack}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float32, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpStack, Axis: 2}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSplit}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSplit, Sizes: []int{1, 1}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSplit, Sizes: []int{-1, 4}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSplit, Sizes: []int{1}}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpFlip, Axes: []int{2}}, []kernels.Meta{meta(kernels.Float32, 3, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSqueeze, Axes: []int{0}}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpUnsqueeze}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpUnsqueeze, Axes: []int{0, -2}}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpGather}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float32, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpGather}, []kernels.Meta{meta(kernels.Float32, 3, 2), meta(kernels.Int64, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpGather}, []kernels.Meta{meta(kernels.Float32, 3, 2), meta(kernels.Int64, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpGather, Axis: -3}, []kernels.Meta{meta(kernels.Float32, 3, 2), meta(kernels.Int64, 3, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpScatterAdd}, []kernels.Meta{meta(kernels.Bool, 3), meta(kernels.Int64, 3), meta(kernels.Bool, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpScatterAdd}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Int64, 3), meta(kernels.Float64, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpScatterAdd}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Int64, 3), meta(kernels.Float32, 2)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpScatterAdd}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpIndexSelect}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Int32, 1, 1)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpIndexSelect}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Uint8, 1)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpOneHot, Depth: 3}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpOneHot, Depth: -1}, []kernels.Meta{meta(kernels.Int32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpTril}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpTriu}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpLayerNorm}, nil, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpLayerNorm}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float32, 3), meta(kernels.Float32, 3), meta(kernels.Float32, 3)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpLayerNorm}, []kernels.Meta{meta(kernels.Int32, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpRMSNorm}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float64, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpRMSNorm, Axes: []int{0}}, []kernels.Meta{meta(kernels.Float32, 2, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLayerNorm}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLayerNorm, Eps: -1}, []kernels.Meta{meta(kernels.Float32, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLayerNorm}, []kernels.Meta{meta(kernels.Float32, 2, 3), meta(kernels.Float32, 2)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpLayerNorm}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float32, 2, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpLinspace, Num: -1}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLinspace, Num: 2, Stop: math.Inf(1)}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLinspace, Num: 2, DType: kernels.Bool}, nil, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpEye, N: -1}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpEye, N: 1 << 20, M: 1 << 20}, nil, kernels.ErrTooLarge},
	{kernels.Op{Name: kernels.OpBernoulli, P: 1.5}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpBernoulli, P: math.NaN()}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpZeros, Shape: []int{-1}}, nil, kernels.ErrShape},
}

// declinable are the ops a backend may decline in every dtype without
// RequireAll.
var declinable = map[string]bool{}

func init() {
	for _, l := range [][]string{kernels.Movement, kernels.Indexing, kernels.Norms, kernels.Creation} {
		for _, name := range l {
			declinable[name] = true
		}
	}
}

// set copies element sj of src into element dj of dst (same dtype).
func set(dst *host, dj int, src *host, sj int) {
	if dst.f != nil {
		dst.f[dj] = src.f[sj]
	} else {
		dst.i[dj] = src.i[sj]
	}
}

// ravel is the row-major offset of idx in shape.
func ravel(idx, shape []int) int {
	o := 0
	for k, c := range idx {
		o = o*shape[k] + c
	}
	return o
}

// mapped builds a tensor of dtype x.dt and shape from x: element idx of the
// result is x's element at from(idx).
func mapped(x *host, shape []int, from func(idx []int) []int) *host {
	y := newHost(x.dt, shape)
	for j := range y.numel() {
		set(y, j, x, ravel(from(unravel(j, shape)), x.shape))
	}
	return y
}

// permuted returns x after a permute on the backend: a tensor whose
// element order differs from the one it was drawn in, as the inputs of
// real programs do after a transpose.
func (s *suite) permuted(x *host, perm []int) *host {
	s.t.Helper()
	op := &kernels.Op{Name: kernels.OpPermute, Perm: perm}
	got, err := s.exec(op, x)
	if err != nil {
		s.t.Fatalf("%s: %v", opString(op), err)
	}
	s.check("permute", got[0], exact(refPermute(x, perm)))
	return got[0]
}

// sliced returns x[1:] along axis 0 computed on the backend (or here, if
// the backend declines slice).
func (s *suite) sliced(x *host) *host {
	s.t.Helper()
	op := &kernels.Op{Name: kernels.OpSlice, Starts: []int{1}}
	got, err := s.exec(op, x)
	if errors.Is(err, errNotImplemented) && s.opts.mayDecline(op.Name) {
		return refSlice(x, op.Starts, nil, nil)
	}
	if err != nil {
		s.t.Fatalf("%s: %v", opString(op), err)
	}
	return got[0]
}

// runN executes op and compares each of its outputs with ws.
func (s *suite) runN(op *kernels.Op, ws []want, ins ...*host) {
	s.t.Helper()
	got, err := s.exec(op, ins...)
	if errors.Is(err, errNotImplemented) && s.opts.mayDecline(op.Name) {
		s.skipped++
		return
	}
	if err != nil {
		s.t.Errorf("%s %v: %v", opString(op), ins, err)
		return
	}
	if len(got) != len(ws) {
		s.t.Errorf("%s: %d outputs, want %d", opString(op), len(got), len(ws))
		return
	}
	for i, w := range ws {
		s.check(opString(op), got[i], w)
	}
}

// fails checks that Exec rejects op on ins with an error wrapping want.
func (s *suite) fails(op *kernels.Op, want error, ins ...*host) {
	s.t.Helper()
	_, err := s.exec(op, ins...)
	if errors.Is(err, errNotImplemented) && s.opts.mayDecline(op.Name) {
		s.skipped++
		return
	}
	if !errors.Is(err, want) {
		s.t.Errorf("%s %v: got %v, want an error wrapping %v", opString(op), ins, err, want)
	}
}

func (s *suite) expand() {
	cases := [][2][]int{{{3, 1}, {3, 4}}, {{}, {2, 3}}, {{4}, {2, 3, 4}}, {{1, 1}, {0, 1}}, {{2, 1, 3}, {2, 5, 3}},
		{{3}, {3}}, {{300, 1}, {300, 129}}, {{1, 129}, {2, 300, 129}}}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c[0], distAny)
			off := len(c[1]) - len(c[0])
			s.run(&kernels.Op{Name: kernels.OpExpand, Shape: c[1]}, exact(mapped(x, c[1], func(idx []int) []int {
				src := slices.Clone(idx[off:])
				for k := range src {
					if x.shape[k] == 1 {
						src[k] = 0
					}
				}
				return src
			})), x)
		}
	}
}

// pyIndices lists the indices range(*slice(start, stop, step).indices(n))
// visits, as CPython computes them; nil bounds are omitted ones.
func pyIndices(n int, start, stop *int, step int) []int {
	lower, upper := 0, n
	if step < 0 {
		lower, upper = -1, n-1
	}
	adjust := func(p *int, def int) int {
		if p == nil {
			return def
		}
		v := *p
		if v < 0 {
			v += n
			if v < lower {
				v = lower
			}
		} else if v > upper {
			v = upper
		}
		return v
	}
	var b, e int
	if step > 0 {
		b, e = adjust(start, lower), adjust(stop, upper)
	} else {
		b, e = adjust(start, upper), adjust(stop, lower)
	}
	var out []int
	for i := b; (step > 0 && i < e) || (step < 0 && i > e); i += step {
		out = append(out, i)
	}
	return out
}

func refSlice(x *host, starts, ends, steps []int) *host {
	r := len(x.shape)
	lists := make([][]int, r)
	shape := make([]int, r)
	for d := range r {
		var st, en *int
		step := 1
		if d < len(starts) {
			st = &starts[d]
		}
		if d < len(ends) {
			en = &ends[d]
		}
		if d < len(steps) {
			step = steps[d]
		}
		lists[d] = pyIndices(x.shape[d], st, en, step)
		shape[d] = len(lists[d])
	}
	return mapped(x, shape, func(idx []int) []int {
		src := make([]int, r)
		for d, c := range idx {
			src[d] = lists[d][c]
		}
		return src
	})
}

func (s *suite) slice() {
	big := math.MaxInt64
	cases := []struct{ shape, starts, ends, steps []int }{
		{[]int{5, 6}, []int{1, -4}, []int{4, 100}, []int{1, 2}},
		{[]int{5, 6}, nil, nil, []int{-1, -2}},
		{[]int{7}, []int{-1}, []int{-8}, []int{-1}},
		{[]int{7}, []int{5}, []int{2}, nil},
		{[]int{7}, []int{2}, []int{5}, []int{-1}},
		{[]int{7}, []int{-100}, []int{big}, []int{3}},
		{[]int{7}, []int{big}, []int{-big}, []int{-3}},
		{[]int{4, 5, 6}, []int{0, 1}, []int{-1}, nil},
		{[]int{4, 5, 6}, []int{3, 4, 5}, []int{0, 0, 0}, []int{-2, -3, -4}},
		{[]int{0, 3}, []int{0, 1}, nil, nil},
		{[]int{}, nil, nil, nil},
		{[]int{300, 129}, []int{1, 2}, []int{-1, -3}, []int{2, 3}},
		{[]int{300, 129}, []int{-1}, nil, []int{-1, -1}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			op := &kernels.Op{Name: kernels.OpSlice, Starts: c.starts, Ends: c.ends, Steps: c.steps}
			s.run(op, exact(refSlice(x, c.starts, c.ends, c.steps)), x)
		}
		// A slice of a permuted tensor.
		x := s.permuted(random(s.r, dt, []int{6, 9}, distAny), []int{1, 0})
		op := &kernels.Op{Name: kernels.OpSlice, Starts: []int{-2, 1}, Steps: []int{-3, 2}}
		s.run(op, exact(refSlice(x, op.Starts, nil, op.Steps)), x)
	}
}

func (s *suite) pad() {
	cases := []struct{ shape, pads []int }{
		{[]int{2, 3}, []int{1, 0, 2, 1}}, {[]int{}, []int{}}, {[]int{0, 2}, []int{1, 1, 0, 0}},
		{[]int{4}, []int{0, 0}}, {[]int{3}, []int{5, 7}}, {[]int{300, 129}, []int{1, 2, 3, 4}},
		{[]int{2, 3, 4}, []int{0, 1, 1, 0, 2, 2}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			v := 1.5
			op := &kernels.Op{Name: kernels.OpPad, Pads: c.pads, Value: v}
			shape := slices.Clone(c.shape)
			for d := range shape {
				shape[d] += c.pads[2*d] + c.pads[2*d+1]
			}
			fill := fromFloat64(dt, []int{1}, []float64{v})
			y := newHost(dt, shape)
			for j := range y.numel() {
				idx := unravel(j, shape)
				inside := true
				for d, c2 := range idx {
					idx[d] = c2 - c.pads[2*d]
					if idx[d] < 0 || idx[d] >= c.shape[d] {
						inside = false
					}
				}
				if inside {
					set(y, j, x, ravel(idx, c.shape))
				} else {
					set(y, j, fill, 0)
				}
			}
			s.run(op, exact(y), x)
		}
	}
}

func refConcat(xs []*host, axis int) *host {
	r := len(xs[0].shape)
	if axis < 0 {
		axis += r
	}
	shape := slices.Clone(xs[0].shape)
	shape[axis] = 0
	for _, x := range xs {
		shape[axis] += x.shape[axis]
	}
	y := newHost(xs[0].dt, shape)
	for j := range y.numel() {
		idx := unravel(j, shape)
		for _, x := range xs {
			if idx[axis] < x.shape[axis] {
				set(y, j, x, ravel(idx, x.shape))
				break
			}
			idx[axis] -= x.shape[axis]
		}
	}
	return y
}

func (s *suite) concat() {
	cases := []struct {
		shapes [][]int
		axis   int
	}{
		{[][]int{{2, 3}, {4, 3}}, 0}, {[][]int{{2, 3}, {2, 1}, {2, 0}, {2, 5}}, -1}, {[][]int{{5}}, 0},
		{[][]int{{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, 1}, {[][]int{{0, 3}, {0, 3}}, 1}, {[][]int{{0, 3}, {2, 3}}, -2},
		{[][]int{{300, 129}, {300, 1}}, 1},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			xs := make([]*host, len(c.shapes))
			for i, sh := range c.shapes {
				xs[i] = random(s.r, dt, sh, distAny)
			}
			s.run(&kernels.Op{Name: kernels.OpConcat, Axis: c.axis}, exact(refConcat(xs, c.axis)), xs...)
		}
		// Inputs produced by permute and slice.
		a := s.permuted(random(s.r, dt, []int{3, 4}, distAny), []int{1, 0})
		b := s.sliced(random(s.r, dt, []int{5, 3}, distAny))
		s.run(&kernels.Op{Name: kernels.OpConcat}, exact(refConcat([]*host{a, b}, 0)), a, b)
	}
}

func (s *suite) stack() {
	cases := []struct {
		shape []int
		n     int
		axis  int
	}{
		{[]int{2, 3}, 2, 0}, {[]int{2, 3}, 3, 2}, {[]int{2, 3}, 2, -1}, {[]int{2, 3}, 4, 1}, {[]int{}, 3, 0},
		{[]int{0}, 2, 1}, {[]int{7}, 1, -2}, {[]int{300, 129}, 2, 1},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			xs := make([]*host, c.n)
			for i := range xs {
				xs[i] = random(s.r, dt, c.shape, distAny)
			}
			axis := c.axis
			if axis < 0 {
				axis += len(c.shape) + 1
			}
			shape := slices.Insert(slices.Clone(c.shape), axis, c.n)
			y := newHost(dt, shape)
			for j := range y.numel() {
				idx := unravel(j, shape)
				i := idx[axis]
				set(y, j, xs[i], ravel(slices.Delete(idx, axis, axis+1), c.shape))
			}
			s.run(&kernels.Op{Name: kernels.OpStack, Axis: c.axis}, exact(y), xs...)
		}
	}
}

func (s *suite) split() {
	cases := []struct {
		shape []int
		axis  int
		sizes []int
	}{
		{[]int{6, 4}, 0, []int{1, 2, 3}}, {[]int{3, 5}, -1, []int{5}}, {[]int{3, 5}, 1, []int{0, 5, 0}},
		{[]int{300, 129}, 1, []int{100, 29}}, {[]int{0, 4}, 1, []int{2, 2}}, {[]int{2, 6, 3}, -2, []int{2, 2, 2}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			axis := c.axis
			if axis < 0 {
				axis += len(c.shape)
			}
			var ws []want
			off := 0
			for _, n := range c.sizes {
				sh := slices.Clone(c.shape)
				sh[axis] = n
				ws = append(ws, exact(mapped(x, sh, func(idx []int) []int {
					idx = slices.Clone(idx)
					idx[axis] += off
					return idx
				})))
				off += n
			}
			s.runN(&kernels.Op{Name: kernels.OpSplit, Axis: c.axis, Sizes: c.sizes}, ws, x)
		}
	}
}

func (s *suite) flip() {
	cases := []struct{ shape, axes []int }{
		{[]int{5}, nil}, {[]int{3, 4}, []int{0}}, {[]int{3, 4}, []int{-1}}, {[]int{2, 3, 4}, []int{0, 2}},
		{[]int{}, nil}, {[]int{0, 3}, []int{1}}, {[]int{300, 129}, nil}, {[]int{2, 3, 4}, []int{-2}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			r := len(c.shape)
			flipped := make([]bool, r)
			for _, a := range c.axes {
				flipped[(a+r)%r] = true
			}
			if len(c.axes) == 0 {
				for d := range flipped {
					flipped[d] = true
				}
			}
			s.run(&kernels.Op{Name: kernels.OpFlip, Axes: c.axes}, exact(mapped(x, c.shape, func(idx []int) []int {
				src := slices.Clone(idx)
				for d := range src {
					if flipped[d] {
						src[d] = c.shape[d] - 1 - src[d]
					}
				}
				return src
			})), x)
		}
	}
}

// relabel returns x's elements with another shape.
func relabel(x *host, shape []int) *host {
	y := newHost(x.dt, shape)
	y.f, y.i = x.f, x.i
	return y
}

func (s *suite) squeeze() {
	cases := []struct{ shape, axes, out []int }{
		{[]int{1, 3, 1}, nil, []int{3}}, {[]int{1, 3, 1}, []int{0}, []int{3, 1}}, {[]int{1, 3, 1}, []int{-1}, []int{1, 3}},
		{[]int{1}, nil, []int{}}, {[]int{0, 1}, []int{1}, []int{0}}, {[]int{}, nil, []int{}}, {[]int{300, 1, 129}, nil, []int{300, 129}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			s.run(&kernels.Op{Name: kernels.OpSqueeze, Axes: c.axes}, exact(relabel(x, c.out)), x)
		}
	}
}

func (s *suite) unsqueeze() {
	cases := []struct{ shape, axes, out []int }{
		{[]int{3}, []int{0}, []int{1, 3}}, {[]int{3}, []int{-1}, []int{3, 1}}, {[]int{2, 3}, []int{0, 3}, []int{1, 2, 3, 1}},
		{[]int{}, []int{0}, []int{1}}, {[]int{0}, []int{1}, []int{0, 1}}, {[]int{2, 3}, []int{-2}, []int{2, 1, 3}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.shape, distAny)
			s.run(&kernels.Op{Name: kernels.OpUnsqueeze, Axes: c.axes}, exact(relabel(x, c.out)), x)
		}
	}
}

// indices draws an index tensor of dtype i32 or i64 with values in
// [-n, n), negative ones counting from the end.
func (s *suite) indices(shape []int, n int) *host {
	dt := kernels.Int64
	if s.r.IntN(2) == 0 {
		dt = kernels.Int32
	}
	h := newHost(dt, shape)
	for j := range h.i {
		h.i[j] = int64(s.r.IntN(2*n) - n)
	}
	return h
}

// index resolves index element j against an axis of length n.
func (h *host) index(j, n int) int {
	v := int(h.i[j])
	if v < 0 {
		v += n
	}
	return v
}

func norm(axis, r int) int {
	if axis < 0 {
		return axis + r
	}
	return axis
}

func refGather(x, idx *host, axis int) *host {
	axis = norm(axis, len(x.shape))
	y := newHost(x.dt, idx.shape)
	for j := range y.numel() {
		pos := unravel(j, idx.shape)
		pos[axis] = idx.index(j, x.shape[axis])
		set(y, j, x, ravel(pos, x.shape))
	}
	return y
}

// gathers lists gather and scatter_add cases: input shape, index shape,
// axis.
var gathers = []struct {
	x, idx []int
	axis   int
}{
	{[]int{3, 4}, []int{2, 4}, 0}, {[]int{3, 4}, []int{3, 6}, 1}, {[]int{2, 3, 4}, []int{2, 2, 5}, -1},
	{[]int{5}, []int{0}, 0}, {[]int{3, 4}, []int{0, 4}, 0}, {[]int{4, 5}, []int{9, 5}, -2},
	{[]int{300, 129}, []int{300, 60}, 1},
}

func (s *suite) gather() {
	for _, dt := range allDTypes {
		for _, c := range gathers {
			x := random(s.r, dt, c.x, distAny)
			idx := s.indices(c.idx, c.x[norm(c.axis, len(c.x))])
			s.run(&kernels.Op{Name: kernels.OpGather, Axis: c.axis}, exact(refGather(x, idx, c.axis)), x, idx)
		}
		x := s.permuted(random(s.r, dt, []int{4, 3}, distAny), []int{1, 0})
		idx := s.indices([]int{3, 2}, 4)
		s.run(&kernels.Op{Name: kernels.OpGather, Axis: 1}, exact(refGather(x, idx, 1)), x, idx)
	}
	x := random(s.r, kernels.Float32, []int{3, 4}, distAny)
	for _, bad := range []int64{3, -4, math.MaxInt32} {
		idx := newHost(kernels.Int32, []int{1, 4})
		idx.i[2] = bad
		s.fails(&kernels.Op{Name: kernels.OpGather}, kernels.ErrIndex, x, idx)
	}
}

func (s *suite) scatterAdd() {
	op := &kernels.Op{Name: kernels.OpScatterAdd}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt, 2), meta(kernels.Int64, 2), meta(dt, 2)) {
			continue
		}
		for _, c := range gathers {
			x := random(s.r, dt, c.x, distAny)
			axis := norm(c.axis, len(c.x))
			idx := s.indices(c.idx, c.x[axis])
			src := random(s.r, dt, c.idx, distAny)
			// The reference: float64 sums, or int64 wrapped to dt.
			v := make([]float64, x.numel())
			iv := make([]int64, x.numel())
			scale := make([]float64, x.numel())
			count := make([]int, x.numel())
			for j := range v {
				v[j] = x.at(j)
				scale[j] = math.Abs(x.at(j))
				if x.i != nil {
					iv[j] = x.i[j]
				}
			}
			terms := 0
			for j := range src.numel() {
				pos := unravel(j, c.idx)
				pos[axis] = idx.index(j, c.x[axis])
				o := ravel(pos, c.x)
				v[o] += src.at(j)
				scale[o] += math.Abs(src.at(j))
				if src.i != nil {
					iv[o] += src.i[j]
				}
				count[o]++
				terms = max(terms, count[o])
			}
			var w want
			if dt.IsFloat() {
				w = rounded(dt, c.x, v, tolerances[dt])
				w.terms, w.scale = terms, scale
			} else {
				y := newHost(dt, c.x)
				for j := range iv {
					y.i[j] = wrap(iv[j], dt)
				}
				w = exact(y)
			}
			s.run(&kernels.Op{Name: kernels.OpScatterAdd, Axis: c.axis}, w, x, idx, src)
		}
	}
	x := random(s.r, kernels.Float32, []int{3, 4}, distAny)
	idx := newHost(kernels.Int64, []int{2, 4})
	idx.i[5] = -4
	s.fails(op, kernels.ErrIndex, x, idx, random(s.r, kernels.Float32, []int{2, 4}, distAny))
}

func (s *suite) indexSelect() {
	cases := []struct {
		x    []int
		n    int
		axis int
	}{
		{[]int{5, 3}, 4, 0}, {[]int{2, 3, 4}, 1, 1}, {[]int{3, 4}, 6, -1}, {[]int{300, 129}, 50, 1},
		{[]int{3, 4}, 0, 0}, {[]int{0, 4}, 3, 1}, {[]int{7}, 7, 0},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.x, distAny)
			axis := norm(c.axis, len(c.x))
			idx := s.indices([]int{c.n}, c.x[axis])
			shape := slices.Clone(c.x)
			shape[axis] = c.n
			y := mapped(x, shape, func(p []int) []int {
				p = slices.Clone(p)
				p[axis] = idx.index(p[axis], c.x[axis])
				return p
			})
			s.run(&kernels.Op{Name: kernels.OpIndexSelect, Axis: c.axis}, exact(y), x, idx)
		}
	}
	x := random(s.r, kernels.Float32, []int{3, 4}, distAny)
	idx := newHost(kernels.Int64, []int{2})
	idx.i[1] = 4
	s.fails(&kernels.Op{Name: kernels.OpIndexSelect, Axis: 1}, kernels.ErrIndex, x, idx)
}

func (s *suite) oneHot() {
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		for _, sh := range [][]int{{5}, {2, 3}, {}, {0}, {300}} {
			depth := 1 + s.r.IntN(6)
			idx := s.indices(sh, depth)
			out := dt
			if out == kernels.Invalid {
				out = kernels.Float32
			}
			shape := append(slices.Clone(sh), depth)
			v := make([]float64, kernels.Numel(shape))
			for j := range idx.numel() {
				v[j*depth+idx.index(j, depth)] = 1
			}
			s.run(&kernels.Op{Name: kernels.OpOneHot, Depth: depth, DType: dt}, exact(fromFloat64(out, shape, v)), idx)
		}
	}
	idx := newHost(kernels.Int32, []int{3})
	idx.i[1] = 4
	s.fails(&kernels.Op{Name: kernels.OpOneHot, Depth: 4}, kernels.ErrIndex, idx)
}

func (s *suite) tri(name string) {
	shapes := [][]int{{4, 5}, {5, 4}, {2, 3, 3}, {0, 3}, {3, 0}, {300, 129}, {2, 1, 4, 4}}
	for _, dt := range allDTypes {
		for _, sh := range shapes {
			for _, k := range []int{0, 1, -2, 10, -10, math.MaxInt, math.MinInt} {
				x := random(s.r, dt, sh, distAny)
				y := newHost(dt, sh)
				r := len(sh)
				for j := range y.numel() {
					idx := unravel(j, sh)
					i, c := idx[r-2], idx[r-1]
					keep := (name == kernels.OpTril && c <= i+k) || (name == kernels.OpTriu && c >= i+k)
					if k == math.MaxInt {
						keep = name == kernels.OpTril
					} else if k == math.MinInt {
						keep = name == kernels.OpTriu
					}
					if keep {
						set(y, j, x, j)
					}
				}
				s.run(&kernels.Op{Name: name, K: k}, exact(y), x)
			}
		}
	}
}

func refNorm(name string, x, w, b *host, g int, eps float64) want {
	n := x.numel()
	v := make([]float64, n)
	scale := make([]float64, n)
	bcast := func(h *host, j int) float64 {
		idx := unravel(j, x.shape)
		idx = idx[len(idx)-len(h.shape):]
		for k := range idx {
			if h.shape[k] == 1 {
				idx[k] = 0
			}
		}
		return h.f[ravel(idx, h.shape)]
	}
	for base := 0; base < n; base += g {
		mean, ss := 0.0, 0.0
		if name == kernels.OpLayerNorm {
			for i := range g {
				mean += x.f[base+i]
			}
			mean /= float64(g)
		}
		for i := range g {
			d := x.f[base+i] - mean
			ss += d * d
		}
		rstd := 1 / math.Sqrt(ss/float64(g)+eps)
		for i := range g {
			j := base + i
			y := (x.f[j] - mean) * rstd
			scale[j] = math.Abs(y) + 1
			if w != nil {
				y *= bcast(w, j)
				scale[j] *= math.Abs(bcast(w, j))
			}
			if b != nil {
				y += bcast(b, j)
				scale[j] += math.Abs(bcast(b, j))
			}
			v[j] = y
		}
	}
	res := rounded(x.dt, x.shape, v, loose(x.dt))
	res.terms, res.scale = g, scale
	return res
}

func (s *suite) norm(name string) {
	cases := []struct {
		x, axes, w, b []int // w, b nil: absent
		eps           float64
	}{
		{[]int{4, 8}, nil, nil, nil, 1e-5},
		{[]int{2, 3, 16}, []int{-1}, []int{16}, []int{16}, 1e-5},
		{[]int{2, 3, 16}, []int{-2, -1}, []int{3, 16}, nil, 0.1},
		{[]int{2, 3, 16}, []int{1, 2}, []int{1, 16}, []int{}, 0},
		{[]int{5}, []int{0}, []int{}, nil, 1e-6},
		{[]int{0, 8}, nil, []int{8}, []int{8}, 1e-5},
		{[]int{300, 129}, nil, []int{129}, []int{1, 129}, 1e-5},
		{[]int{3, 1}, nil, nil, nil, 1e-5},
		{[]int{2, 4, 5}, []int{-1}, []int{2, 4, 1}, nil, 1e-3},
	}
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: name}, meta(dt, 2)) {
			continue
		}
		for _, c := range cases {
			x := random(s.r, dt, c.x, distAny)
			for j := range x.f {
				x.f[j] = roundFloat(x.f[j]*3+0.5, dt)
			}
			ins := []*host{x}
			var w, b *host
			if c.w != nil {
				w = random(s.r, dt, c.w, distAny)
				ins = append(ins, w)
			}
			if c.b != nil {
				if w == nil {
					w = fromFloat64(dt, []int{}, []float64{1})
					ins = append(ins, w)
				}
				b = random(s.r, dt, c.b, distAny)
				ins = append(ins, b)
			}
			g := 1
			if len(c.axes) == 0 {
				g = c.x[len(c.x)-1]
			} else {
				g = kernels.Numel(c.x[len(c.x)-len(c.axes):])
			}
			op := &kernels.Op{Name: name, Axes: c.axes, Eps: c.eps}
			s.run(op, refNorm(name, x, w, b, g, c.eps), ins...)
		}
		// A permuted input, with specials.
		x := s.permuted(random(s.r, dt, []int{8, 6}, distAny), []int{1, 0})
		sprinkle(s.r, x)
		w := random(s.r, dt, []int{8}, distAny)
		op := &kernels.Op{Name: name, Eps: 1e-5}
		s.run(op, refNorm(name, x, w, nil, 8, 1e-5), x, w)
	}
}

func (s *suite) constant(name string) {
	v := 0.0
	if name == kernels.OpOnes {
		v = 1
	}
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		for _, sh := range [][]int{{}, {3, 4}, {0}, {7}, {300, 129}} {
			out := dt
			if out == kernels.Invalid {
				out = kernels.Float32
			}
			vals := make([]float64, kernels.Numel(sh))
			for j := range vals {
				vals[j] = v
			}
			s.run(&kernels.Op{Name: name, Shape: sh, DType: dt}, exact(fromFloat64(out, sh, vals)))
		}
	}
}

func (s *suite) linspace() {
	cases := []struct {
		start, stop float64
		num         int
	}{{0, 1, 5}, {1, -1, 7}, {0, 10, 1}, {0, 10, 0}, {2.5, 2.5, 3}, {-3, 1e3, 70000}, {0, 1, 3}, {-1e10, 1e10, 11}}
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		op := &kernels.Op{Name: kernels.OpLinspace, Num: 2, DType: dt}
		if _, err := kernels.Infer(op, nil, kernels.DefaultLimits()); errors.Is(err, kernels.ErrDType) {
			continue
		}
		out := dt
		if out == kernels.Invalid {
			out = kernels.Float32
		}
		for _, c := range cases {
			v := make([]float64, c.num)
			if c.num == 1 {
				v[0] = c.start
			} else {
				step := (c.stop - c.start) / float64(c.num-1)
				for i := range v {
					v[i] = c.start + float64(i)*step
				}
				if c.num > 1 {
					v[c.num-1] = c.stop
				}
			}
			op := &kernels.Op{Name: kernels.OpLinspace, Start: c.start, Stop: c.stop, Num: c.num, DType: dt}
			w := rounded(out, []int{c.num}, v, tolerances[out])
			if !out.IsFloat() {
				w = exact(fromFloat64(out, []int{c.num}, v))
				if c.num > 2 && c.stop-c.start != math.Trunc(c.stop-c.start) {
					continue // truncation decides on rounding noise
				}
			}
			s.run(op, w)
		}
	}
}

func (s *suite) eye() {
	cases := [][3]int{{3, 0, 0}, {3, 5, 1}, {4, 2, -1}, {0, 0, 0}, {3, 3, 5}, {300, 129, -7}, {2, 4, math.MaxInt}, {2, 4, math.MinInt}}
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		out := dt
		if out == kernels.Invalid {
			out = kernels.Float32
		}
		for _, c := range cases {
			n, m, k := c[0], c[1], c[2]
			if m == 0 {
				m = n
			}
			v := make([]float64, n*m)
			for i := range n {
				for j := range m {
					if k != math.MaxInt && k != math.MinInt && j-i == k {
						v[i*m+j] = 1
					}
				}
			}
			s.run(&kernels.Op{Name: kernels.OpEye, N: c[0], M: c[1], K: k, DType: dt}, exact(fromFloat64(out, []int{n, m}, v)))
		}
	}
}

func (s *suite) bernoulli() {
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		out := dt
		if out == kernels.Invalid {
			out = kernels.Float32
		}
		for _, sh := range [][]int{{}, {1000}, {0}, {3, 5, 7}} {
			for _, p := range []float64{0, 0.3, 0.5, 1, s.r.Float64()} {
				op := &kernels.Op{Name: kernels.OpBernoulli, Shape: sh, P: p, DType: dt, Seed: s.r.Uint64(), Key: s.r.Uint64()}
				v := make([]float64, kernels.Numel(sh))
				for j := range v {
					if kernels.UniformAt(op.Seed, op.Key, uint64(j), 0, 1) < p {
						v[j] = 1
					}
				}
				s.run(op, exact(fromFloat64(out, sh, v)))
			}
		}
	}
}

// movementExecErrors hands Exec of the new ops outputs that do not fit:
// Exec must return an error, never panic or write out of bounds.
func movementExecErrors(s *suite) {
	b := s.b
	buf, err := b.Alloc(4 * 12)
	if err != nil {
		s.t.Fatal(err)
	}
	defer b.Free(buf)
	f32 := func(shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(kernels.Float32, shape...), Buf: buf}
	}
	i64 := func(shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(kernels.Int64, shape...), Buf: buf}
	}
	ts := func(t ...*kernels.Tensor) []*kernels.Tensor { return t }
	cases := []execCase{
		{"concat output shape", kernels.Op{Name: kernels.OpConcat}, ts(f32(2), f32(3)), ts(f32(4))},
		{"concat no inputs", kernels.Op{Name: kernels.OpConcat}, nil, ts(f32(4))},
		{"stack output shape", kernels.Op{Name: kernels.OpStack}, ts(f32(2), f32(2)), ts(f32(4))},
		{"split outputs", kernels.Op{Name: kernels.OpSplit, Sizes: []int{1, 2}}, ts(f32(3)), ts(f32(1))},
		{"split output shape", kernels.Op{Name: kernels.OpSplit, Sizes: []int{1, 2}}, ts(f32(3)), ts(f32(1), f32(3))},
		{"gather output shape", kernels.Op{Name: kernels.OpGather}, ts(f32(3), i64(2)), ts(f32(3))},
		{"slice output shape", kernels.Op{Name: kernels.OpSlice, Steps: []int{2}}, ts(f32(6)), ts(f32(6))},
		{"pad output shape", kernels.Op{Name: kernels.OpPad, Pads: []int{1, 1}}, ts(f32(3)), ts(f32(3))},
		{"expand output shape", kernels.Op{Name: kernels.OpExpand, Shape: []int{2, 3}}, ts(f32(3)), ts(f32(12))},
		{"norm no inputs", kernels.Op{Name: kernels.OpLayerNorm}, nil, ts(f32(3))},
		{"eye output shape", kernels.Op{Name: kernels.OpEye, N: 3}, nil, ts(f32(3, 4))},
		{"one_hot short output", kernels.Op{Name: kernels.OpOneHot, Depth: 100}, ts(i64(3)), ts(f32(3, 100))},
	}
	expectExecErrors(s, cases)
}
