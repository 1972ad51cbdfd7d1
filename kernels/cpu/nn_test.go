package cpu_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// TestNNWireInput gives the convolution, pooling and loss ops random
// shapes and attributes, extreme ones included, as a wire client might:
// Infer must answer with an error or metas, and Exec on what Infer accepts
// must succeed, or fail with kernels.ErrIndex for a target out of range,
// never panic.
func TestNNWireInput(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	b := cpu.New()
	extremes := []int{0, -1, 5, 1 << 24, 1<<24 + 1, math.MaxInt, math.MinInt, math.MaxInt32}
	num := func() int {
		if r.IntN(12) == 0 {
			return extremes[r.IntN(len(extremes))]
		}
		return r.IntN(3)
	}
	pair := func() []int {
		switch r.IntN(8) {
		case 0:
			return nil
		case 1:
			return []int{num()}
		}
		return []int{num(), num()}
	}
	dims := func(n int) []int {
		v := make([]int, n)
		for i := range v {
			v[i] = r.IntN(7)
		}
		return v
	}
	dtypes := []kernels.DType{kernels.Float32, kernels.Float64, kernels.BFloat16, kernels.Int64, kernels.Int32}
	accepted := 0
	for range 40000 {
		op := &kernels.Op{Stride: pair(), Padding: pair(), Dilation: pair(), Kernel: pair(), Groups: num(),
			Reduce: []string{"", "mean", "sum", "none", "max"}[r.IntN(5)]}
		// Shapes that mostly fit the op, from a forward op's output.
		g := 1 + r.IntN(2)
		x := []int{r.IntN(3), g * r.IntN(3), r.IntN(7), r.IntN(7)}
		w := []int{g * r.IntN(3), x[1] / g, 1 + r.IntN(3), 1 + r.IntN(3)}
		var shapes [][]int
		fwdOut := func(name string, ins ...[]int) []int {
			fop := *op
			fop.Name = name
			ms := make([]kernels.Meta, len(ins))
			for i, s := range ins {
				ms[i] = kernels.Meta{DType: kernels.Float32, Shape: s}
			}
			if om, err := kernels.Infer(&fop, ms, kernels.DefaultLimits()); err == nil {
				return om[0].Shape
			}
			return dims(4)
		}
		n, c := r.IntN(4), r.IntN(4)
		switch r.IntN(9) {
		case 0:
			op.Name, shapes = kernels.OpConv2D, [][]int{x, w}
			if r.IntN(2) == 0 {
				shapes = append(shapes, []int{w[0]})
			}
		case 1:
			op.Name, op.Shape, shapes = kernels.OpConv2DInputGrad, x, [][]int{fwdOut(kernels.OpConv2D, x, w), w}
		case 2:
			op.Name, op.Shape, shapes = kernels.OpConv2DWeightGrad, w, [][]int{x, fwdOut(kernels.OpConv2D, x, w)}
		case 3:
			op.Name, shapes = kernels.OpMaxPool2D, [][]int{x}
		case 4:
			op.Name, shapes = kernels.OpMaxPool2DGrad, [][]int{fwdOut(kernels.OpMaxPool2D, x), x}
		case 5:
			op.Name, shapes = kernels.OpAvgPool2D, [][]int{x}
		case 6:
			op.Name, op.Shape, shapes = kernels.OpAvgPool2DGrad, x, [][]int{fwdOut(kernels.OpAvgPool2D, x)}
		case 7:
			op.Name, shapes = kernels.OpCrossEntropy, [][]int{{n, c}, {n}}
		case 8:
			op.Name, shapes = kernels.OpCrossEntropyGrad, [][]int{{n, c}, {n}, {}}
			if op.Reduce == "none" {
				shapes[2] = []int{n}
			}
		}
		if r.IntN(5) == 0 { // and sometimes not
			k := r.IntN(len(shapes))
			shapes[k] = dims(r.IntN(5))
		}
		in := make([]*kernels.Tensor, len(shapes))
		metas := make([]kernels.Meta, len(in))
		for i, shape := range shapes {
			dt := kernels.Float32
			if (op.Name == kernels.OpCrossEntropy || op.Name == kernels.OpCrossEntropyGrad) && i == 1 {
				dt = kernels.Int64
			}
			if r.IntN(10) == 0 {
				dt = dtypes[r.IntN(len(dtypes))]
			}
			m := kernels.Meta{DType: dt, Shape: shape}
			buf, err := b.Alloc(m.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if dt == kernels.Int64 || dt == kernels.Int32 {
				v := make([]float64, m.Numel())
				for j := range v {
					v[j] = float64(r.IntN(c+2) - 1)
				}
				data, _ := kernels.EncodeValues(dt, v)
				if err := b.Upload(buf, data); err != nil {
					t.Fatal(err)
				}
			}
			in[i], metas[i] = &kernels.Tensor{Meta: m, Buf: buf}, m
		}
		outm, err := kernels.Infer(op, metas, kernels.Limits{MaxRank: 8, MaxElements: 1 << 16})
		if err != nil {
			for _, want := range []error{kernels.ErrArity, kernels.ErrShape, kernels.ErrDType, kernels.ErrAttr, kernels.ErrTooLarge} {
				if errors.Is(err, want) {
					err = nil
				}
			}
			if err != nil {
				t.Fatalf("Infer(%+v, %v): %v wraps no sentinel", op, metas, err)
			}
			continue
		}
		accepted++
		out := make([]*kernels.Tensor, len(outm))
		for i, m := range outm {
			buf, err := b.Alloc(m.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			out[i] = &kernels.Tensor{Meta: m, Buf: buf}
		}
		err = b.Exec(op, in, out)
		if err != nil && (!errors.Is(err, kernels.ErrIndex) || strings.Contains(err.Error(), "internal")) {
			t.Fatalf("Exec(%+v, %v): %v", op, metas, err)
		}
	}
	t.Logf("%d of 40000 random ops accepted", accepted)
	if accepted < 500 {
		t.Errorf("only %d of 40000 random ops accepted", accepted)
	}
}
