package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// planOne plans a single elementwise op or reduction as a group of one.
func planOne(op *kernels.Op, in []kernels.Meta) (*ewPlan, error) {
	out, err := kernels.Infer(op, in, noLimits)
	if err != nil {
		return nil, err
	}
	args := make([]int, len(in))
	for i := range args {
		args[i] = i
	}
	g := &kernels.FusedGroup{Inputs: len(in), Ops: []kernels.FusedOp{{Op: *op, Args: args}}, Results: []int{len(in)}}
	return planGroup(g, append(slices.Clone(in), out[0]), 132)
}

// benchChain is 8 elementwise ops on x and a row vector b: with reduce, a
// sum over the last axis follows, and the value after the fourth op is
// also written.
func benchChain(reduce bool) *kernels.FusedGroup {
	op := func(name string, args ...int) kernels.FusedOp {
		return kernels.FusedOp{Op: kernels.Op{Name: name}, Args: args}
	}
	g := &kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{
		op(kernels.OpMul, 0, 1), // 2: x*b
		op(kernels.OpAdd, 2, 0), // 3: x*b + x
		op(kernels.OpRelu, 3),   // 4
		op(kernels.OpSub, 4, 1), // 5
		op(kernels.OpNeg, 5),    // 6
		op(kernels.OpMul, 6, 6), // 7
		op(kernels.OpAdd, 7, 1), // 8
		op(kernels.OpTanh, 8),   // 9
	}, Results: []int{9}}
	if reduce {
		g.Ops = append(g.Ops, kernels.FusedOp{Op: kernels.Op{Name: kernels.OpSum, Axes: []int{-1}}, Args: []int{9}})
		g.Results = []int{10, 5}
	}
	return g
}

func TestBroadcastStrides(t *testing.T) {
	for _, c := range []struct {
		src, dst, want []int
	}{
		{[]int{3, 4}, []int{3, 4}, []int{4, 1}},
		{[]int{4}, []int{3, 4}, []int{0, 1}},
		{[]int{3, 1}, []int{3, 4}, []int{1, 0}},
		{[]int{}, []int{3, 4}, []int{0, 0}},
		{[]int{1, 1}, []int{1, 4}, []int{0, 0}},
	} {
		got, err := broadcastStrides(c.src, c.dst)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("broadcastStrides(%v, %v) = %v, %v; want %v", c.src, c.dst, got, err, c.want)
		}
	}
	if _, err := broadcastStrides([]int{3}, []int{4}); err == nil {
		t.Error("3 broadcast to 4")
	}
}

func TestCollapse(t *testing.T) {
	dims, st := collapse([]int{2, 3, 1, 4}, [][]int{{12, 4, 4, 1}, {0, 0, 0, 1}})
	if !slices.Equal(dims, []int{6, 4}) || !slices.Equal(st[0], []int{4, 1}) || !slices.Equal(st[1], []int{0, 1}) {
		t.Errorf("collapse = %v %v", dims, st)
	}
}

func TestPlanKinds(t *testing.T) {
	f32 := func(s ...int) kernels.Meta { return kernels.Meta{DType: kernels.Float32, Shape: s} }
	p, err := planOne(&kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{f32(8, 16), f32(8, 16)})
	if err != nil || p.spec.rank != 0 || p.spec.leaves[0].kind != leafFull {
		t.Fatalf("same shapes: %+v %v", p, err)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{f32(8, 16), f32()})
	if p.spec.rank != 0 || p.spec.leaves[1].kind != leafScalar {
		t.Fatalf("scalar: %+v", p.spec)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{f32(2, 8, 16), f32(16)})
	if p.spec.rank != 2 || !p.spec.vec || !slices.Equal(p.dims, []int{16, 16}) || !slices.Equal(p.strides[0], []int{0, 1}) {
		t.Fatalf("row broadcast: %+v dims %v strides %v", p.spec, p.dims, p.strides)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{f32(2, 8, 15), f32(15)})
	if p.spec.rank != 2 || p.spec.vec {
		t.Fatalf("odd rows vectorised: %+v", p.spec)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []kernels.Meta{f32(100000, 64)})
	if p.spec.red.mode != redWarpPerOut || p.grid[0] != 100000/8 {
		t.Fatalf("short rows: %+v grid %v", p.spec.red, p.grid)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []kernels.Meta{f32(64, 1000)})
	if p.spec.red.mode != redBlockPerOut || p.O != 64 || p.R != 1000 {
		t.Fatalf("row sum: %+v O %d R %d", p.spec.red, p.O, p.R)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpSum, Axes: []int{0}}, []kernels.Meta{f32(1000, 64)})
	if p.spec.red.mode != redThreadPerOut || p.O != 64 || p.R != 1000 || p.P < 2 {
		t.Fatalf("column sum: %+v O %d R %d P %d", p.spec.red, p.O, p.R, p.P)
	}
	p, _ = planOne(&kernels.Op{Name: kernels.OpMax}, []kernels.Meta{f32(4, 5, 6)})
	if p.O != 1 || p.R != 120 || len(p.rdims) != 1 {
		t.Fatalf("full max: O %d R %d rdims %v", p.O, p.R, p.rdims)
	}
	// An output of another shape than the domain cannot be fused.
	g := &kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{
		{Op: kernels.Op{Name: kernels.OpExp}, Args: []int{0}},
		{Op: kernels.Op{Name: kernels.OpAdd}, Args: []int{2, 1}},
	}, Results: []int{2, 3}}
	vals, err := kernels.InferFused(g, []kernels.Meta{f32(16), f32(8, 16)}, noLimits)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := planGroup(g, vals, 132); err == nil {
		t.Error("mixed result shapes planned")
	}
}

