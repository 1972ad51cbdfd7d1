package kernelstest

import (
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// opTests holds the test of every op; RunAll fails an op missing here.
var opTests = map[string]func(*suite){}

func init() {
	for name := range unaryFloat {
		opTests[name] = func(s *suite) { s.unary(name) }
	}
	for name := range unaryInt {
		opTests[name] = func(s *suite) { s.unary(name) }
	}
	for name := range binaryFloat {
		opTests[name] = func(s *suite) { s.binary(name) }
	}
	for name := range binaryInt {
		opTests[name] = func(s *suite) { s.binary(name) }
	}
	for name := range compares {
		opTests[name] = func(s *suite) { s.compare(name) }
	}
	for _, name := range []string{kernels.OpSum, kernels.OpMean, kernels.OpMax, kernels.OpMin, kernels.OpProd,
		kernels.OpArgmax, kernels.OpArgmin, kernels.OpLogsumexp, kernels.OpVar} {
		opTests[name] = func(s *suite) { s.reduce(name) }
	}
	opTests[kernels.OpIsNaN] = (*suite).isnan
	opTests[kernels.OpWhere] = (*suite).where
	opTests[kernels.OpClamp] = (*suite).clamp
	opTests[kernels.OpSoftmax] = func(s *suite) { s.softmax(kernels.OpSoftmax) }
	opTests[kernels.OpLogSoftmax] = func(s *suite) { s.softmax(kernels.OpLogSoftmax) }
	opTests[kernels.OpMatmul] = (*suite).matmul
	opTests[kernels.OpPermute] = (*suite).permute
	opTests[kernels.OpReshape] = (*suite).reshape
	opTests[kernels.OpCast] = (*suite).cast
	opTests[kernels.OpFull] = (*suite).full
	opTests[kernels.OpArange] = (*suite).arange
	opTests[kernels.OpUniform] = (*suite).random
	opTests[kernels.OpNormal] = (*suite).random
}

// shapes of the elementwise tests: scalars, vectors, empty tensors and
// one large enough for a backend to split it across cores.
var unaryShapes = [][]int{{}, {1}, {5}, {3, 7}, {2, 3, 4}, {0}, {3, 0}, {300, 129}}

// domain says how to draw inputs for an op.
func domain(name string) dist {
	switch name {
	case kernels.OpLog, kernels.OpSqrt, kernels.OpRsqrt, kernels.OpLog1p:
		return distPos
	}
	return distAny
}

func meta(dt kernels.DType, shape ...int) kernels.Meta {
	return kernels.Meta{DType: dt, Shape: shape}
}

func (s *suite) unary(name string) {
	op := &kernels.Op{Name: name}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt)) {
			continue
		}
		for _, sh := range unaryShapes {
			x := random(s.r, dt, sh, domain(name))
			s.run(op, refUnary(name, x), x)
		}
		// Specials, and inputs outside the domain.
		x := random(s.r, dt, []int{6, 7}, distAny)
		sprinkle(s.r, x)
		s.run(op, refUnary(name, x), x)
		if dt.IsFloat() { // halves and integers, where rounding is decided
			x := newHost(dt, []int{41})
			for j := range x.f {
				x.f[j] = float64(j-20) / 2
			}
			s.run(op, refUnary(name, x), x)
		}
	}
}

// broadcasts lists binary operand shapes: equal, scalar either side, row
// and column broadcasts, rank mismatch, both sides broadcast, empty, and
// large cases of each kind.
var broadcasts = [][2][]int{
	{{3, 4}, {3, 4}}, {{}, {3, 4}}, {{3, 4}, {}}, {{}, {}}, {{1}, {}},
	{{3, 4}, {4}}, {{4}, {3, 4}}, {{3, 1}, {3, 4}}, {{3, 4}, {3, 1}},
	{{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{2, 1, 4}, {1, 3, 1}},
	{{1, 1}, {5}}, {{0, 4}, {4}}, {{2, 0}, {1}}, {{5, 1, 3}, {0, 1}},
	{{257, 130}, {257, 130}}, {{257, 130}, {130}}, {{257, 130}, {257, 1}},
	{{}, {257, 130}}, {{257, 130}, {}}, {{3, 1, 200, 60}, {1, 7, 1, 60}}, {{40, 1, 30}, {40, 50, 1}},
}

func (s *suite) binary(name string) {
	op := &kernels.Op{Name: name}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt), meta(dt)) {
			continue
		}
		for _, sh := range broadcasts {
			a, b := random(s.r, dt, sh[0], distAny), random(s.r, dt, sh[1], distAny)
			s.run(op, refBinary(name, a, b), a, b)
		}
		a, b := random(s.r, dt, []int{8, 9}, distAny), random(s.r, dt, []int{8, 9}, distAny)
		sprinkle(s.r, a)
		sprinkle(s.r, b)
		s.run(op, refBinary(name, a, b), a, b)
		s.run(op, refBinary(name, b, a), b, a)
	}
}

