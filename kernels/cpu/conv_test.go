package cpu

import (
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
