package kernelstest

import (
	"github.com/jetfabric/jetfabric/kernels"
)

// Tests of the convolution, pooling and loss ops.

func init() {
	for _, l := range [][]string{kernels.Conv, kernels.Pools, kernels.Losses} {
		for _, name := range l {
			declinable[name] = true
			if _, ok := opTests[name]; !ok {
				opTests[name] = func(s *suite) { s.nnShapes(name) }
			}
		}
	}
	extraInferErrors = append(extraInferErrors, nnInferErrors...)
}

func f32(shape ...int) kernels.Meta { return meta(kernels.Float32, shape...) }

// nnInferErrors are the attribute, shape and dtype errors of the
// convolution, pooling and loss ops.
var nnInferErrors = []struct {
	op   kernels.Op
	in   []kernels.Meta
	want error
}{
	// conv2d
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3), f32(3), f32(3)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{meta(kernels.Int32, 1, 2, 5, 5), meta(kernels.Int32, 3, 2, 3, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), meta(kernels.Float64, 3, 2, 3, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3), meta(kernels.Float64, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 4, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 6, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 0, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3), f32(2)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D, Dilation: []int{3, 1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D, Groups: 2}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 1, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D, Groups: 2}, []kernels.Meta{f32(1, 4, 5, 5), f32(4, 4, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D, Groups: -1}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Stride: []int{1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Stride: []int{0, 1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Stride: []int{1, 1, 1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Padding: []int{-1, 0}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Padding: []int{1 << 40, 0}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Dilation: []int{0, 1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2D, Dilation: []int{1 << 24, 1}}, []kernels.Meta{f32(1, 2, 5, 5), f32(0, 2, 1<<50, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(1<<20, 2, 5, 5), f32(1<<20, 2, 1, 1)}, kernels.ErrTooLarge},
	// conv2d_input_grad
	{kernels.Op{Name: kernels.OpConv2DInputGrad}, []kernels.Meta{f32(1, 3, 3, 3), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 2, 5}}, []kernels.Meta{f32(1, 3, 3, 3), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 2, 6, 6}}, []kernels.Meta{f32(1, 3, 3, 3), f32(3, 2, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 2, 5, 5}}, []kernels.Meta{f32(1, 3, 3, 3), f32(3, 2, 3, 3), f32(3)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 2, 5, 5}}, []kernels.Meta{f32(1, 3, 3, 3), meta(kernels.Float64, 3, 2, 3, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 2, 5, 5}, Stride: []int{2, 0}}, []kernels.Meta{f32(1, 3, 3, 3), f32(3, 2, 3, 3)}, kernels.ErrAttr},
	// conv2d_weight_grad
	{kernels.Op{Name: kernels.OpConv2DWeightGrad}, []kernels.Meta{f32(1, 2, 5, 5), f32(1, 3, 3, 3)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{3, 2, 2, 2}}, []kernels.Meta{f32(1, 2, 5, 5), f32(1, 3, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{3, 2, 3, 3}}, []kernels.Meta{f32(2, 2, 5, 5), f32(1, 3, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{3, 2, 3, 3}}, []kernels.Meta{meta(kernels.Uint8, 1, 2, 5, 5), meta(kernels.Uint8, 1, 3, 3, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{3, 2, 3, 3}, Groups: 2}, []kernels.Meta{f32(1, 2, 5, 5), f32(1, 3, 3, 3)}, kernels.ErrShape},
	// pools
	{kernels.Op{Name: kernels.OpMaxPool2D}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{0, 2}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}, Stride: []int{0, 0}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}, Padding: []int{2, 0}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}, Dilation: []int{1}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{5, 2}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}, []kernels.Meta{f32(2, 4, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}, []kernels.Meta{meta(kernels.Int64, 1, 2, 4, 4)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, []kernels.Meta{f32(1, 2, 3, 2), f32(1, 2, 4, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, []kernels.Meta{f32(1, 2, 2, 2)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, []kernels.Meta{meta(kernels.Float64, 1, 2, 2, 2), f32(1, 2, 4, 4)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAvgPool2D, Kernel: []int{2, 2}, Dilation: []int{2, 2}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpAvgPool2D, Kernel: []int{3, 3}, Padding: []int{1, 2}}, []kernels.Meta{f32(1, 2, 4, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpAvgPool2D, Kernel: []int{2, 2}}, []kernels.Meta{meta(kernels.Bool, 1, 2, 4, 4)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAvgPool2DGrad, Kernel: []int{2, 2}}, []kernels.Meta{f32(1, 2, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpAvgPool2DGrad, Kernel: []int{2, 2}, Shape: []int{1, 2, 4, 4}}, []kernels.Meta{f32(1, 2, 2, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpAvgPool2DGrad, Shape: []int{1, 2, 4, 4}}, []kernels.Meta{f32(1, 2, 2, 2)}, kernels.ErrAttr},
	// losses
	{kernels.Op{Name: kernels.OpCrossEntropy, Reduce: "max"}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 3, 1), meta(kernels.Int64, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 0), meta(kernels.Int64, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 3), f32(4)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{meta(kernels.Int32, 4, 3), meta(kernels.Int32, 4)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 3)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4), f32(4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad, Reduce: kernels.ReduceNone}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4), f32()}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4), meta(kernels.Float64)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad, Reduce: "avg"}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4), f32()}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4)}, kernels.ErrArity},
}

