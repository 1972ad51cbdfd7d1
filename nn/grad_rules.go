package nn

import (
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// rule is an op's vector-Jacobian product: given the recorded op n and
// the gradients g of its outputs (nil for an output no gradient reached;
// single-output ops always get g[0]), it returns the gradients of its
// inputs, nil where an input has none. Rules are written with the ops of
// this package, so the gradient program runs on the worker like any
// other; a rule may skip inputs that do not require a gradient
// (n.need(i)).
type rule func(n *node, g []*Tensor) []*Tensor

// zeroGrad lists the float-valued ops whose gradient is zero almost
// everywhere: tensors they make never require a gradient. Ops with bool
// or integer results (comparisons, argmax, one_hot...) never do either.
var zeroGrad = map[string]bool{
	kernels.OpSign: true, kernels.OpFloor: true, kernels.OpCeil: true, kernels.OpRound: true,
}

// rules is the gradient table, keyed by op name. An op of a graph that
// is missing here makes Backward fail with ErrNoRule.
var rules map[string]rule

func init() {
	rules = map[string]rule{
		// Elementwise unary: dx = g · f'(x), written with x and y = f(x).
		kernels.OpNeg:        unary(func(x, y, g *Tensor) *Tensor { return Neg(g) }),
		kernels.OpExp:        unary(func(x, y, g *Tensor) *Tensor { return Mul(g, y) }),
		kernels.OpLog:        unary(func(x, y, g *Tensor) *Tensor { return Div(g, x) }),
		kernels.OpSqrt:       unary(func(x, y, g *Tensor) *Tensor { return Div(ScalarMul(g, 0.5), y) }),
		kernels.OpRsqrt:      unary(func(x, y, g *Tensor) *Tensor { return Mul(g, ScalarMul(Mul(Mul(y, y), y), -0.5)) }),
		kernels.OpReciprocal: unary(func(x, y, g *Tensor) *Tensor { return Neg(Mul(g, Mul(y, y))) }),
		kernels.OpRelu:       unary(func(x, y, g *Tensor) *Tensor { return Mul(g, Sign(y)) }), // y ≥ 0: sign(y) is x > 0
		kernels.OpSigmoid:    unary(func(x, y, g *Tensor) *Tensor { return Mul(g, Mul(y, oneMinus(y))) }),
		kernels.OpTanh:       unary(func(x, y, g *Tensor) *Tensor { return Mul(g, oneMinus(Mul(y, y))) }),
		kernels.OpAbs:        unary(func(x, y, g *Tensor) *Tensor { return Mul(g, Sign(x)) }),
		kernels.OpSin:        unary(func(x, y, g *Tensor) *Tensor { return Mul(g, Cos(x)) }),
		kernels.OpCos:        unary(func(x, y, g *Tensor) *Tensor { return Neg(Mul(g, Sin(x))) }),
		kernels.OpExpm1:      unary(func(x, y, g *Tensor) *Tensor { return Mul(g, AddScalar(y, 1)) }),
		kernels.OpLog1p:      unary(func(x, y, g *Tensor) *Tensor { return Div(g, AddScalar(x, 1)) }),
		kernels.OpErf: unary(func(x, y, g *Tensor) *Tensor {
			return Mul(g, ScalarMul(Exp(Neg(Mul(x, x))), 2/math.Sqrt(math.Pi)))
		}),
		kernels.OpSilu: unary(func(x, y, g *Tensor) *Tensor {
			s := Sigmoid(x) // s · (1 + x · (1 - s))
			return Mul(g, Mul(s, AddScalar(Mul(x, oneMinus(s)), 1)))
		}),
		kernels.OpGelu: unary(func(x, y, g *Tensor) *Tensor {
			// Φ(x) + x·φ(x)
			cdf := ScalarMul(AddScalar(Erf(ScalarMul(x, 1/math.Sqrt2)), 1), 0.5)
			pdf := ScalarMul(Exp(ScalarMul(Mul(x, x), -0.5)), 1/math.Sqrt(2*math.Pi))
			return Mul(g, Add(cdf, Mul(x, pdf)))
		}),
		kernels.OpGeluTanh: unary(func(x, y, g *Tensor) *Tensor {
			// y = x/2 · (1 + tanh(u)), u = c·(x + 0.044715·x³)
			const c, k = 0.7978845608028654, 0.044715
			x2 := Mul(x, x)
			t := Tanh(ScalarMul(Mul(x, AddScalar(ScalarMul(x2, k), 1)), c))
			du := ScalarMul(AddScalar(ScalarMul(x2, 3*k), 1), c)
			d := Add(ScalarMul(AddScalar(t, 1), 0.5), Mul(ScalarMul(x, 0.5), Mul(oneMinus(Mul(t, t)), du)))
			return Mul(g, d)
		}),

		// Elementwise binary: each input's gradient summed back to its shape.
		kernels.OpAdd: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) { return g, g }),
		kernels.OpSub: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) {
			return g, needed(n, 1, func() *Tensor { return Neg(g) })
		}),
		kernels.OpMul: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) {
			return needed(n, 0, func() *Tensor { return Mul(g, b) }), needed(n, 1, func() *Tensor { return Mul(g, a) })
		}),
		kernels.OpDiv: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) {
			return needed(n, 0, func() *Tensor { return Div(g, b) }),
				needed(n, 1, func() *Tensor { return Neg(Div(Mul(g, y), b)) })
		}),
		kernels.OpPow: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) {
			return needed(n, 0, func() *Tensor { return Mul(g, Mul(b, Pow(a, AddScalar(b, -1)))) }),
				needed(n, 1, func() *Tensor { return Mul(g, Mul(y, Log(a))) })
		}),
		kernels.OpMod: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) {
			return g, needed(n, 1, func() *Tensor { return Neg(Mul(g, Floor(Div(a, b)))) })
		}),
		kernels.OpMaximum: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) { return minmax(a, b, g, Gt) }),
		kernels.OpMinimum: binary(func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor) { return minmax(a, b, g, Lt) }),

		kernels.OpWhere: whereRule,
		kernels.OpClamp: clampRule,

		// Reductions.
		kernels.OpSum:       reduction(func(x *Tensor, yk func() *Tensor, gk *Tensor, axes []int) *Tensor { return Expand(gk, x.meta.Shape...) }),
		kernels.OpMean:      reduction(meanGrad),
		kernels.OpMax:       reduction(extremumGrad),
		kernels.OpMin:       reduction(extremumGrad),
		kernels.OpLogsumexp: reduction(func(x *Tensor, yk func() *Tensor, gk *Tensor, axes []int) *Tensor { return Mul(gk, Exp(Sub(x, yk()))) }),
		kernels.OpProd:      reduction(prodGrad),
		kernels.OpVar:       varRule,

		kernels.OpSoftmax: unary(func(x, y, g *Tensor) *Tensor {
			return Mul(y, Sub(g, Sum(Mul(g, y), []int{y.node.op.k.Axis}, true)))
		}),
		kernels.OpLogSoftmax: unary(func(x, y, g *Tensor) *Tensor {
			return Sub(g, Mul(Exp(y), Sum(g, []int{y.node.op.k.Axis}, true)))
		}),

		kernels.OpMatmul: matmulRule,

		// Movement.
		kernels.OpReshape:   unary(func(x, y, g *Tensor) *Tensor { return Reshape(g, x.meta.Shape...) }),
		kernels.OpSqueeze:   unary(func(x, y, g *Tensor) *Tensor { return Reshape(g, x.meta.Shape...) }),
		kernels.OpUnsqueeze: unary(func(x, y, g *Tensor) *Tensor { return Reshape(g, x.meta.Shape...) }),
		kernels.OpExpand:    unary(func(x, y, g *Tensor) *Tensor { return sumTo(g, x.meta.Shape) }),
		kernels.OpPermute: unary(func(x, y, g *Tensor) *Tensor {
			perm := y.node.op.k.Perm
			inv := make([]int, len(perm))
			for i, p := range perm {
				if p < 0 {
					p += len(perm)
				}
				inv[p] = i
			}
			return Permute(g, inv...)
		}),
		kernels.OpFlip: unary(func(x, y, g *Tensor) *Tensor { return Flip(g, y.node.op.k.Axes...) }),
		kernels.OpTril: unary(func(x, y, g *Tensor) *Tensor { return Tril(g, y.node.op.k.K) }),
		kernels.OpTriu: unary(func(x, y, g *Tensor) *Tensor { return Triu(g, y.node.op.k.K) }),
		kernels.OpPad: unary(func(x, y, g *Tensor) *Tensor {
			pads := y.node.op.k.Pads
			starts, ends := make([]int, len(x.meta.Shape)), make([]int, len(x.meta.Shape))
			for i, d := range x.meta.Shape {
				starts[i], ends[i] = pads[2*i], pads[2*i]+d
			}
			return Slice(g, starts, ends, nil)
		}),
		kernels.OpSlice:  sliceRule,
		kernels.OpConcat: concatRule,
		kernels.OpStack:  stackRule,
		kernels.OpSplit:  splitRule,
		kernels.OpCast: unary(func(x, y, g *Tensor) *Tensor {
			if !x.meta.DType.IsFloat() {
				return nil
			}
			return Cast(g, x.meta.DType)
		}),

		// Indexing: the index inputs have no gradient.
		kernels.OpGather: func(n *node, g []*Tensor) []*Tensor {
			x, idx := n.in[0], n.in[1]
			return []*Tensor{ScatterAdd(zerosLike(x), n.op.k.Axis, idx, g[0])}
		},
		kernels.OpIndexSelect: func(n *node, g []*Tensor) []*Tensor {
			x, idx := n.in[0], n.in[1]
			axis, _ := kernels.NormAxis("index_select", n.op.k.Axis, len(x.meta.Shape))
			shape := make([]int, len(x.meta.Shape))
			for i := range shape {
				shape[i] = 1
			}
			shape[axis] = idx.meta.Shape[0]
			full := Expand(Reshape(idx, shape...), g[0].meta.Shape...)
			return []*Tensor{ScatterAdd(zerosLike(x), axis, full, g[0])}
		},
		kernels.OpScatterAdd: func(n *node, g []*Tensor) []*Tensor {
			return []*Tensor{g[0], nil, needed(n, 2, func() *Tensor { return Gather(g[0], n.op.k.Axis, n.in[1]) })}
		},

		kernels.OpLayerNorm: normRule(true),
		kernels.OpRMSNorm:   normRule(false),

		// Convolution, pooling, cross-entropy: their own gradient ops.
		kernels.OpConv2D: func(n *node, g []*Tensor) []*Tensor {
			x, w := n.in[0], n.in[1]
			out := []*Tensor{
				needed(n, 0, func() *Tensor { return conv2dInputGrad(g[0], w, x.meta.Shape, &n.op.k) }),
				needed(n, 1, func() *Tensor { return conv2dWeightGrad(x, g[0], w.meta.Shape, &n.op.k) }),
			}
			if len(n.in) == 3 {
				out = append(out, needed(n, 2, func() *Tensor { return Sum(g[0], []int{0, 2, 3}, false) }))
			}
			return out
		},
		kernels.OpMaxPool2D: func(n *node, g []*Tensor) []*Tensor {
			return []*Tensor{maxPool2dGrad(g[0], n.in[0], &n.op.k)}
		},
		kernels.OpAvgPool2D: func(n *node, g []*Tensor) []*Tensor {
			return []*Tensor{avgPool2dGrad(g[0], n.in[0].meta.Shape, &n.op.k)}
		},
		kernels.OpCrossEntropy: func(n *node, g []*Tensor) []*Tensor {
			return []*Tensor{crossEntropyGrad(n.in[0], n.in[1], g[0], &n.op.k)}
		},
	}
}

