package nn_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
)

// The gradient check: every rule, on random shapes (broadcasting
// included), in float64 on the CPU backend of a real worker. For each
// case, loss = Σ_j sum(f_j(x) · w_j) with random weights w_j; the
// gradient Backward computes is compared with central differences of
// the same loss, each evaluated on the worker. All cases share one
// session and their results are read at the end, in a few reads.

// valKind says how an input's values are drawn.
type valKind int

const (
	vFloat valKind = iota // uniform in [-2, 2]
	vPos                  // uniform in [0.5, 2]
	vAway                 // |x| in [0.2, 2], either sign: away from kinks at 0
	vBool                 // random bool
	vIndex                // i64 in [0, n)
	vConst                // float, not differentiated
)

type input struct {
	shape []int
	kind  valKind
	n     int // vIndex: the range
}

func fl(shape ...int) input         { return input{shape: shape} }
func pos(shape ...int) input        { return input{shape: shape, kind: vPos} }
func away(shape ...int) input       { return input{shape: shape, kind: vAway} }
func boolean(shape ...int) input    { return input{shape: shape, kind: vBool} }
func cnst(shape ...int) input       { return input{shape: shape, kind: vConst} }
func idx(n int, shape ...int) input { return input{shape: shape, kind: vIndex, n: n} }

func (in input) diff() bool { return in.kind == vFloat || in.kind == vPos || in.kind == vAway }

// gcase is one check: f's outputs on inputs drawn as ins.
type gcase struct {
	name string
	ins  []input
	f    func(x []*nn.Tensor) []*nn.Tensor
	eps  float64 // 0: 1e-6
	tol  float64 // 0: 1e-6 absolute plus 1e-5 relative
	// values, when set, fixes the inputs' values (in order).
	values [][]float64
}

func one(f func(x []*nn.Tensor) *nn.Tensor) func(x []*nn.Tensor) []*nn.Tensor {
	return func(x []*nn.Tensor) []*nn.Tensor { return []*nn.Tensor{f(x)} }
}

// draw returns the values of an input.
func draw(r *rand.Rand, in input) []float64 {
	v := make([]float64, kernels.Numel(in.shape))
	for i := range v {
		switch in.kind {
		case vFloat, vConst:
			v[i] = 4*r.Float64() - 2
		case vPos:
			v[i] = 0.5 + 1.5*r.Float64()
		case vAway:
			v[i] = 0.2 + 1.8*r.Float64()
			if r.IntN(2) == 0 {
				v[i] = -v[i]
			}
		case vBool:
			v[i] = float64(r.IntN(2))
		case vIndex:
			v[i] = float64(r.IntN(in.n))
		}
	}
	return v
}

func (in input) dtype() kernels.DType {
	switch in.kind {
	case vBool:
		return kernels.Bool
	case vIndex:
		return kernels.Int64
	}
	return kernels.Float64
}

// collector gathers tensors to read, flattened, and reads them in a few
// concats at the end.
type collector struct {
	ts  []*nn.Tensor
	off []int
	n   int
}

func (c *collector) add(t *nn.Tensor) int {
	i := len(c.ts)
	if t.DType() != kernels.Float64 {
		t = nn.Cast(t, kernels.Float64)
	}
	c.ts = append(c.ts, nn.Reshape(t, -1))
	c.off = append(c.off, c.n)
	c.n += t.Numel()
	return i
}