// reductions lists input shapes with the axes reduced: all, each one,
// negative, several, scalars, empty axes and tensors, and large inputs
// reducing the last, the first, a middle and scattered axes.
var reductions = []struct {
	shape, axes []int
}{
	{[]int{2, 3, 4}, nil}, {[]int{2, 3, 4}, []int{0}}, {[]int{2, 3, 4}, []int{1}},
	{[]int{2, 3, 4}, []int{2}}, {[]int{2, 3, 4}, []int{-1}}, {[]int{2, 3, 4}, []int{0, 2}},
	{[]int{2, 3, 4}, []int{-2, -1}}, {[]int{2, 3, 4}, []int{0, 1}}, {[]int{2, 3, 4}, []int{2, 0, 1}},
	{[]int{}, nil}, {[]int{7}, []int{0}}, {[]int{1, 5, 1}, []int{0}}, {[]int{4, 1}, []int{1}},
	{[]int{3, 0, 2}, []int{1}}, {[]int{3, 0, 2}, []int{0}}, {[]int{0}, nil},
	{[]int{300, 200}, []int{1}}, {[]int{300, 200}, []int{0}}, {[]int{300, 200}, nil},
	{[]int{4, 100, 150}, []int{1}}, {[]int{20, 30, 40, 2}, []int{0, 2}}, {[]int{3, 70000}, []int{-1}},
	{[]int{5, 300, 7}, []int{0, 2}},
}

// reduceNeedsElements: reductions that reject an empty axis.
func reduceNeedsElements(name string) bool {
	return name == kernels.OpMax || name == kernels.OpMin || name == kernels.OpArgmax || name == kernels.OpArgmin
}

func (s *suite) reduce(name string) {
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: name}, meta(dt, 3)) {
			continue
		}
		d := distAny
		if name == kernels.OpProd {
			d = distUnit // keep products in range
		}
		for i, c := range reductions {
			for _, keep := range []bool{false, true} {
				op := &kernels.Op{Name: name, Axes: c.axes, Keepdims: keep}
				if name == kernels.OpVar {
					op.Correction = i % 3 // 0, 1, and 2 (over one element: NaN)
				}
				x := random(s.r, dt, c.shape, d)
				if reduceNeedsElements(name) && kernels.Numel(c.shape) == 0 {
					if _, err := kernels.Infer(op, []kernels.Meta{x.meta()}, kernels.DefaultLimits()); err != nil {
						continue // rejected, as infer_errors checks
					}
				}
				s.run(op, refReduce(name, x, c.axes, keep, op.Correction), x)
			}
		}
		// NaN and infinities in some rows.
		x := random(s.r, dt, []int{6, 10}, d)
		sprinkle(s.r, x)
		for _, axes := range [][]int{{1}, {0}, nil} {
			op := &kernels.Op{Name: name, Axes: axes}
			s.run(op, refReduce(name, x, axes, false, 0), x)
		}
	}
}

// products lists matmul operand shapes: matrices, vectors on either side
// or both, batches with broadcasting, empty dims, and sizes that cross a
// backend's blocking with ragged edges.
var products = [][2][]int{
	{{3, 4}, {4, 5}}, {{4}, {4, 5}}, {{3, 4}, {4}}, {{4}, {4}}, {{1, 4}, {4, 1}},
	{{2, 3, 4}, {4, 5}}, {{3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 2}}, {{2, 3, 4}, {4}},
	{{7, 0}, {0, 3}}, {{0, 4}, {4, 3}}, {{3, 4}, {4, 0}}, {{0, 2, 3}, {3, 2}},
	{{67, 129}, {129, 65}}, {{2, 130, 300}, {300, 70}}, {{300, 33}, {33, 260}},
	{{513}, {513, 100}}, {{100, 513}, {513}}, {{3, 65, 64}, {3, 64, 9}},
}