// nnShapes checks the output metas Infer gives the op on valid input.
func (s *suite) nnShapes(name string) {
	for _, c := range nnShapeCases {
		if c.op.Name != name {
			continue
		}
		out, err := kernels.Infer(&c.op, c.in, kernels.DefaultLimits())
		if err != nil {
			s.t.Errorf("Infer(%s, %v): %v", opString(&c.op), c.in, err)
			continue
		}
		if len(out) != 1 || out[0].DType != c.in[0].DType || !equalShape(out[0].Shape, c.want) {
			s.t.Errorf("Infer(%s, %v) = %v, want shape %v", opString(&c.op), c.in, out, c.want)
		}
	}
}

// nnShapeCases are valid ops with the output shape Infer must give.
var nnShapeCases = []struct {
	op   kernels.Op
	in   []kernels.Meta
	want []int
}{
	{kernels.Op{Name: kernels.OpConv2D}, []kernels.Meta{f32(2, 3, 7, 6), f32(4, 3, 3, 2)}, []int{2, 4, 5, 5}},
	{kernels.Op{Name: kernels.OpConv2D, Stride: []int{2, 3}, Padding: []int{1, 2}, Dilation: []int{2, 1}, Groups: 2},
		[]kernels.Meta{f32(1, 4, 9, 8), f32(6, 2, 3, 3), f32(6)}, []int{1, 6, 4, 4}},
	{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: []int{1, 4, 10, 8}, Stride: []int{2, 3}, Padding: []int{1, 2}, Dilation: []int{2, 1}, Groups: 2},
		[]kernels.Meta{f32(1, 6, 4, 4), f32(6, 2, 3, 3)}, []int{1, 4, 10, 8}},
	{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{6, 2, 3, 3}, Stride: []int{2, 3}, Padding: []int{1, 2}, Dilation: []int{2, 1}, Groups: 2},
		[]kernels.Meta{f32(1, 4, 9, 8), f32(1, 6, 4, 4)}, []int{6, 2, 3, 3}},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}, []kernels.Meta{f32(2, 3, 5, 4)}, []int{2, 3, 2, 2}},
	{kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{3, 3}, Stride: []int{1, 2}, Padding: []int{1, 1}, Dilation: []int{2, 1}}, []kernels.Meta{f32(1, 1, 6, 5)}, []int{1, 1, 4, 3}},
	{kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, []kernels.Meta{f32(2, 3, 2, 2), f32(2, 3, 5, 4)}, []int{2, 3, 5, 4}},
	{kernels.Op{Name: kernels.OpAvgPool2D, Kernel: []int{3, 2}, Stride: []int{1, 1}, Padding: []int{1, 1}}, []kernels.Meta{f32(1, 2, 4, 4)}, []int{1, 2, 4, 5}},
	{kernels.Op{Name: kernels.OpAvgPool2DGrad, Kernel: []int{3, 2}, Stride: []int{1, 1}, Padding: []int{1, 1}, Shape: []int{1, 2, 4, 4}}, []kernels.Meta{f32(1, 2, 4, 5)}, []int{1, 2, 4, 4}},
	{kernels.Op{Name: kernels.OpCrossEntropy}, []kernels.Meta{f32(4, 3), meta(kernels.Int64, 4)}, []int{}},
	{kernels.Op{Name: kernels.OpCrossEntropy, Reduce: kernels.ReduceNone}, []kernels.Meta{f32(4, 3), meta(kernels.Int32, 4)}, []int{4}},
	{kernels.Op{Name: kernels.OpCrossEntropyGrad, Reduce: kernels.ReduceSum}, []kernels.Meta{f32(4, 3), meta(kernels.Int32, 4), f32()}, []int{4, 3}},
}