func TestPlanMatmul(t *testing.T) {
	for _, c := range []struct {
		a, b             []int
		m, count, sA, sB int
		calls            int
	}{
		{[]int{4, 5}, []int{5, 6}, 4, 1, 0, 0, 1},
		{[]int{3, 4, 5}, []int{5, 6}, 12, 1, 0, 0, 1},     // folded
		{[]int{5}, []int{3, 5, 6}, 1, 3, 0, 30, 1},        // A shared
		{[]int{3, 4, 5}, []int{3, 5, 6}, 4, 3, 20, 30, 1}, // batched
		{[]int{2, 1, 4, 5}, []int{1, 3, 5, 6}, 4, 3, 0, 30, 2},
	} {
		p, err := planMatmul(c.a, c.b)
		if err != nil {
			t.Fatal(err)
		}
		if p.m != c.m || p.count != c.count || p.sA != c.sA || p.sB != c.sB || len(p.calls) != c.calls {
			t.Errorf("planMatmul(%v, %v) = %+v", c.a, c.b, p)
		}
	}
}

func TestRandomKey(t *testing.T) {
	// kernels.Random(seed, key, i) == mix64(randomKey(seed, key) ^ i*K).
	for i := uint64(0); i < 100; i++ {
		if got, want := mix64(randomKey(7, 9)^(i*0xbf58476d1ce4e5b9)), kernels.Random(7, 9, i); got != want {
			t.Fatalf("element %d: %x, want %x", i, got, want)
		}
	}
}