// need reports whether input i requires a gradient.
func (n *node) need(i int) bool { return i < len(n.in) && n.in[i].reqGrad }

// needed calls f when input i of n requires a gradient.
func needed(n *node, i int, f func() *Tensor) *Tensor {
	if !n.need(i) {
		return nil
	}
	return f()
}

func unary(f func(x, y, g *Tensor) *Tensor) rule {
	return func(n *node, g []*Tensor) []*Tensor { return []*Tensor{f(n.in[0], n.out[0], g[0])} }
}

func binary(f func(a, b, y, g *Tensor, n *node) (*Tensor, *Tensor)) rule {
	return func(n *node, g []*Tensor) []*Tensor {
		a, b := n.in[0], n.in[1]
		ga, gb := f(a, b, n.out[0], g[0], n)
		out := []*Tensor{nil, nil}
		if ga != nil && n.need(0) {
			out[0] = sumTo(ga, a.meta.Shape)
		}
		if gb != nil && n.need(1) {
			out[1] = sumTo(gb, b.meta.Shape)
		}
		return out
	}
}

// sumTo sums g over the axes that broadcasting added to shape or widened
// from 1, giving a tensor of shape.
func sumTo(g *Tensor, shape []int) *Tensor {
	if g.err != nil || slices.Equal(g.meta.Shape, shape) {
		return g
	}
	gs := g.meta.Shape
	lead := len(gs) - len(shape)
	var axes []int
	for i := range gs {
		if i < lead || shape[i-lead] == 1 && gs[i] != 1 {
			axes = append(axes, i)
		}
	}
	r := g
	if len(axes) > 0 {
		// Leading axes alone are summed away; others are kept as 1.
		r = Sum(g, axes, axes[len(axes)-1] >= lead)
	}
	if !slices.Equal(r.meta.Shape, shape) {
		r = Reshape(r, shape...)
	}
	return r
}

