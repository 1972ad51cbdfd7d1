package kernelstest

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

// References of the convolution, pooling and loss ops: direct loops over
// every output and window position in float64, with the geometry worked
// out here rather than taken from kernels.

// window2 is a 2-D window: stride, padding, dilation and kernel per axis.
type window2 struct {
	s, p, d, k [2]int
}

func attrPair(v []int, def [2]int) [2]int {
	if len(v) == 0 {
		return def
	}
	return [2]int{v[0], v[1]}
}

func convWindow2(op *kernels.Op, kh, kw int) window2 {
	return window2{s: attrPair(op.Stride, [2]int{1, 1}), p: attrPair(op.Padding, [2]int{}),
		d: attrPair(op.Dilation, [2]int{1, 1}), k: [2]int{kh, kw}}
}

func poolWindow2(op *kernels.Op) window2 {
	k := attrPair(op.Kernel, [2]int{})
	return window2{s: attrPair(op.Stride, k), p: attrPair(op.Padding, [2]int{}),
		d: attrPair(op.Dilation, [2]int{1, 1}), k: k}
}

// out is the output length along axis a of an input of length n.
func (w window2) out(a, n int) int {
	return (n+2*w.p[a]-w.d[a]*(w.k[a]-1)-1)/w.s[a] + 1
}

// at is the input position of output o, kernel tap i along axis a.
func (w window2) at(a, o, i int) int { return o*w.s[a] - w.p[a] + i*w.d[a] }

func groupsOf(op *kernels.Op) int { return max(op.Groups, 1) }

// convTaps calls f for every output element (n, o, oh, ow) of a
// convolution of an input of shape xs with a weight of shape ws, and
// every tap of it inside the input: input channel c, position ih, iw,
// weight tap (ci, i, j) of o.
func convTaps(op *kernels.Op, xs, ws []int, f func(yj, xj, wj int)) []int {
	w := convWindow2(op, ws[2], ws[3])
	g := groupsOf(op)
	n, c, h, wd := xs[0], xs[1], xs[2], xs[3]
	o, cg := ws[0], ws[1]
	og := o / g
	oh, ow := w.out(0, h), w.out(1, wd)
	for b := range n {
		for oc := range o {
			gi := oc / og
			for y0 := range oh {
				for y1 := range ow {
					yj := ((b*o+oc)*oh+y0)*ow + y1
					for ci := range cg {
						for i := range ws[2] {
							ih := w.at(0, y0, i)
							if ih < 0 || ih >= h {
								continue
							}
							for j := range ws[3] {
								iw := w.at(1, y1, j)
								if iw < 0 || iw >= wd {
									continue
								}
								xj := ((b*c+gi*cg+ci)*h+ih)*wd + iw
								f(yj, xj, ((oc*cg+ci)*ws[2]+i)*ws[3]+j)
							}
						}
					}
				}
			}
		}
	}
	return []int{n, o, oh, ow}
}

// accum is a float64 sum per element with its magnitude and term count,
// for the tolerance.
type accum struct {
	v, scale []float64
	count    []int
}

func newAccum(n int) *accum {
	return &accum{v: make([]float64, n), scale: make([]float64, n), count: make([]int, n)}
}

func (a *accum) add(j int, x float64) {
	a.v[j] += x
	a.scale[j] += math.Abs(x)
	a.count[j]++
}

func (a *accum) want(dt kernels.DType, shape []int) want {
	w := rounded(dt, shape, a.v, tolerances[dt])
	for _, c := range a.count {
		w.terms = max(w.terms, c)
	}
	w.scale = a.scale
	return w
}

// refConv2D is conv2d(x, w[, b]).
func refConv2D(op *kernels.Op, x, w, b *host) want {
	shape := convTaps(op, x.shape, w.shape, func(int, int, int) {})
	a := newAccum(kernels.Numel(shape))
	convTaps(op, x.shape, w.shape, func(yj, xj, wj int) { a.add(yj, x.f[xj]*w.f[wj]) })
	if b != nil {
		per := shape[2] * shape[3]
		for j := range a.v {
			a.add(j, b.f[j/per%shape[1]])
		}
	}
	return a.want(x.dt, shape)
}

// refConv2DInputGrad is dx for dy and w, dx of shape xs.
func refConv2DInputGrad(op *kernels.Op, dy, w *host, xs []int) want {
	a := newAccum(kernels.Numel(xs))
	convTaps(op, xs, w.shape, func(yj, xj, wj int) { a.add(xj, dy.f[yj]*w.f[wj]) })
	return a.want(dy.dt, xs)
}

// refConv2DWeightGrad is dw for x and dy, dw of shape ws.
func refConv2DWeightGrad(op *kernels.Op, x, dy *host, ws []int) want {
	a := newAccum(kernels.Numel(ws))
	convTaps(op, x.shape, ws, func(yj, xj, wj int) { a.add(wj, dy.f[yj]*x.f[xj]) })
	return a.want(x.dt, ws)
}