func TestSizeClass(t *testing.T) {
	for n, want := range map[int]int{0: 512, 512: 512, 513: 640, 1000: 1024, 1 << 20: 1 << 20, 1<<20 + 1: 1<<20 + 1<<18} {
		if got := sizeClass(n); got != want {
			t.Errorf("sizeClass(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestPlanTranspose(t *testing.T) {
	m := func(s ...int) kernels.Meta { return kernels.Meta{DType: kernels.Float32, Shape: s} }
	p := planTranspose(m(200, 300), []int{1, 0}, m(300, 200))
	if p == nil || p.R != 300 || p.C != 200 || len(p.outer) != 0 {
		t.Fatalf("2D: %+v", p)
	}
	p = planTranspose(m(4, 50, 60), []int{0, 2, 1}, m(4, 60, 50))
	if p == nil || p.R != 60 || p.C != 50 || !slices.Equal(p.outer, []int{4}) || !slices.Equal(p.stride, []int{3000}) {
		t.Fatalf("batched: %+v", p)
	}
	if p := planTranspose(m(4, 50, 60, 3), []int{0, 3, 2, 1}, m(4, 3, 60, 50)); p != nil {
		t.Fatalf("not a transpose of the inner dims: %+v", p)
	}
}

// TestAliasLeaf: a leaf that an output may share memory with is passed
// as a plain pointer, and names another kernel.
func TestAliasLeaf(t *testing.T) {
	m := kernels.Meta{DType: kernels.Float32, Shape: []int{1000}}
	g := &kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{
		{Op: kernels.Op{Name: kernels.OpAdd}, Args: []int{0, 1}},
		{Op: kernels.Op{Name: kernels.OpMul}, Args: []int{2, 0}},
	}, Results: []int{2, 3}}
	p, err := planGroup(g, []kernels.Meta{m, m, m, m}, 132)
	if err != nil {
		t.Fatal(err)
	}
	key := p.spec.key()
	src, err := p.spec.source()
	if err != nil {
		t.Fatal(err)
	}
	p.spec.leaves[1].alias = true
	akey := p.spec.key()
	asrc, err := p.spec.source()
	if err != nil {
		t.Fatal(err)
	}
	if key == akey {
		t.Errorf("the same key with and without an aliased leaf: %s", key)
	}
	for _, c := range []struct {
		src, param string
		want       bool
	}{
		{src, "const float* __restrict__ in1", true},
		{asrc, "const float* __restrict__ in0", true},
		{asrc, "const float* __restrict__ in1", false},
		{asrc, "const float* in1", true},
	} {
		if strings.Contains(c.src, c.param) != c.want {
			t.Errorf("%q in the source: %v, want %v", c.param, !c.want, c.want)
		}
	}
}

// TestPlanReduceVector: a warp- or block-per-output reduction loads whole
// runs where every leaf walks the reduced dim with stride 1 or 0 and the
// runs fall on whole vectors; the order of the fold is the same either way.
func TestPlanReduceVector(t *testing.T) {
	f32 := func(s ...int) kernels.Meta { return kernels.Meta{DType: kernels.Float32, Shape: s} }
	for _, c := range []struct {
		name string
		op   kernels.Op
		in   []kernels.Meta
		mode redMode
		vec  bool
	}{
		{"short rows", kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []kernels.Meta{f32(100000, 64)}, redWarpPerOut, true},
		{"long rows", kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []kernels.Meta{f32(64, 1000)}, redBlockPerOut, true},
		{"odd rows", kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []kernels.Meta{f32(64, 1001)}, redBlockPerOut, false},
		{"odd short rows", kernels.Op{Name: kernels.OpMax, Axes: []int{1}}, []kernels.Meta{f32(100000, 63)}, redWarpPerOut, false},
		{"columns", kernels.Op{Name: kernels.OpSum, Axes: []int{0}}, []kernels.Meta{f32(1000, 64)}, redThreadPerOut, false},
		{"whole tensor", kernels.Op{Name: kernels.OpSum}, []kernels.Meta{f32(4, 5, 8)}, redBlockPerOut, true},
		{"two reduced dims apart", kernels.Op{Name: kernels.OpSum, Axes: []int{0, 2}}, []kernels.Meta{f32(64, 3, 512)}, redBlockPerOut, false},
	} {
		p, err := planOne(&c.op, c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if p.spec.red.mode != c.mode || p.spec.red.vec != c.vec {
			t.Errorf("%s: mode %d vec %t, want %d %t", c.name, p.spec.red.mode, p.spec.red.vec, c.mode, c.vec)
		}
		if p.spec.red.mode == redBlockPerOut && p.chunk%redVec != 0 {
			t.Errorf("%s: chunk %d is not whole runs", c.name, p.chunk)
		}
		src, err := p.spec.source()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if strings.Contains(src, "jf_vec<float, 4> v0") != c.vec {
			t.Errorf("%s: vector loads in the source %t, want %t", c.name, !c.vec, c.vec)
		}
	}
	// A chain over rows with a row vector broadcast, summed per row: both
	// leaves walk the row with stride 1.
	g := &kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{
		{Op: kernels.Op{Name: kernels.OpMul}, Args: []int{0, 1}},
		{Op: kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, Args: []int{2}},
	}, Results: []int{3}}
	vals, err := kernels.InferFused(g, []kernels.Meta{f32(65536, 1024), f32(1024)}, noLimits)
	if err != nil {
		t.Fatal(err)
	}
	p, err := planGroup(g, vals, 132)
	if err != nil {
		t.Fatal(err)
	}
	if !p.spec.red.vec || p.spec.leaves[0].inner != 1 || p.spec.leaves[1].inner != 1 {
		t.Errorf("row chain: vec %t leaves %+v", p.spec.red.vec, p.spec.leaves)
	}
	// A column vector broadcast along the row is one value a run.
	vals, err = kernels.InferFused(g, []kernels.Meta{f32(65536, 1024), f32(65536, 1)}, noLimits)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = planGroup(g, vals, 132); err != nil {
		t.Fatal(err)
	}
	src, _ := p.spec.source()
	if !p.spec.red.vec || p.spec.leaves[1].inner != 0 || !strings.Contains(src, "z1") {
		t.Errorf("column broadcast: vec %t leaves %+v", p.spec.red.vec, p.spec.leaves)
	}
}