// mask is cond (bool) as 0 and 1 of like's dtype.
func mask(cond, like *Tensor) *Tensor { return Cast(cond, like.meta.DType) }

func oneMinus(x *Tensor) *Tensor { return Sub(Scalar(x, 1), x) }

func zerosLike(x *Tensor) *Tensor { return Zeros(x.s, x.meta.DType, x.meta.Shape) }

// minmax splits g between a and b: the one that wins (by better) takes
// it, ties give half to each (as PyTorch's maximum and minimum do).
func minmax(a, b, g *Tensor, better func(a, b *Tensor) *Tensor) (*Tensor, *Tensor) {
	wa := Add(mask(better(a, b), g), ScalarMul(mask(Eq(a, b), g), 0.5))
	ga := Mul(g, wa)
	return ga, Sub(g, ga)
}

func whereRule(n *node, g []*Tensor) []*Tensor {
	c, a, b := n.in[0], n.in[1], n.in[2]
	zero := Scalar(g[0], 0)
	return []*Tensor{nil,
		needed(n, 1, func() *Tensor { return sumTo(Where(c, g[0], zero), a.meta.Shape) }),
		needed(n, 2, func() *Tensor { return sumTo(Where(c, zero, g[0]), b.meta.Shape) }),
	}
}

// clampRule follows PyTorch: x takes g where lo <= x <= hi, lo where
// x < lo < hi, hi where x > hi or hi < lo (the result is hi there).
func clampRule(n *node, g []*Tensor) []*Tensor {
	x, lo, hi := n.in[0], n.in[1], n.in[2]
	gy := g[0]
	zero := Scalar(gy, 0)
	pick := func(cond *Tensor, shape []int) *Tensor { return sumTo(Where(cond, gy, zero), shape) }
	return []*Tensor{
		needed(n, 0, func() *Tensor { return pick(And(Ge(x, lo), Le(x, hi)), x.meta.Shape) }),
		needed(n, 1, func() *Tensor { return pick(And(Lt(x, lo), Lt(lo, hi)), lo.meta.Shape) }),
		needed(n, 2, func() *Tensor { return pick(Or(Gt(x, hi), Lt(hi, lo)), hi.meta.Shape) }),
	}
}