func (s *suite) matmul() {
	op := &kernels.Op{Name: kernels.OpMatmul}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt, 2, 2), meta(dt, 2, 2)) {
			continue
		}
		for _, sh := range products {
			a, b := random(s.r, dt, sh[0], distAny), random(s.r, dt, sh[1], distAny)
			s.run(op, refMatmul(a, b), a, b)
		}
		if dt.IsFloat() {
			a, b := random(s.r, dt, []int{5, 6}, distAny), random(s.r, dt, []int{6, 4}, distAny)
			sprinkle(s.r, a)
			s.run(op, refMatmul(a, b), a, b)
		}
	}
}

var permutes = []struct {
	shape, perm []int
}{
	{[]int{}, []int{}}, {[]int{5}, []int{0}}, {[]int{5, 7}, []int{1, 0}},
	{[]int{2, 3, 4}, []int{2, 0, 1}}, {[]int{2, 3, 4}, []int{-1, 0, 1}}, {[]int{2, 3, 4}, []int{0, 1, 2}},
	{[]int{2, 3, 4}, []int{1, 0, 2}}, {[]int{3, 1, 4, 5}, []int{2, 0, 3, 1}}, {[]int{0, 3}, []int{1, 0}},
	{[]int{70, 90}, []int{1, 0}}, {[]int{200, 300}, []int{1, 0}}, {[]int{4, 50, 60, 3}, []int{0, 3, 2, 1}},
	{[]int{6, 5, 4, 3, 2}, []int{4, 2, 0, 3, 1}}, {[]int{33, 1, 65}, []int{2, 1, 0}},
}

func (s *suite) permute() {
	for _, dt := range allDTypes {
		for _, c := range permutes {
			x := random(s.r, dt, c.shape, distAny)
			s.run(&kernels.Op{Name: kernels.OpPermute, Perm: c.perm}, exact(refPermute(x, c.perm)), x)
		}
	}
}

func (s *suite) reshape() {
	cases := []struct{ from, to []int }{
		{[]int{2, 3, 4}, []int{4, -1}}, {[]int{6}, []int{2, 3}}, {[]int{}, []int{1, 1}},
		{[]int{1}, []int{}}, {[]int{0, 3}, []int{3, 0}}, {[]int{300, 200}, []int{-1}},
	}
	for _, dt := range allDTypes {
		for _, c := range cases {
			x := random(s.r, dt, c.from, distAny)
			to, err := kernels.ResolveReshape(c.to, x.numel())
			if err != nil {
				s.t.Fatal(err)
			}
			y := newHost(dt, to)
			y.f, y.i = x.f, x.i
			s.run(&kernels.Op{Name: kernels.OpReshape, Shape: c.to}, exact(y), x)
		}
	}
}

// castValues are the float inputs of the cast tests: specials, halfway
// cases of every rounding, saturation and wrap-around boundaries.
var castValues = []float64{
	math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 0.5, -0.5, 1.5, -1.5, 2.5, -2.7,
	255, 255.9, 256, 300, -1, -129, 127.5, 1e10, -1e10, 3e9, -3e9, 1e20, -1e20, 3.4e38, 1e-30,
	1 + 0x1p-11, 1 + 3*0x1p-11, 1 + 0x1p-8, 1 + 3*0x1p-8, 65504, 65519, 65520, 1e5, 6e-8, 3e-8, 1e-40,
	1 + 0x1p-24, 1 + 0x1p-23 + 0x1p-24, 16777217, 2147483647, 2147483648, -2147483649,
	9.3e18, -9.3e18, 0x1p63, -0x1p63,
}

// castInts are the integer inputs of the cast tests.
var castInts = []int64{0, 1, -1, 2, 127, 128, 255, 256, -129, 65504, 65520, 1 << 24, 1<<24 + 1,
	math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, 1<<53 + 1, math.MaxInt64, math.MinInt64,
	1<<62 + 1<<38 + 1, -(1<<40 + 1<<31 + 1)}