// read reads everything collected, then releases it and the graphs it
// came from.
func (c *collector) read(t testing.TB) func(i int) []float64 {
	t.Helper()
	ctx := context.Background()
	all := make([]float64, 0, c.n)
	const chunk = 256
	for lo := 0; lo < len(c.ts); lo += chunk {
		part := c.ts[lo:min(lo+chunk, len(c.ts))]
		cat := nn.Concat(0, part...)
		v, err := cat.Float64s(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		nn.Release(cat)
		all = append(all, v...)
	}
	return func(i int) []float64 {
		end := c.n
		if i+1 < len(c.off) {
			end = c.off[i+1]
		}
		return all[c.off[i]:end]
	}
}

// pending is a case whose results are being computed.
type pending struct {
	name     string
	tol      float64
	eps      float64
	grads    []int // collector index of each differentiated input's gradient
	diffs    [][2][]int
	elements []int
}

// check runs cases on s: it enqueues every case's forward, Backward and
// perturbed forwards, then reads everything and compares.
//
// At the end, when the reads' graphs are released, the worker must hold
// the leaves and nothing else: a rule that leaves a tensor behind fails
// the check.
func check(t *testing.T, s *client.Session, w *worker.Worker, seed uint64, cases []gcase) {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 99))
	var col collector
	var ps []pending
	var leaves []*nn.Tensor
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	base := heldBytes(t, w)
	for _, c := range cases {
		vals := c.values
		if vals == nil {
			vals = make([][]float64, len(c.ins))
			for i, in := range c.ins {
				vals[i] = draw(r, in)
			}
		}
		up := func(i int, v []float64) *nn.Tensor {
			x, err := nn.FromValues(ctx, s, c.ins[i].dtype(), c.ins[i].shape, v)
			if err != nil {
				t.Fatalf("%s: upload: %v", c.name, err)
			}
			leaves = append(leaves, x)
			return x
		}
		xs := make([]*nn.Tensor, len(c.ins))
		for i := range c.ins {
			xs[i] = up(i, vals[i])
			if c.ins[i].diff() {
				xs[i].RequireGrad()
			}
		}
		outs := c.f(xs)
		ws := make([]*nn.Tensor, len(outs))
		for j, o := range outs {
			if o == nil {
				continue
			}
			if err := o.Err(); err != nil {
				t.Fatalf("%s: output %d: %v", c.name, j, err)
			}
			w := make([]float64, o.Numel())
			for k := range w {
				w[k] = 2*r.Float64() - 1
			}
			var err error
			ws[j], err = nn.FromValues(ctx, s, o.DType(), o.Shape(), w)
			if err != nil {
				t.Fatal(err)
			}
			leaves = append(leaves, ws[j])
		}
		lossOf := func(outs []*nn.Tensor) *nn.Tensor {
			var loss *nn.Tensor
			for j, o := range outs {
				if o == nil {
					continue
				}
				l := nn.Sum(nn.Mul(o, ws[j]), nil, false)
				if loss == nil {
					loss = l
				} else {
					loss = nn.Add(loss, l)
				}
			}
			return loss
		}
		loss := lossOf(outs)
		if err := nn.Backward(loss); err != nil {
			t.Fatalf("%s: Backward: %v", c.name, err)
		}
		loss.Free()
		p := pending{name: c.name, tol: c.tol, eps: c.eps}
		if p.eps == 0 {
			p.eps = 1e-6
		}
		for i, x := range xs {
			if !c.ins[i].diff() {
				continue
			}
			if x.Grad() == nil {
				t.Fatalf("%s: input %d has no gradient", c.name, i)
			}
			p.grads = append(p.grads, col.add(x.Grad()))
			leaves = append(leaves, x.Grad())
			// Central differences, element by element.
			var d [2][]int
			for e := range vals[i] {
				for k, sign := range []float64{1, -1} {
					v := slices.Clone(vals[i])
					v[e] += sign * p.eps
					ys := slices.Clone(xs)
					ys[i] = up(i, v)
					d[k] = append(d[k], col.add(lossOf(c.f(ys))))
				}
			}
			p.diffs = append(p.diffs, d)
			p.elements = append(p.elements, len(vals[i]))
		}
		ps = append(ps, p)
	}
	t.Logf("%d cases, %d tensors read", len(ps), len(col.ts))
	get := col.read(t)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var want int64
	for _, x := range leaves {
		want += int64(x.Meta().Bytes())
	}
	expectBytes(t, w, base+want, "after the reads, with only the leaves left (a rule that leaves tensors behind fails here)")
	for _, p := range ps {
		atol, rtol := 1e-6, 1e-5
		if p.tol != 0 {
			atol, rtol = p.tol, 10*p.tol
		}
		for i, gi := range p.grads {
			g := get(gi)
			for e := range p.elements[i] {
				num := (get(p.diffs[i][0][e])[0] - get(p.diffs[i][1][e])[0]) / (2 * p.eps)
				if math.Abs(g[e]-num) > atol+rtol*math.Abs(num) || math.IsNaN(g[e]) {
					t.Errorf("%s: input %d element %d: Backward gives %.9g, central differences %.9g", p.name, i, e, g[e], num)
				}
			}
		}
	}
}