// reduction adapts a reduction's rule: f gets x, the output and its
// gradient with the reduced axes kept (so they broadcast against x; the
// output is reshaped only if f asks for it), and the normalised axes.
func reduction(f func(x *Tensor, yk func() *Tensor, gk *Tensor, axes []int) *Tensor) rule {
	return func(n *node, g []*Tensor) []*Tensor {
		x, y := n.in[0], n.out[0]
		axes, _ := kernels.NormAxes(n.op.k.Axes, len(x.meta.Shape))
		keep := kernels.ReduceShape(x.meta.Shape, axes, true)
		gk := g[0]
		yk := func() *Tensor { return y }
		if !slices.Equal(y.meta.Shape, keep) {
			gk = Reshape(g[0], keep...)
			yk = func() *Tensor { return Reshape(y, keep...) }
		}
		return []*Tensor{f(x, yk, gk, axes)}
	}
}

func count(shape, axes []int) int {
	c := 1
	for _, a := range axes {
		c *= shape[a]
	}
	return c
}

func meanGrad(x *Tensor, _ func() *Tensor, gk *Tensor, axes []int) *Tensor {
	c := count(x.meta.Shape, axes)
	if c == 0 {
		return zerosLike(x)
	}
	return Expand(ScalarMul(gk, 1/float64(c)), x.meta.Shape...)
}