func (s *suite) cast() {
	for _, from := range allDTypes {
		// The values, as they exist in dtype from.
		var x *host
		if from.IsFloat() {
			v := slices.Clone(castValues)
			for range 40 {
				v = append(v, (s.r.Float64()*2-1)*300)
			}
			x = fromFloat64(from, []int{len(v)}, v)
		} else {
			x = newHost(from, []int{len(castInts) + 40})
			for j := range x.i {
				if j < len(castInts) {
					x.i[j] = wrap(castInts[j], from)
				} else {
					x.i[j] = wrap(s.r.Int64N(1000)-500, from)
				}
			}
		}
		for _, to := range allDTypes {
			op := &kernels.Op{Name: kernels.OpCast, DType: to}
			s.run(op, exact(refCast(x, to)), x)
		}
		// Empty and large.
		for _, sh := range [][]int{{0}, {2, 0}, {300, 200}} {
			x := random(s.r, from, sh, distAny)
			for _, to := range []kernels.DType{kernels.Float32, kernels.Int32, kernels.Float16, kernels.Bool} {
				s.run(&kernels.Op{Name: kernels.OpCast, DType: to}, exact(refCast(x, to)), x)
			}
		}
	}
}

func (s *suite) full() {
	values := []float64{1.5, -2.75, 0, 1e10, -1e10, math.NaN(), math.Inf(-1), 300, 1 + 0x1p-11, s.r.NormFloat64()}
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		for _, sh := range [][]int{{}, {3, 4}, {0}, {7}, {300, 129}} {
			for _, v := range values {
				op := &kernels.Op{Name: kernels.OpFull, Shape: sh, Value: v, DType: dt}
				out := dt
				if out == kernels.Invalid {
					out = kernels.Float32
				}
				vals := make([]float64, kernels.Numel(sh))
				for j := range vals {
					vals[j] = v
				}
				s.run(op, exact(fromFloat64(out, sh, vals)))
			}
		}
	}
}

func (s *suite) arange() {
	ranges := [][3]float64{{0, 10, 1}, {5, -5, -1.5}, {0, 1, 0.1}, {0, 0, 1}, {3, 1, 1}, {-3.5, 300, 0.25},
		{0, 70000, 1}, {1e6, 1e6 + 5, 0.3}}
	for _, dt := range append([]kernels.DType{kernels.Invalid}, allDTypes...) {
		for _, rg := range ranges {
			op := &kernels.Op{Name: kernels.OpArange, Start: rg[0], Stop: rg[1], Step: rg[2], DType: dt}
			n, err := kernels.ArangeLen(rg[0], rg[1], rg[2])
			if err != nil {
				s.t.Fatal(err)
			}
			vals := make([]float64, n)
			for j := range vals {
				vals[j] = rg[0] + float64(j)*rg[2]
			}
			out := dt
			if out == kernels.Invalid {
				out = kernels.Float32
			}
			s.run(op, exact(fromFloat64(out, []int{n}, vals)))
		}
	}
}

// random checks uniform and normal bit for bit against the generator's
// definition, rounded once from float64.
func (s *suite) random() {
	for _, name := range []string{kernels.OpUniform, kernels.OpNormal} {
		for _, dt := range []kernels.DType{kernels.Invalid, kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
			for _, sh := range [][]int{{}, {1000}, {0}, {3, 5, 7}, {100000}} {
				op := &kernels.Op{Name: name, Shape: sh, DType: dt, Seed: s.r.Uint64(), Key: s.r.Uint64()}
				op.Low, op.High = -s.r.Float64()*3, s.r.Float64()*5
				op.Mean, op.Std = s.r.NormFloat64(), s.r.Float64()*2
				vals := make([]float64, kernels.Numel(sh))
				for j := range vals {
					if name == kernels.OpUniform {
						vals[j] = kernels.UniformAt(op.Seed, op.Key, uint64(j), op.Low, op.High)
					} else {
						vals[j] = kernels.NormalAt(op.Seed, op.Key, uint64(j), op.Mean, op.Std)
					}
				}
				out := dt
				if out == kernels.Invalid {
					out = kernels.Float32
				}
				s.run(op, exact(fromFloat64(out, sh, vals)))
			}
		}
	}
}

func (s *suite) isnan() {
	op := &kernels.Op{Name: kernels.OpIsNaN}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt)) {
			continue
		}
		for _, sh := range unaryShapes {
			x := random(s.r, dt, sh, distAny)
			sprinkle(s.r, x)
			y := newHost(kernels.Bool, sh)
			for j := range y.i {
				if x.f != nil && math.IsNaN(x.f[j]) {
					y.i[j] = 1
				}
			}
			s.run(op, exact(y), x)
		}
	}
}

