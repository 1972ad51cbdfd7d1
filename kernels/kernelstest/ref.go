package kernelstest

import (
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// The references: plain loops in float64, or int64 wrapped to the dtype,
// written for clarity, not speed, and sharing nothing with any backend.

// exact is a want compared without tolerance.
func exact(h *host) want { return want{host: h} }

// rounded makes a float want from unrounded float64 values, rounding them
// to dt, with tolerance t.
func rounded(dt kernels.DType, shape []int, v []float64, t tol) want {
	return want{host: fromFloat64(dt, shape, v), tol: t}
}

// unaryFloat is the float64 definition of each unary op on floats.
var unaryFloat = map[string]func(float64) float64{
	kernels.OpNeg: func(x float64) float64 { return -x },
	kernels.OpRelu: func(x float64) float64 {
		if x < 0 {
			return 0
		}
		return x // NaN stays NaN
	},
	kernels.OpSqrt: math.Sqrt,
	kernels.OpExp:  math.Exp,
	kernels.OpLog:  math.Log,
	kernels.OpTanh: math.Tanh,
	kernels.OpAbs:  math.Abs,
	kernels.OpSign: func(x float64) float64 {
		if x == 0 || math.IsNaN(x) {
			return x
		}
		return math.Copysign(1, x)
	},
	kernels.OpExpm1:      math.Expm1,
	kernels.OpLog1p:      math.Log1p,
	kernels.OpRsqrt:      func(x float64) float64 { return 1 / math.Sqrt(x) },
	kernels.OpReciprocal: func(x float64) float64 { return 1 / x },
	kernels.OpSin:        math.Sin,
	kernels.OpCos:        math.Cos,
	kernels.OpSigmoid:    func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
	kernels.OpSilu:       func(x float64) float64 { return x / (1 + math.Exp(-x)) },
	kernels.OpGelu:       func(x float64) float64 { return x / 2 * math.Erfc(-x/math.Sqrt2) },
	kernels.OpGeluTanh: func(x float64) float64 {
		return x / 2 * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	},
	kernels.OpErf:   math.Erf,
	kernels.OpFloor: math.Floor,
	kernels.OpCeil:  math.Ceil,
	kernels.OpRound: math.RoundToEven,
}

// unaryInt is the definition of each unary op on integers, before
// wrapping to the dtype.
var unaryInt = map[string]func(int64) int64{
	kernels.OpNeg:  func(x int64) int64 { return -x },
	kernels.OpRelu: func(x int64) int64 { return max(x, 0) },
	kernels.OpAbs: func(x int64) int64 {
		if x < 0 {
			return -x
		}
		return x
	},
	kernels.OpSign: func(x int64) int64 {
		switch {
		case x > 0:
			return 1
		case x < 0:
			return -1
		}
		return 0
	},
	kernels.OpNot: func(x int64) int64 { return ^x },
}

// exactUnary: unary ops whose float results are correctly rounded, so
// they get the tight tolerance.
var exactUnary = map[string]bool{
	kernels.OpNeg: true, kernels.OpRelu: true, kernels.OpSqrt: true, kernels.OpAbs: true, kernels.OpSign: true,
	kernels.OpReciprocal: true, kernels.OpFloor: true, kernels.OpCeil: true, kernels.OpRound: true,
}

func refUnary(name string, x *host) want {
	if x.f != nil {
		f := unaryFloat[name]
		v := make([]float64, x.numel())
		for j := range v {
			v[j] = f(x.f[j])
		}
		t := loose(x.dt)
		if exactUnary[name] {
			t = tolerances[x.dt]
		}
		return rounded(x.dt, x.shape, v, t)
	}
	f := unaryInt[name]
	y := newHost(x.dt, x.shape)
	for j := range y.i {
		if x.dt == kernels.Bool { // only not takes bool
			y.i[j] = 1 - x.i[j]
			continue
		}
		y.i[j] = wrap(f(x.i[j]), x.dt)
	}
	return exact(y)
}

// bindex maps flat index j of shape out to the flat index of the element
// of in (right-aligned, size-1 dims broadcast) it reads.
func bindex(j int, out, in []int) int {
	idx, stride := 0, 1
	for k := len(out) - 1; k >= 0; k-- {
		c := j % out[k]
		j /= out[k]
		if i := k - (len(out) - len(in)); i >= 0 {
			if in[i] != 1 {
				idx += c * stride
			}
			stride *= in[i]
		}
	}
	return idx
}

var binaryFloat = map[string]func(a, b float64) float64{
	kernels.OpAdd: func(a, b float64) float64 { return a + b },
	kernels.OpSub: func(a, b float64) float64 { return a - b },
	kernels.OpMul: func(a, b float64) float64 { return a * b },
	kernels.OpDiv: func(a, b float64) float64 { return a / b },
	kernels.OpPow: math.Pow,
	kernels.OpMaximum: func(a, b float64) float64 {
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return math.Max(a, b)
	},
	kernels.OpMinimum: func(a, b float64) float64 {
		if math.IsNaN(a) || math.IsNaN(b) {
			return math.NaN()
		}
		return math.Min(a, b)
	},
	kernels.OpMod: func(a, b float64) float64 {
		r := math.Mod(a, b) // exact, with a's sign
		if r != 0 && math.Signbit(r) != math.Signbit(b) {
			r += b
		}
		return r
	},
}

var binaryInt = map[string]func(a, b int64) int64{
	kernels.OpAdd: func(a, b int64) int64 { return a + b },
	kernels.OpSub: func(a, b int64) int64 { return a - b },
	kernels.OpMul: func(a, b int64) int64 { return a * b },
	kernels.OpDiv: func(a, b int64) int64 {
		if b == 0 {
			return 0
		}
		return a / b
	},
	kernels.OpMaximum: func(a, b int64) int64 { return max(a, b) },
	kernels.OpMinimum: func(a, b int64) int64 { return min(a, b) },
	kernels.OpMod: func(a, b int64) int64 {
		if b == 0 {
			return 0
		}
		r := a % b
		if r != 0 && (r < 0) != (b < 0) {
			r += b
		}
		return r
	},
	kernels.OpAnd: func(a, b int64) int64 { return a & b },
	kernels.OpOr:  func(a, b int64) int64 { return a | b },
	kernels.OpXor: func(a, b int64) int64 { return a ^ b },
}

var compares = map[string]func(a, b float64) bool{
	kernels.OpEq: func(a, b float64) bool { return a == b },
	kernels.OpNe: func(a, b float64) bool { return a != b },
	kernels.OpLt: func(a, b float64) bool { return a < b },
	kernels.OpLe: func(a, b float64) bool { return a <= b },
	kernels.OpGt: func(a, b float64) bool { return a > b },
	kernels.OpGe: func(a, b float64) bool { return a >= b },
}

func refBinary(name string, a, b *host) want {
	shape, err := kernels.BroadcastShapes(a.shape, b.shape)
	if err != nil {
		panic(err)
	}
	n := kernels.Numel(shape)
	if a.f != nil {
		f := binaryFloat[name]
		v := make([]float64, n)
		for j := range v {
			v[j] = f(a.f[bindex(j, shape, a.shape)], b.f[bindex(j, shape, b.shape)])
		}
		t := tolerances[a.dt]
		if name == kernels.OpPow {
			t = loose(a.dt)
		}
		return rounded(a.dt, shape, v, t)
	}
	f := binaryInt[name]
	y := newHost(a.dt, shape)
	for j := range y.i {
		x, z := a.i[bindex(j, shape, a.shape)], b.i[bindex(j, shape, b.shape)]
		y.i[j] = wrap(f(x, z), a.dt)
	}
	return exact(y)
}

// groups splits x's elements by output element of a reduction over axes
// (normalised), each group in row-major order of the reduced axes.
func groups(x *host, axes []int, keepdims bool) (out []int, g [][]int) {
	out = kernels.ReduceShape(x.shape, axes, keepdims)
	g = make([][]int, kernels.Numel(out))
	kept := make([]int, 0, len(x.shape))
	for j := range x.numel() {
		idx := unravel(j, x.shape)
		kept = kept[:0]
		for k, c := range idx {
			if !slices.Contains(axes, k) {
				kept = append(kept, c)
			}
		}
		o := 0
		for k, c := range kept {
			o = o*keptDim(x.shape, axes, k) + c
		}
		g[o] = append(g[o], j)
	}
	return out, g
}

// keptDim is the size of the k-th kept axis.
func keptDim(shape, axes []int, k int) int {
	for i, d := range shape {
		if slices.Contains(axes, i) {
			continue
		}
		if k == 0 {
			return d
		}
		k--
	}
	panic("bad kept axis")
}

func refReduce(name string, x *host, axes []int, keepdims bool, corr int) want {
	ax, err := kernels.NormAxes(axes, len(x.shape))
	if err != nil {
		panic(err)
	}
	shape, gs := groups(x, ax, keepdims)
	if name == kernels.OpArgmax || name == kernels.OpArgmin {
		y := newHost(kernels.Int64, shape)
		for o, g := range gs {
			best := 0
			for p, j := range g {
				var c int // j against the best so far
				if x.f != nil {
					v, b := x.f[j], x.f[g[best]]
					if math.IsNaN(b) {
						break
					}
					if math.IsNaN(v) {
						best = p
						continue
					}
					c = cmpFloat(v, b)
				} else {
					c = cmpInt(x.i[j], x.i[g[best]])
				}
				if name == kernels.OpArgmax && c > 0 || name == kernels.OpArgmin && c < 0 {
					best = p
				}
			}
			y.i[o] = int64(best)
		}
		return exact(y)
	}
	if x.f == nil {
		y := newHost(x.dt, shape)
		for o, g := range gs {
			var r int64
			switch name {
			case kernels.OpSum, kernels.OpMean:
				for _, j := range g {
					r += x.i[j]
				}
				if name == kernels.OpMean && len(g) > 0 {
					r /= int64(len(g))
				}
			case kernels.OpProd:
				r = 1
				for _, j := range g {
					r *= x.i[j]
				}
			case kernels.OpMax, kernels.OpMin:
				r = x.i[g[0]]
				for _, j := range g {
					if name == kernels.OpMax {
						r = max(r, x.i[j])
					} else {
						r = min(r, x.i[j])
					}
				}
			}
			y.i[o] = wrap(r, x.dt)
		}
		return exact(y)
	}
	v := make([]float64, len(gs))
	scale := make([]float64, len(gs))
	terms := 0
	for o, g := range gs {
		terms = max(terms, len(g))
		n := float64(len(g))
		var s, mag float64
		for _, j := range g {
			s += x.f[j]
			mag += math.Abs(x.f[j])
		}
		switch name {
		case kernels.OpSum:
			v[o], scale[o] = s, mag
		case kernels.OpMean:
			v[o], scale[o] = s/n, mag/n
		case kernels.OpProd:
			p := 1.0
			for _, j := range g {
				p *= x.f[j]
			}
			v[o], scale[o] = p, math.Abs(p)
		case kernels.OpMax, kernels.OpMin:
			m := x.f[g[0]]
			for _, j := range g {
				e := x.f[j]
				if math.IsNaN(e) {
					m = e
					break
				}
				if name == kernels.OpMax && e > m || name == kernels.OpMin && e < m {
					m = e
				}
			}
			v[o] = m
		case kernels.OpLogsumexp:
			m := math.Inf(-1)
			for _, j := range g {
				if e := x.f[j]; e > m || math.IsNaN(e) {
					m = e
					if math.IsNaN(e) {
						break
					}
				}
			}
			switch {
			case math.IsNaN(m) || math.IsInf(m, 0):
				v[o] = m
			default:
				e := 0.0
				for _, j := range g {
					e += math.Exp(x.f[j] - m)
				}
				v[o], scale[o] = m+math.Log(e), 1+math.Abs(m)
			}
		case kernels.OpVar:
			mean := s / n
			ss, sq := 0.0, 0.0
			for _, j := range g {
				d := x.f[j] - mean
				ss += d * d
				sq += x.f[j] * x.f[j]
			}
			d := n - float64(corr)
			if d <= 0 {
				v[o] = math.NaN()
				continue
			}
			v[o], scale[o] = ss/d, sq/d
		}
	}
	w := rounded(x.dt, shape, v, loose(x.dt))
	w.terms, w.scale = terms, scale
	return w
}

func refMatmul(a, b *host) want {
	batch, m, k, n, shape, err := kernels.MatmulShapes(a.shape, b.shape)
	if err != nil {
		panic(err)
	}
	// Batch shapes of each operand, with rank-1 operands as matrices.
	ab, bb := []int{}, []int{}
	if len(a.shape) > 2 {
		ab = a.shape[:len(a.shape)-2]
	}
	if len(b.shape) > 2 {
		bb = b.shape[:len(b.shape)-2]
	}
	nb := kernels.Numel(batch)
	y := newHost(a.dt, shape)
	v := make([]float64, kernels.Numel(shape))
	scale := make([]float64, len(v))
	for t := range nb {
		ta, tb := bindex(t, batch, ab), bindex(t, batch, bb)
		for i := range m {
			for j := range n {
				o := (t*m+i)*n + j
				var s, mag float64
				var si int64
				for q := range k {
					ia, ib := (ta*m+i)*k+q, (tb*k+q)*n+j
					if a.f != nil {
						s += a.f[ia] * b.f[ib]
						mag += math.Abs(a.f[ia] * b.f[ib])
					} else {
						si += a.i[ia] * b.i[ib]
					}
				}
				if a.f != nil {
					v[o], scale[o] = s, mag
				} else {
					y.i[o] = wrap(si, a.dt)
				}
			}
		}
	}
	if a.f == nil {
		return exact(y)
	}
	w := rounded(a.dt, shape, v, tolerances[a.dt])
	w.terms, w.scale = k, scale
	return w
}

func refPermute(x *host, perm []int) *host {
	r := len(x.shape)
	p := make([]int, r)
	shape := make([]int, r)
	for i, q := range perm {
		if q < 0 {
			q += r
		}
		p[i] = q
		shape[i] = x.shape[q]
	}
	y := newHost(x.dt, shape)
	stride := make([]int, r)
	s := 1
	for k := r - 1; k >= 0; k-- {
		stride[k] = s
		s *= x.shape[k]
	}
	for j := range y.numel() {
		idx := unravel(j, shape)
		src := 0
		for i, c := range idx {
			src += c * stride[p[i]]
		}
		if y.f != nil {
			y.f[j] = x.f[src]
		} else {
			y.i[j] = x.i[src]
		}
	}
	return y
}

// refCast converts x to dt as the cast op does.
func refCast(x *host, dt kernels.DType) *host {
	y := newHost(dt, x.shape)
	for j := range y.numel() {
		switch {
		case x.f != nil && dt.IsFloat():
			y.f[j] = roundFloat(x.f[j], dt)
		case x.f != nil:
			y.i[j] = floatToInt(x.f[j], dt)
		case dt.IsFloat():
			y.f[j] = intToFloat(x.i[j], dt)
		default:
			y.i[j] = wrap(x.i[j], dt)
		}
	}
	return y
}

// refCompare compares a and b elementwise, broadcasting; integers compare
// exactly (the values used fit in float64).
func refCompare(name string, a, b *host) want {
	shape, err := kernels.BroadcastShapes(a.shape, b.shape)
	if err != nil {
		panic(err)
	}
	f := compares[name]
	y := newHost(kernels.Bool, shape)
	for j := range y.i {
		x, z := a.at(bindex(j, shape, a.shape)), b.at(bindex(j, shape, b.shape))
		if a.i != nil { // exact for every int64
			xi, zi := a.i[bindex(j, shape, a.shape)], b.i[bindex(j, shape, b.shape)]
			x, z = float64(cmpInt(xi, zi)), 0
		}
		if f(x, z) {
			y.i[j] = 1
		}
	}
	return exact(y)
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func refWhere(c, a, b *host) want {
	shape, err := kernels.BroadcastShapes(c.shape, a.shape)
	if err == nil {
		shape, err = kernels.BroadcastShapes(shape, b.shape)
	}
	if err != nil {
		panic(err)
	}
	y := newHost(a.dt, shape)
	for j := range y.numel() {
		src := b
		if c.i[bindex(j, shape, c.shape)] != 0 {
			src = a
		}
		k := bindex(j, shape, src.shape)
		if y.f != nil {
			y.f[j] = src.f[k]
		} else {
			y.i[j] = src.i[k]
		}
	}
	return exact(y)
}

func refClamp(x, lo, hi *host) want {
	shape, err := kernels.BroadcastShapes(x.shape, lo.shape)
	if err == nil {
		shape, err = kernels.BroadcastShapes(shape, hi.shape)
	}
	if err != nil {
		panic(err)
	}
	y := newHost(x.dt, shape)
	for j := range y.numel() {
		a, l, h := bindex(j, shape, x.shape), bindex(j, shape, lo.shape), bindex(j, shape, hi.shape)
		if y.f != nil {
			v := x.f[a]
			switch {
			case math.IsNaN(v) || math.IsNaN(lo.f[l]) || math.IsNaN(hi.f[h]):
				v = math.NaN()
			default:
				v = math.Min(math.Max(v, lo.f[l]), hi.f[h])
			}
			y.f[j] = v
		} else {
			y.i[j] = min(max(x.i[a], lo.i[l]), hi.i[h])
		}
	}
	return exact(y)
}

// refSoftmax is softmax or log_softmax of x over axis, in float64.
func refSoftmax(x *host, axis int, log bool) want {
	r := len(x.shape)
	if axis < 0 {
		axis += r
	}
	n := x.shape[axis]
	inner := kernels.Numel(x.shape[axis+1:])
	v := make([]float64, x.numel())
	scale := make([]float64, len(v))
	for first := range v {
		if first/inner%n != 0 {
			continue // not the first element of its slice along axis
		}
		m := math.Inf(-1)
		for k := range n {
			e := x.f[first+k*inner]
			if math.IsNaN(e) || e > m {
				m = e
			}
		}
		s := 0.0
		for k := range n {
			s += math.Exp(x.f[first+k*inner] - m)
		}
		for k := range n {
			j := first + k*inner
			if log {
				v[j] = x.f[j] - m - math.Log(s)
				scale[j] = math.Abs(x.f[j]) + math.Abs(m) + math.Abs(math.Log(s))
			} else {
				v[j] = math.Exp(x.f[j]-m) / s
				scale[j] = v[j]
			}
		}
	}
	w := rounded(x.dt, x.shape, v, loose(x.dt))
	w.terms, w.scale = n, scale
	return w
}
