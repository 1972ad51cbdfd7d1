package cpu

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestConvChunks checks that the convolutions give the same results when
// their column matrices are cut into chunks of output rows, of several
// samples, or of one whole sample each as when they are not cut at all
// (which the conformance suite checks against its reference).
func TestConvChunks(t *testing.T) {
	cases := []struct {
		x, w                      []int
		stride, padding, dilation []int
		groups                    int
	}{
		{[]int{3, 4, 9, 7}, []int{6, 2, 3, 3}, []int{2, 1}, []int{1, 2}, []int{1, 2}, 2},
		{[]int{2, 3, 8, 8}, []int{5, 3, 3, 3}, nil, []int{1, 1}, nil, 1},
		{[]int{5, 2, 4, 4}, []int{3, 2, 1, 1}, nil, nil, nil, 1},
	}
	b := New()
	r := rand.New(rand.NewPCG(1, 2))
	// run runs op on float64 inputs of the given shapes.
	run := func(op *kernels.Op, shapes [][]int, ins ...[]float64) []float64 {
		t.Helper()
		var in []*kernels.Tensor
		var metas []kernels.Meta
		for i, v := range ins {
			m := kernels.Meta{DType: kernels.Float64, Shape: shapes[i]}
			buf := &Buffer{data: asBytes(v)}
			in = append(in, &kernels.Tensor{Meta: m, Buf: buf})
			metas = append(metas, m)
		}
		om, err := kernels.Infer(op, metas, kernels.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float64, om[0].Numel())
		out := []*kernels.Tensor{{Meta: om[0], Buf: &Buffer{data: asBytes(y)}}}
		if err := b.Exec(op, in, out); err != nil {
			t.Fatal(err)
		}
		return y
	}
	randn := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64()
		}
		return v
	}
	for _, c := range cases {
		op := kernels.Op{Stride: c.stride, Padding: c.padding, Dilation: c.dilation, Groups: c.groups}
		g, err := kernels.ConvWindow(&op, c.x, c.w)
		if err != nil {
			t.Fatal(err)
		}
		x, w, bias := randn(kernels.Numel(c.x)), randn(kernels.Numel(c.w)), randn(c.w[0])
		dy := randn(kernels.Numel(g.YShape()))
		eval := func() [3][]float64 {
			fwd, ig, wg := op, op, op
			fwd.Name = kernels.OpConv2D
			ig.Name, ig.Shape = kernels.OpConv2DInputGrad, c.x
			wg.Name, wg.Shape = kernels.OpConv2DWeightGrad, c.w
			return [3][]float64{
				run(&fwd, [][]int{c.x, c.w, {c.w[0]}}, x, w, bias),
				run(&ig, [][]int{g.YShape(), c.w}, dy, w),
				run(&wg, [][]int{c.x, g.YShape()}, x, dy),
			}
		}
		want := eval()
		for _, size := range []int{1, 40, 200, kernels.Numel(c.x) * 9} {
			colElems = size
			got := eval()
			colElems = 1 << 20
			for k := range got {
				for j := range got[k] {
					if math.Abs(got[k][j]-want[k][j]) > 1e-12*(1+math.Abs(want[k][j])) {
						t.Fatalf("%v chunks of %d, output %d element %d: %v, want %v", c.x, size, k, j, got[k][j], want[k][j])
					}
				}
			}
		}
	}
}

// TestConvDirect checks the direct float32 convolution and input gradient
// (stride 1, no padding, enough channels) against the column-matrix path
// run in float64 on the same values, on shapes whose channels and pixels
// do not fill the micro-kernel's blocks (the weight gradient, on the
// column path, rides along).
func TestConvDirect(t *testing.T) { checkConvDirect(t) }