// Random shapes.

func randShape(r *rand.Rand, minRank, maxRank int) []int {
	s := make([]int, minRank+r.IntN(maxRank-minRank+1))
	for i := range s {
		s[i] = 1 + r.IntN(3)
	}
	return s
}

// broadcastPair is two shapes that broadcast together: each is the full
// shape with some leading axes dropped and some axes set to 1.
func broadcastPair(r *rand.Rand) ([]int, []int) {
	full := randShape(r, 0, 3)
	cut := func() []int {
		s := slices.Clone(full[r.IntN(len(full)+1):])
		for i := range s {
			if r.IntN(3) == 0 {
				s[i] = 1
			}
		}
		return s
	}
	return cut(), cut()
}

func randAxes(r *rand.Rand, rank int) []int {
	var axes []int
	for a := range rank {
		if r.IntN(2) == 0 {
			ax := a
			if r.IntN(2) == 0 {
				ax -= rank
			}
			axes = append(axes, ax)
		}
	}
	return axes
}

var unaryOps = []struct {
	name string
	kind func(shape ...int) input
	f    func(*nn.Tensor) *nn.Tensor
}{
	{"neg", fl, nn.Neg}, {"exp", fl, nn.Exp}, {"log", pos, nn.Log}, {"sqrt", pos, nn.Sqrt},
	{"rsqrt", pos, nn.Rsqrt}, {"reciprocal", away, nn.Reciprocal}, {"relu", away, nn.Relu},
	{"gelu", fl, nn.Gelu}, {"gelu_tanh", fl, nn.GeluTanh}, {"silu", fl, nn.Silu},
	{"sigmoid", fl, nn.Sigmoid}, {"tanh", fl, nn.Tanh}, {"abs", away, nn.Abs}, {"sin", fl, nn.Sin},
	{"cos", fl, nn.Cos}, {"erf", fl, nn.Erf}, {"expm1", fl, nn.Expm1}, {"log1p", pos, nn.Log1p},
}

var binaryOps = []struct {
	name string
	a, b func(shape ...int) input
	f    func(a, b *nn.Tensor) *nn.Tensor
}{
	{"add", fl, fl, nn.Add}, {"sub", fl, fl, nn.Sub}, {"mul", fl, fl, nn.Mul}, {"div", fl, away, nn.Div},
	{"pow", pos, fl, nn.Pow}, {"maximum", fl, fl, nn.Maximum}, {"minimum", fl, fl, nn.Minimum},
	{"mod", fl, pos, nn.Mod},
}