// poolTaps calls f for every output element of a pooling of an input of
// shape xs with the input positions of its window inside the input, in
// row-major window order.
func poolTaps(op *kernels.Op, xs []int, f func(yj int, xjs []int)) []int {
	w := poolWindow2(op)
	h, wd := xs[2], xs[3]
	oh, ow := w.out(0, h), w.out(1, wd)
	var taps []int
	for pl := range xs[0] * xs[1] {
		for y0 := range oh {
			for y1 := range ow {
				taps = taps[:0]
				for i := range w.k[0] {
					for j := range w.k[1] {
						ih, iw := w.at(0, y0, i), w.at(1, y1, j)
						if ih >= 0 && ih < h && iw >= 0 && iw < wd {
							taps = append(taps, (pl*h+ih)*wd+iw)
						}
					}
				}
				f((pl*oh+y0)*ow+y1, taps)
			}
		}
	}
	return []int{xs[0], xs[1], oh, ow}
}

// firstMax is the element of taps holding the first largest value of x
// (the first NaN if any), or -1 if taps is empty.
func firstMax(x *host, taps []int) int {
	best := -1
	for _, t := range taps {
		switch {
		case best < 0:
			best = t
		case math.IsNaN(x.f[best]):
		case math.IsNaN(x.f[t]) || x.f[t] > x.f[best]:
			best = t
		}
	}
	return best
}

func refMaxPool2D(op *kernels.Op, x *host) want {
	var v []float64
	shape := poolTaps(op, x.shape, func(yj int, taps []int) {
		if k := firstMax(x, taps); k >= 0 {
			v = append(v, x.f[k])
		} else {
			v = append(v, math.Inf(-1))
		}
	})
	return exact(fromFloat64(x.dt, shape, v))
}

func refMaxPool2DGrad(op *kernels.Op, dy, x *host) want {
	a := newAccum(x.numel())
	poolTaps(op, x.shape, func(yj int, taps []int) {
		if k := firstMax(x, taps); k >= 0 {
			a.add(k, dy.f[yj])
		}
	})
	return a.want(x.dt, x.shape)
}

func refAvgPool2D(op *kernels.Op, x *host) want {
	w := poolWindow2(op)
	div := float64(w.k[0] * w.k[1])
	var sums []*accum
	shape := poolTaps(op, x.shape, func(yj int, taps []int) {
		a := newAccum(1)
		for _, t := range taps {
			a.add(0, x.f[t]/div)
		}
		sums = append(sums, a)
	})
	all := newAccum(len(sums))
	for j, a := range sums {
		all.v[j], all.scale[j], all.count[j] = a.v[0], a.scale[0], a.count[0]+1
	}
	return all.want(x.dt, shape)
}

func refAvgPool2DGrad(op *kernels.Op, dy *host, xs []int) want {
	w := poolWindow2(op)
	div := float64(w.k[0] * w.k[1])
	a := newAccum(kernels.Numel(xs))
	poolTaps(op, xs, func(yj int, taps []int) {
		for _, t := range taps {
			a.add(t, dy.f[yj]/div)
		}
	})
	w2 := a.want(dy.dt, xs)
	for j := range w2.scale {
		w2.scale[j] *= 2 // dy/div is rounded once more before it is added
	}
	return w2
}

// refLogSumExp is log(sum(exp(row))).
func refLogSumExp(row []float64) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		if math.IsNaN(v) || v > m {
			m = v
		}
	}
	if math.IsInf(m, 0) || math.IsNaN(m) {
		return m
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(v - m)
	}
	return m + math.Log(s)
}

func refCrossEntropy(op *kernels.Op, logits, target *host) want {
	n, c := logits.shape[0], logits.shape[1]
	loss := make([]float64, n)
	scale := make([]float64, n)
	for i := range n {
		row := logits.f[i*c : (i+1)*c]
		lse := refLogSumExp(row)
		t := row[target.i[i]]
		loss[i] = lse - t
		scale[i] = math.Abs(lse) + math.Abs(t)
	}
	red := op.Reduce
	if red == kernels.ReduceNone {
		w := rounded(logits.dt, []int{n}, loss, loose(logits.dt))
		w.terms, w.scale = c, scale
		return w
	}
	s, sc := 0.0, 0.0
	for i := range n {
		s += loss[i]
		sc += scale[i]
	}
	if red != kernels.ReduceSum {
		s /= float64(n)
		sc /= float64(n)
	}
	w := rounded(logits.dt, []int{}, []float64{s}, loose(logits.dt))
	w.terms, w.scale = n+c, []float64{sc}
	return w
}

func refCrossEntropyGrad(op *kernels.Op, logits, target, dy *host) want {
	n, c := logits.shape[0], logits.shape[1]
	v := make([]float64, n*c)
	scale := make([]float64, n*c)
	for i := range n {
		var g float64
		switch op.Reduce {
		case kernels.ReduceNone:
			g = dy.f[i]
		case kernels.ReduceSum:
			g = dy.f[0]
		default:
			g = dy.f[0] / float64(n)
		}
		row := logits.f[i*c : (i+1)*c]
		lse := refLogSumExp(row)
		for j, x := range row {
			p := math.Exp(x - lse)
			if int64(j) == target.i[i] {
				p--
			}
			v[i*c+j] = p * g
			scale[i*c+j] = (math.Exp(x-lse) + 1) * math.Abs(g) * (1 + math.Abs(x) + math.Abs(lse))
		}
	}
	w := rounded(logits.dt, logits.shape, v, loose(logits.dt))
	w.terms, w.scale = c, scale
	return w
}