// extremumGrad is max's and min's: the gradient is split evenly between
// the elements equal to the result (as PyTorch's amax and amin do).
func extremumGrad(x *Tensor, yk func() *Tensor, gk *Tensor, axes []int) *Tensor {
	m := mask(Eq(x, yk()), x)
	return Mul(gk, Div(m, Sum(m, axes, true)))
}

// prodGrad is the product of the other elements of each group, without
// dividing by a zero: with no zero in the group it is the product over
// x; with one, it is the product of the rest at the zero and 0 elsewhere;
// with more, 0.
func prodGrad(x *Tensor, _ func() *Tensor, gk *Tensor, axes []int) *Tensor {
	zero, one := Scalar(x, 0), Scalar(x, 1)
	isZero := Eq(x, zero)
	safe := Where(isZero, one, x)
	zeros := Sum(mask(isZero, x), axes, true)
	rest := Prod(safe, axes, true) // the product of the nonzero elements
	d := Where(Eq(zeros, zero), Div(rest, safe), Where(And(isZero, Eq(zeros, one)), rest, zero))
	return Mul(gk, d)
}

func varRule(n *node, g []*Tensor) []*Tensor {
	return reduction(func(x *Tensor, _ func() *Tensor, gk *Tensor, axes []int) *Tensor {
		d := count(x.meta.Shape, axes) - n.op.k.Correction
		xc := Sub(x, Mean(x, axes, true))
		return Mul(gk, ScalarMul(xc, 2/float64(d)))
	})(n, g)
}

// matmulRule: dA = g·Bᵀ and dB = Aᵀ·g on the operands made at least
// rank 2 (a vector a is a row, a vector b a column), summed over the
// batch dims that broadcasting added.
func matmulRule(n *node, g []*Tensor) []*Tensor { return matmulGrads(n, g, n.need(0), n.need(1)) }