func checkConvDirect(t *testing.T) {
	t.Helper()
	cases := []struct{ x, w []int }{
		{[]int{3, 8, 9, 7}, []int{10, 8, 3, 3}},
		{[]int{2, 16, 6, 11}, []int{16, 16, 2, 3}},
		{[]int{20, 9, 5, 5}, []int{13, 9, 3, 3}},
		{[]int{4, 8, 5, 5}, []int{9, 8, 1, 1}},
		{[]int{2, 33, 12, 12}, []int{40, 33, 5, 4}},
	}
	b := New()
	r := rand.New(rand.NewPCG(3, 4))
	run := func(op *kernels.Op, dt kernels.DType, shapes [][]int, ins ...[]float64) []float64 {
		t.Helper()
		var in []*kernels.Tensor
		var metas []kernels.Meta
		for i, v := range ins {
			m := kernels.Meta{DType: dt, Shape: shapes[i]}
			var buf *Buffer
			if dt == kernels.Float32 {
				f := make([]float32, len(v))
				for j, e := range v {
					f[j] = float32(e)
				}
				buf = &Buffer{data: asBytes(f)}
			} else {
				buf = &Buffer{data: asBytes(v)}
			}
			in = append(in, &kernels.Tensor{Meta: m, Buf: buf})
			metas = append(metas, m)
		}
		om, err := kernels.Infer(op, metas, kernels.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		y := make([]float64, om[0].Numel())
		y32 := make([]float32, om[0].Numel())
		out := []*kernels.Tensor{{Meta: om[0], Buf: &Buffer{data: asBytes(y)}}}
		if dt == kernels.Float32 {
			for j := range y32 {
				y32[j] = float32(math.NaN()) // every element must be written
			}
			out[0].Buf = &Buffer{data: asBytes(y32)}
		}
		if err := b.Exec(op, in, out); err != nil {
			t.Fatal(err)
		}
		if dt == kernels.Float32 {
			for j, v := range y32 {
				y[j] = float64(v)
			}
		}
		return y
	}
	randn := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(float32(r.NormFloat64()))
		}
		return v
	}
	for _, c := range cases {
		var op kernels.Op
		g, err := kernels.ConvWindow(&op, c.x, c.w)
		if err != nil {
			t.Fatal(err)
		}
		if p := newConvPlan(g); !p.direct("forward") || !p.direct("input_grad") {
			if _, ok := directKern(); ok {
				t.Fatalf("%v * %v: not on the direct path", c.x, c.w)
			}
		}
		x, w, bias := randn(kernels.Numel(c.x)), randn(kernels.Numel(c.w)), randn(c.w[0])
		dy := randn(kernels.Numel(g.YShape()))
		eval := func(dt kernels.DType) [3][]float64 {
			fwd, ig, wg := op, op, op
			fwd.Name = kernels.OpConv2D
			ig.Name, ig.Shape = kernels.OpConv2DInputGrad, c.x
			wg.Name, wg.Shape = kernels.OpConv2DWeightGrad, c.w
			return [3][]float64{
				run(&fwd, dt, [][]int{c.x, c.w, {c.w[0]}}, x, w, bias),
				run(&ig, dt, [][]int{g.YShape(), c.w}, dy, w),
				run(&wg, dt, [][]int{c.x, g.YShape()}, x, dy),
			}
		}
		want := eval(kernels.Float64)
		got := eval(kernels.Float32)
		directOff = true
		col := eval(kernels.Float32)
		directOff = false
		for k := range got {
			for j := range got[k] {
				tol := 1e-4 * (1 + math.Abs(want[k][j]))
				if math.Abs(got[k][j]-want[k][j]) > tol || math.Abs(col[k][j]-want[k][j]) > tol {
					t.Fatalf("%v * %v, output %d element %d: direct %v, columns %v, want %v", c.x, c.w, k, j, got[k][j], col[k][j], want[k][j])
				}
			}
		}
		again := eval(kernels.Float32)
		for k := range got {
			for j := range got[k] {
				if math.Float64bits(again[k][j]) != math.Float64bits(got[k][j]) {
					t.Fatalf("%v * %v, output %d element %d: %v, then %v", c.x, c.w, k, j, got[k][j], again[k][j])
				}
			}
		}
	}
}

// TestExecRelu checks that conv2d with relu taken as its outputs are
// written gives the bits of conv2d then relu, on the direct path and the
// column path, with and without a bias, and that other ops are declined.
func TestExecRelu(t *testing.T) {
	b := New()
	r := rand.New(rand.NewPCG(5, 6))
	mk := func(dt kernels.DType, shape []int, fill bool) *kernels.Tensor {
		m := kernels.Meta{DType: dt, Shape: shape}
		buf, err := b.Alloc(m.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		for i := range m.Numel() {
			v := math.NaN() // outputs: every element must be written
			if fill {
				v = r.NormFloat64()
			}
			kernels.PutValue(dt, buf.(*Buffer).Host(), i, v)
		}
		return &kernels.Tensor{Meta: m, Buf: buf}
	}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64} {
		for _, c := range []struct{ x, w []int }{
			{[]int{3, 16, 9, 8}, []int{13, 16, 3, 3}}, // direct (float32)
			{[]int{4, 1, 10, 10}, []int{8, 1, 3, 3}},  // columns
		} {
			for _, withBias := range []bool{true, false} {
				in := []*kernels.Tensor{mk(dt, c.x, true), mk(dt, c.w, true)}
				if withBias {
					in = append(in, mk(dt, []int{c.w[0]}, true))
				}
				op := &kernels.Op{Name: kernels.OpConv2D}
				om, err := kernels.Infer(op, []kernels.Meta{in[0].Meta, in[1].Meta}, kernels.DefaultLimits())
				if err != nil {
					t.Fatal(err)
				}
				y, want, got := mk(dt, om[0].Shape, false), mk(dt, om[0].Shape, false), mk(dt, om[0].Shape, false)
				if err := b.Exec(op, in, []*kernels.Tensor{y}); err != nil {
					t.Fatal(err)
				}
				if err := b.Exec(&kernels.Op{Name: kernels.OpRelu}, []*kernels.Tensor{y}, []*kernels.Tensor{want}); err != nil {
					t.Fatal(err)
				}
				if err := b.ExecRelu(op, in, []*kernels.Tensor{got}); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(data(got), data(want)) {
					t.Errorf("%v %v*%v bias %v: conv2d with relu differs from conv2d then relu", dt, c.x, c.w, withBias)
				}
			}
		}
	}
	x, w := mk(kernels.Float32, []int{4, 4}, true), mk(kernels.Float32, []int{4, 4}, true)
	if err := b.ExecRelu(&kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x, w}, []*kernels.Tensor{mk(kernels.Float32, []int{4, 4}, false)}); !errors.Is(err, kernels.ErrNotImplemented) {
		t.Errorf("relu after matmul: %v, want ErrNotImplemented", err)
	}
}
