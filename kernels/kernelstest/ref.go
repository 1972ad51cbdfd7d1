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

// unaryFloat is the float64 definition of each float unary op.
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
}

// unaryInt is the definition of each unary op on integers, before
// wrapping to the dtype.
var unaryInt = map[string]func(int64) int64{
	kernels.OpNeg:  func(x int64) int64 { return -x },
	kernels.OpRelu: func(x int64) int64 { return max(x, 0) },
}

func refUnary(name string, x *host) want {
	if x.f != nil {
		f := unaryFloat[name]
		v := make([]float64, x.numel())
		for j := range v {
			v[j] = f(x.f[j])
		}
		t := loose(x.dt)
		if name == kernels.OpNeg || name == kernels.OpRelu || name == kernels.OpSqrt {
			t = tolerances[x.dt]
		}
		return rounded(x.dt, x.shape, v, t)
	}
	f := unaryInt[name]
	y := newHost(x.dt, x.shape)
	for j := range y.i {
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
		return rounded(a.dt, shape, v, tolerances[a.dt])
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
	if name == "argmax" || name == "argmin" {
		y := newHost(kernels.Int64, shape)
		for o, g := range gs {
			best := 0
			for p, j := range g {
				v, b := x.at(j), x.at(g[best])
				if math.IsNaN(b) {
					break
				}
				if math.IsNaN(v) || name == "argmax" && v > b || name == "argmin" && v < b {
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
			case "prod":
				r = 1
				for _, j := range g {
					r *= x.i[j]
				}
			case kernels.OpMax, "min":
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
		case "prod":
			p := 1.0
			for _, j := range g {
				p *= x.f[j]
			}
			v[o], scale[o] = p, math.Abs(p)
		case kernels.OpMax, "min":
			m := x.f[g[0]]
			for _, j := range g {
				e := x.f[j]
				if math.IsNaN(e) {
					m = e
					break
				}
				if name == kernels.OpMax && e > m || name == "min" && e < m {
					m = e
				}
			}
			v[o] = m
		case "logsumexp":
			m := math.Inf(-1)
			for _, j := range g {
				m = math.Max(m, x.f[j])
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
		case "var":
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