// cases builds the suite's cases with shapes drawn from r.
func cases(r *rand.Rand) []gcase {
	var cs []gcase
	add := func(name string, ins []input, f func(x []*nn.Tensor) *nn.Tensor) {
		cs = append(cs, gcase{name: name, ins: ins, f: one(f)})
	}
	for _, u := range unaryOps {
		for range 2 {
			sh := randShape(r, 0, 3)
			add(fmt.Sprintf("%s%v", u.name, sh), []input{u.kind(sh...)}, func(x []*nn.Tensor) *nn.Tensor { return u.f(x[0]) })
		}
	}
	for _, b := range binaryOps {
		for range 3 {
			sa, sb := broadcastPair(r)
			add(fmt.Sprintf("%s%v%v", b.name, sa, sb), []input{b.a(sa...), b.b(sb...)},
				func(x []*nn.Tensor) *nn.Tensor { return b.f(x[0], x[1]) })
		}
	}
	for range 2 {
		sc, sa := broadcastPair(r)
		sb := [][]int{{}, {1}}[r.IntN(2)]
		add(fmt.Sprintf("where%v%v%v", sc, sa, sb), []input{boolean(sc...), fl(sa...), fl(sb...)},
			func(x []*nn.Tensor) *nn.Tensor { return nn.Where(x[0], x[1], x[2]) })
		sx, sl := broadcastPair(r)
		add(fmt.Sprintf("clamp%v%v", sx, sl), []input{fl(sx...), fl(sl...), fl()},
			func(x []*nn.Tensor) *nn.Tensor { return nn.Clamp(x[0], x[1], x[2]) })
	}
	reductions := []struct {
		name string
		f    func(x *nn.Tensor, axes []int, keep bool) *nn.Tensor
	}{
		{"sum", nn.Sum}, {"mean", nn.Mean}, {"max", nn.Max}, {"min", nn.Min}, {"logsumexp", nn.Logsumexp},
		{"var", func(x *nn.Tensor, axes []int, keep bool) *nn.Tensor { return nn.Var(x, axes, 0, keep) }},
		{"prod", nn.Prod},
	}
	for _, red := range reductions {
		for range 3 {
			sh := randShape(r, 1, 3)
			axes, keep := randAxes(r, len(sh)), r.IntN(2) == 0
			add(fmt.Sprintf("%s%v axes %v keep %v", red.name, sh, axes, keep), []input{fl(sh...)},
				func(x []*nn.Tensor) *nn.Tensor { return red.f(x[0], axes, keep) })
		}
	}
	add("var correction 1", []input{fl(3, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Var(x[0], []int{1}, 1, false) })
	for range 2 {
		sh := randShape(r, 1, 3)
		axis := r.IntN(len(sh)) - len(sh)*r.IntN(2)
		add(fmt.Sprintf("softmax%v axis %d", sh, axis), []input{fl(sh...)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Softmax(x[0], axis) })
		add(fmt.Sprintf("log_softmax%v axis %d", sh, axis), []input{fl(sh...)}, func(x []*nn.Tensor) *nn.Tensor { return nn.LogSoftmax(x[0], axis) })
	}
	for _, mm := range [][2][]int{
		{{2, 3}, {3, 4}}, {{2, 1, 2, 3}, {3, 3, 2}}, {{3}, {3, 2}}, {{2, 3}, {3}}, {{3}, {3}},
		{{2, 2, 3}, {3}}, {{3}, {2, 3, 2}}, {{1, 3}, {2, 3, 1}},
	} {
		add(fmt.Sprintf("matmul%v%v", mm[0], mm[1]), []input{fl(mm[0]...), fl(mm[1]...)},
			func(x []*nn.Tensor) *nn.Tensor { return nn.Matmul(x[0], x[1]) })
	}
	add("reshape", []input{fl(2, 3, 2)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Reshape(x[0], 3, -1) })
	add("permute", []input{fl(2, 3, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Permute(x[0], 2, 0, 1) })
	add("permute negative", []input{fl(2, 3, 2)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Permute(x[0], -1, 0, -2) })
	add("transpose", []input{fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Transpose(x[0], 0, 1) })
	add("expand", []input{fl(3, 1)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Expand(x[0], 2, 3, 4) })
	for _, sl := range [][3][]int{
		{{1, 0}, {3, -1}, nil}, {{-1}, {0}, {-1}}, {{0, 3}, {5, -5}, {2, -2}}, {{4, 1}, {0, 4}, {-3, 3}},
		{{5}, {9}, nil},
	} {
		add(fmt.Sprintf("slice %v:%v:%v", sl[0], sl[1], sl[2]), []input{fl(5, 4)},
			func(x []*nn.Tensor) *nn.Tensor { return nn.Slice(x[0], sl[0], sl[1], sl[2]) })
	}
	add("pad", []input{fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Pad(x[0], []int{1, 0, 2, 1}, 0.5) })
	add("concat", []input{fl(2, 1, 2), fl(2, 3, 2), cnst(2, 2, 2)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Concat(-2, x...) })
	add("concat one", []input{fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Concat(0, x...) })
	add("stack", []input{fl(2, 3), fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Stack(1, x...) })
	cs = append(cs, gcase{name: "split", ins: []input{fl(5, 2)}, f: func(x []*nn.Tensor) []*nn.Tensor {
		return nn.Split(x[0], 0, 2, 1, 2)
	}})
	cs = append(cs, gcase{name: "split, one part unused", ins: []input{fl(2, 5)}, f: func(x []*nn.Tensor) []*nn.Tensor {
		p := nn.Split(x[0], -1, 2, 3)
		return []*nn.Tensor{nil, p[1]}
	}})
	add("flip", []input{fl(2, 3, 2)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Flip(x[0], 0, -1) })
	add("squeeze", []input{fl(2, 1, 3, 1)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Squeeze(x[0]) })
	add("unsqueeze", []input{fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Unsqueeze(x[0], 0, 2) })
	add("tril", []input{fl(2, 3, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Tril(x[0], 0) })
	add("triu", []input{fl(3, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Triu(x[0], 1) })
	add("gather", []input{fl(3, 4), idx(3, 2, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Gather(x[0], 0, x[1]) })
	add("gather axis 1", []input{fl(3, 4), idx(4, 3, 5)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Gather(x[0], 1, x[1]) })
	add("index_select", []input{fl(3, 4), idx(4, 5)}, func(x []*nn.Tensor) *nn.Tensor { return nn.IndexSelect(x[0], 1, x[1]) })
	add("index_select axis 0", []input{fl(3, 2), idx(3, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.IndexSelect(x[0], 0, x[1]) })
	add("scatter_add", []input{fl(3, 4), idx(3, 2, 4), fl(2, 4)}, func(x []*nn.Tensor) *nn.Tensor { return nn.ScatterAdd(x[0], 0, x[1], x[2]) })
	for _, ln := range []struct {
		name string
		f    func(x, w, b *nn.Tensor, axes []int, eps float64) *nn.Tensor
	}{{"layer_norm", nn.LayerNorm}, {"rms_norm", nn.RMSNorm}} {
		add(ln.name, []input{fl(2, 5)}, func(x []*nn.Tensor) *nn.Tensor { return ln.f(x[0], nil, nil, nil, 0) })
		add(ln.name+" weight bias", []input{fl(3, 4), fl(4), fl(4)}, func(x []*nn.Tensor) *nn.Tensor { return ln.f(x[0], x[1], x[2], nil, 1e-5) })
		add(ln.name+" two axes", []input{fl(2, 2, 3), fl(2, 3), fl(3)}, func(x []*nn.Tensor) *nn.Tensor { return ln.f(x[0], x[1], x[2], []int{-2, -1}, 1e-3) })
		add(ln.name+" weight", []input{fl(2, 4), fl(4)}, func(x []*nn.Tensor) *nn.Tensor { return ln.f(x[0], x[1], nil, nil, 0) })
		add(ln.name+" bias", []input{fl(2, 4), fl(4)}, func(x []*nn.Tensor) *nn.Tensor { return ln.f(x[0], nil, x[1], nil, 0) })
	}
	cs = append(cs, gcase{name: "cast f32", ins: []input{fl(2, 3)}, eps: 1e-3, tol: 1e-3, f: one(func(x []*nn.Tensor) *nn.Tensor {
		return nn.Cast(nn.Mul(nn.Cast(x[0], kernels.Float32), nn.Cast(x[0], kernels.Float32)), kernels.Float64)
	})})
	// Compositions: a tensor used twice, accumulation across branches,
	// a small network with a softmax loss.
	add("x·x + x", []input{fl(2, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Add(nn.Mul(x[0], x[0]), x[0]) })
	add("a + a (one gradient for two uses)", []input{fl(3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Add(x[0], x[0]) })
	add("mlp", []input{cnst(4, 3), fl(3, 5), fl(5), fl(5, 2), idx(2, 4)}, func(x []*nn.Tensor) *nn.Tensor {
		h := nn.Tanh(nn.Add(nn.Matmul(x[0], x[1]), x[2]))
		lp := nn.LogSoftmax(nn.Matmul(h, x[3]), -1)
		picked := nn.Gather(lp, 1, nn.Reshape(x[4], 4, 1))
		return nn.Neg(nn.Mean(picked, nil, false))
	})
	add("dropout p=0", []input{fl(3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.Dropout(x[0], 0) })
	add("scalar ops", []input{fl(2, 2)}, func(x []*nn.Tensor) *nn.Tensor {
		return nn.PowScalar(nn.AddScalar(nn.ScalarMul(nn.Square(x[0]), 0.5), 1), 1.5)
	})
	return cs
}

// spatialCases are the convolution, pooling and cross-entropy checks.
func spatialCases() []gcase {
	var cs []gcase
	add := func(name string, ins []input, f func(x []*nn.Tensor) *nn.Tensor) {
		cs = append(cs, gcase{name: name, ins: ins, f: one(f)})
	}
	for _, c := range []struct {
		x, w []int
		bias bool
		o    nn.Conv2dOpts
	}{
		{[]int{1, 2, 4, 4}, []int{3, 2, 2, 2}, true, nn.Conv2dOpts{}},
		{[]int{2, 1, 5, 4}, []int{2, 1, 3, 2}, false, nn.Conv2dOpts{Stride: [2]int{2, 1}, Padding: [2]int{1, 0}}},
		{[]int{1, 2, 5, 5}, []int{2, 2, 2, 2}, true, nn.Conv2dOpts{Dilation: [2]int{2, 2}, Padding: [2]int{1, 1}}},
		{[]int{1, 4, 3, 3}, []int{2, 2, 2, 2}, true, nn.Conv2dOpts{Groups: 2, Stride: [2]int{2, 2}, Padding: [2]int{1, 1}}},
	} {
		ins := []input{fl(c.x...), fl(c.w...)}
		if c.bias {
			ins = append(ins, fl(c.w[0]))
		}
		add(fmt.Sprintf("conv2d x%v w%v %+v", c.x, c.w, c.o), ins, func(x []*nn.Tensor) *nn.Tensor {
			var b *nn.Tensor
			if len(x) == 3 {
				b = x[2]
			}
			return nn.Conv2d(x[0], x[1], b, c.o)
		})
	}
	for _, o := range []nn.PoolOpts{
		{Kernel: [2]int{2, 2}},
		{Kernel: [2]int{3, 2}, Stride: [2]int{1, 2}, Padding: [2]int{1, 1}},
		{Kernel: [2]int{2, 2}, Stride: [2]int{1, 1}, Dilation: [2]int{2, 1}},
	} {
		add(fmt.Sprintf("max_pool2d %+v", o), []input{fl(1, 2, 4, 5)}, func(x []*nn.Tensor) *nn.Tensor { return nn.MaxPool2d(x[0], o) })
		if o.Dilation == [2]int{} {
			add(fmt.Sprintf("avg_pool2d %+v", o), []input{fl(2, 1, 4, 5)}, func(x []*nn.Tensor) *nn.Tensor { return nn.AvgPool2d(x[0], o) })
		}
	}
	for _, red := range []string{"", nn.ReduceSum, nn.ReduceNone} {
		add("cross_entropy "+red, []input{fl(3, 4), idx(4, 3)}, func(x []*nn.Tensor) *nn.Tensor { return nn.CrossEntropy(x[0], x[1], red) })
	}
	add("conv net", []input{cnst(2, 1, 6, 6), fl(2, 1, 3, 3), fl(2), fl(8, 3), idx(3, 2)}, func(x []*nn.Tensor) *nn.Tensor {
		h := nn.Relu(nn.Conv2d(x[0], x[1], x[2], nn.Conv2dOpts{Padding: [2]int{1, 1}}))
		h = nn.MaxPool2d(h, nn.PoolOpts{Kernel: [2]int{3, 3}})
		return nn.CrossEntropy(nn.Matmul(nn.Flatten(h, 1), x[3]), x[4], nn.ReduceMean)
	})
	return cs
}

// runs reports whether the worker runs the op that f makes.
func runs(s *client.Session, f func() *nn.Tensor) error {
	y := f()
	_, err := y.Float64s(context.Background())
	nn.Release(y)
	return err
}

// TestGradCheck runs the suite on three draws of shapes and values, in
// one session.
func TestGradCheck(t *testing.T) {
	_, s, w := fabric(t)
	probe := func() *nn.Tensor {
		x := nn.Ones(s, kernels.Float64, []int{1, 1, 2, 2})
		return nn.Conv2d(x, nn.Ones(s, kernels.Float64, []int{1, 1, 1, 1}), nil, nn.Conv2dOpts{})
	}
	spatial := true
	if err := runs(s, probe); err != nil {
		t.Logf("the worker cannot run conv2d (%v): convolution, pooling and cross-entropy not checked", err)
		spatial = false
	}
	for seed := range uint64(3) {
		cs := cases(rand.New(rand.NewPCG(seed, 2)))
		if spatial {
			cs = append(cs, spatialCases()...)
		}
		check(t, s, w, seed, cs)
	}
}