// matmulGrads is matmulRule for the inputs asked for.
func matmulGrads(n *node, g []*Tensor, da, db bool) []*Tensor {
	a, b := n.in[0], n.in[1]
	as, bs := a.meta.Shape, b.meta.Shape
	a2, b2 := a, b
	if len(as) == 1 {
		a2 = Reshape(a, 1, as[0])
	}
	if len(bs) == 1 {
		b2 = Reshape(b, bs[0], 1)
	}
	batch, m, _, nn, _, _ := kernels.MatmulShapes(as, bs)
	g2 := g[0]
	if len(as) == 1 || len(bs) == 1 {
		g2 = Reshape(g2, append(slices.Clone(batch), m, nn)...)
	}
	out := []*Tensor{nil, nil}
	if da {
		out[0] = reshapeTo(sumTo(Matmul(g2, transposed(b2)), a2.meta.Shape), as)
	}
	if db {
		out[1] = reshapeTo(sumTo(Matmul(transposed(a2), g2), b2.meta.Shape), bs)
	}
	return out
}

// matmulTransposedWeight serves y = a·wᵀ of matrices, where wᵀ is a
// transpose of w (a Linear layer): if w needs a gradient, it returns w and
// dw = gᵀ·a, which is the transpose of wᵀ's gradient aᵀ·g, computed
// without transposing a, nor the result back. Otherwise it returns nils.
func matmulTransposedWeight(n *node, g []*Tensor) (w, gw *Tensor) {
	if n.op.k.Name != kernels.OpMatmul || len(n.in) != 2 {
		return nil, nil
	}
	a, b := n.in[0], n.in[1]
	bn := b.node
	if len(a.meta.Shape) != 2 || len(b.meta.Shape) != 2 || bn == nil || bn.op.k.Name != kernels.OpPermute || len(bn.in) != 1 {
		return nil, nil
	}
	w = bn.in[0]
	if !w.reqGrad || w.err != nil || w.freed || !isLastSwap(bn.op.k.Perm) {
		return nil, nil
	}
	return w, Matmul(Transpose(g[0], 0, 1), a)
}

// transposed is x with its last two axes swapped. When x was made so from
// a tensor (Linear's transposed weight), that tensor is it, and no copy is
// made.
func transposed(x *Tensor) *Tensor {
	if n := x.node; n != nil && n.op.k.Name == kernels.OpPermute && len(n.in) == 1 {
		if src := n.in[0]; src.err == nil && !src.freed && isLastSwap(n.op.k.Perm) {
			return src
		}
	}
	return Transpose(x, -1, -2)
}

// isLastSwap reports whether perm swaps the last two axes and keeps the
// others.
func isLastSwap(perm []int) bool {
	r := len(perm)
	if r < 2 || perm[r-1] != r-2 || perm[r-2] != r-1 {
		return false
	}
	for i, p := range perm[:r-2] {
		if p != i {
			return false
		}
	}
	return true
}

// reshapeTo is x reshaped to shape, or x itself when it has that shape.
func reshapeTo(x *Tensor, shape []int) *Tensor {
	if x.err == nil && slices.Equal(x.meta.Shape, shape) {
		return x
	}
	return Reshape(x, shape...)
}

// sliceRule scatters g back into zeros of x's shape: axes sliced
// backwards are flipped, steps over 1 are undone by interleaving zeros
// (unsqueeze, pad, reshape), and one pad places the result.
func sliceRule(n *node, g []*Tensor) []*Tensor {
	x, gy := n.in[0], g[0]
	start, step, cnt, err := kernels.SliceRanges(&n.op.k, x.meta.Shape)
	if err != nil {
		return []*Tensor{failed(x.s, err)}
	}
	if slices.Contains(cnt, 0) {
		return []*Tensor{zerosLike(x)}
	}
	var flip []int
	for i, s := range step {
		if s < 0 {
			flip = append(flip, i)
		}
	}
	if len(flip) > 0 {
		gy = Flip(gy, flip...)
	}
	pads := make([]int, 2*len(step))
	for i, s := range step {
		lo, abs := start[i], s
		if s < 0 {
			lo, abs = start[i]+(cnt[i]-1)*s, -s
		}
		span := (cnt[i]-1)*abs + 1
		if abs > 1 && cnt[i] > 1 {
			sh := gy.meta.Shape
			gy = Unsqueeze(gy, i+1)
			wide := make([]int, 2*len(gy.meta.Shape))
			wide[2*(i+1)+1] = abs - 1
			gy = Pad(gy, wide, 0)
			flat := slices.Clone(sh)
			flat[i] = cnt[i] * abs
			gy = Reshape(gy, flat...)
			ends := slices.Clone(flat)
			ends[i] = span
			gy = Slice(gy, nil, ends, nil)
		}
		pads[2*i], pads[2*i+1] = lo, x.meta.Shape[i]-lo-span
	}
	return []*Tensor{Pad(gy, pads, 0)}
}