// few draws from a handful of small values, so that comparisons meet
// equal elements often.
func few(s *suite, dt kernels.DType, shape []int) *host {
	h := newHost(dt, shape)
	for j := range h.numel() {
		v := int64(s.r.IntN(5)) - 2
		switch dt {
		case kernels.Bool:
			v = int64(s.r.IntN(2))
		case kernels.Uint8:
			v += 2
		}
		if h.f != nil {
			h.f[j] = float64(v) / 2
		} else {
			h.i[j] = v
		}
	}
	return h
}

func (s *suite) compare(name string) {
	op := &kernels.Op{Name: name}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt), meta(dt)) {
			continue
		}
		for _, sh := range broadcasts {
			a, b := few(s, dt, sh[0]), few(s, dt, sh[1])
			s.run(op, refCompare(name, a, b), a, b)
		}
		a, b := few(s, dt, []int{8, 9}), few(s, dt, []int{8, 9})
		sprinkle(s.r, a)
		sprinkle(s.r, b)
		s.run(op, refCompare(name, a, b), a, b)
	}
}

// ternaries lists operand shapes of where and clamp.
var ternaries = [][3][]int{
	{{3, 4}, {3, 4}, {3, 4}}, {{}, {3, 4}, {3, 4}}, {{3, 4}, {}, {}}, {{3, 1}, {4}, {3, 4}},
	{{2, 1, 4}, {3, 1}, {}}, {{}, {}, {}}, {{0, 4}, {4}, {1}}, {{5}, {2, 1}, {1, 5}},
	{{300, 129}, {300, 129}, {300, 129}}, {{300, 1}, {129}, {}}, {{}, {300, 129}, {129}},
}

func (s *suite) where() {
	op := &kernels.Op{Name: kernels.OpWhere}
	for _, dt := range allDTypes {
		for _, sh := range ternaries {
			c := random(s.r, kernels.Bool, sh[0], distAny)
			a, b := random(s.r, dt, sh[1], distAny), random(s.r, dt, sh[2], distAny)
			sprinkle(s.r, a)
			s.run(op, refWhere(c, a, b), c, a, b)
		}
	}
}

func (s *suite) clamp() {
	op := &kernels.Op{Name: kernels.OpClamp}
	for _, dt := range allDTypes {
		if !s.accepts(op, meta(dt), meta(dt), meta(dt)) {
			continue
		}
		for _, sh := range ternaries {
			x := random(s.r, dt, sh[0], distAny)
			lo, hi := random(s.r, dt, sh[1], distAny), random(s.r, dt, sh[2], distAny)
			if lo.f != nil { // mostly lo < hi, sometimes not
				for j := range lo.f {
					lo.f[j] = -math.Abs(lo.f[j]) / 2
				}
				sprinkle(s.r, x)
			}
			s.run(op, refClamp(x, lo, hi), x, lo, hi)
		}
	}
}

func (s *suite) softmax(name string) {
	cases := []struct {
		shape []int
		axis  int
	}{
		{[]int{5}, 0}, {[]int{5}, -1}, {[]int{1}, 0}, {[]int{3, 4}, 0}, {[]int{3, 4}, 1}, {[]int{3, 4}, -1},
		{[]int{2, 3, 4}, 1}, {[]int{2, 3, 4}, -3}, {[]int{0, 3}, 1}, {[]int{3, 0}, 1}, {[]int{300, 200}, -1},
		{[]int{300, 200}, 0}, {[]int{4, 300, 70}, 1},
	}
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: name}, meta(dt, 2)) {
			continue
		}
		for _, c := range cases {
			op := &kernels.Op{Name: name, Axis: c.axis}
			x := random(s.r, dt, c.shape, distAny)
			for j := range x.f {
				x.f[j] = roundFloat(x.f[j]*4, dt) // a wider range
			}
			s.run(op, refSoftmax(x, c.axis, name == kernels.OpLogSoftmax), x)
		}
		x := random(s.r, dt, []int{6, 7}, distAny)
		sprinkle(s.r, x)
		for _, axis := range []int{0, 1} {
			op := &kernels.Op{Name: name, Axis: axis}
			s.run(op, refSoftmax(x, axis, name == kernels.OpLogSoftmax), x)
		}
	}
}