func concatRule(n *node, g []*Tensor) []*Tensor {
	axis, _ := kernels.NormAxis("concat", n.op.k.Axis, len(n.out[0].meta.Shape))
	if len(n.in) == 1 {
		return []*Tensor{g[0]}
	}
	sizes := make([]int, len(n.in))
	for i, x := range n.in {
		sizes[i] = x.meta.Shape[axis]
	}
	return Split(g[0], axis, sizes...)
}

func stackRule(n *node, g []*Tensor) []*Tensor {
	axis, _ := kernels.NormAxis("stack", n.op.k.Axis, len(n.out[0].meta.Shape))
	shape := n.in[0].meta.Shape
	if len(n.in) == 1 {
		return []*Tensor{Reshape(g[0], shape...)}
	}
	ones := make([]int, len(n.in))
	for i := range ones {
		ones[i] = 1
	}
	parts := Split(g[0], axis, ones...)
	for i, p := range parts {
		parts[i] = Reshape(p, shape...)
	}
	return parts
}

func splitRule(n *node, g []*Tensor) []*Tensor {
	parts := make([]*Tensor, len(g))
	for i, gi := range g {
		if gi == nil {
			gi = zerosLike(n.out[i])
		}
		parts[i] = gi
	}
	if len(parts) == 1 {
		return []*Tensor{parts[0]}
	}
	return []*Tensor{Concat(n.op.k.Axis, parts...)}
}

// normRule recomputes the normalised x̂ and applies
// dx = r · (gw - mean(gw) - x̂ · mean(gw · x̂)) with gw = g · weight and
// r = 1/sqrt(var + eps) (layer_norm), or
// dx = r · (gw - x̂ · mean(gw · x̂)) with r = 1/sqrt(mean(x²) + eps)
// (rms_norm); dweight = sum of g · x̂ and dbias = sum of g over what they
// broadcast.
func normRule(center bool) rule {
	return func(n *node, g []*Tensor) []*Tensor {
		x, gy := n.in[0], g[0]
		k, _ := kernels.NormGroup(&n.op.k, len(x.meta.Shape))
		r := len(x.meta.Shape)
		axes := make([]int, k)
		for i := range axes {
			axes[i] = r - k + i
		}
		xc := x
		if center {
			xc = Sub(x, Mean(x, axes, true))
		}
		rstd := Rsqrt(AddScalar(Mean(Mul(xc, xc), axes, true), n.op.k.Eps))
		xhat := Mul(xc, rstd)
		out := make([]*Tensor, len(n.in))
		gw := gy
		if len(n.in) > 1 {
			gw = Mul(gy, n.in[1])
		}
		if n.need(0) {
			inner := Sub(gw, Mul(xhat, Mean(Mul(gw, xhat), axes, true)))
			if center {
				inner = Sub(inner, Mean(gw, axes, true))
			}
			out[0] = Mul(rstd, inner)
		}
		if len(n.in) > 1 && n.need(1) {
			out[1] = sumTo(Mul(gy, xhat), n.in[1].meta.Shape)
		}
		if len(n.in) > 2 && n.need(2) {
			out[2] = sumTo(gy, n.in[2].meta.Shape)
		}
		return out
	}
}
