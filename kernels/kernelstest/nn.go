package kernelstest

import (
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Tests of the convolution, pooling and loss ops.

func init() {
	for _, l := range [][]string{kernels.Conv, kernels.Pools, kernels.Losses} {
		for _, name := range l {
			declinable[name] = true
		}
	}
	for _, name := range kernels.Conv {
		opTests[name] = func(s *suite) { s.nnShapes(name); s.conv(name) }
	}
	for _, name := range kernels.Pools {
		opTests[name] = func(s *suite) { s.nnShapes(name); s.pool(name) }
	}
	for _, name := range kernels.Losses {
		opTests[name] = func(s *suite) { s.nnShapes(name); s.crossEntropy(name) }
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

// convCase is a convolution: input and weight shapes, attributes and
// whether there is a bias.
type convCase struct {
	x, w                      []int
	stride, padding, dilation []int
	groups                    int
	bias                      bool
}

// convCases are fixed convolutions; randomConv adds others.
var convCases = []convCase{
	{[]int{2, 3, 7, 6}, []int{4, 3, 3, 2}, nil, nil, nil, 0, true},
	{[]int{1, 4, 9, 8}, []int{6, 2, 3, 3}, []int{2, 3}, []int{1, 2}, []int{2, 1}, 2, true},
	{[]int{3, 2, 5, 5}, []int{3, 2, 1, 1}, nil, nil, nil, 1, false},
	{[]int{1, 2, 5, 5}, []int{3, 2, 1, 1}, nil, nil, nil, 1, true},
	{[]int{2, 2, 8, 9}, []int{4, 2, 3, 3}, []int{2, 2}, []int{2, 1}, []int{2, 2}, 1, false},
	{[]int{2, 4, 6, 6}, []int{4, 2, 2, 2}, []int{2, 2}, nil, nil, 2, false},
	{[]int{1, 3, 5, 5}, []int{3, 1, 3, 3}, nil, []int{1, 1}, nil, 3, true},
	{[]int{1, 2, 4, 4}, []int{2, 2, 2, 2}, []int{3, 3}, []int{1, 1}, nil, 1, false},
	{[]int{4, 8, 12, 12}, []int{16, 8, 3, 3}, nil, []int{1, 1}, nil, 1, true},
	{[]int{0, 2, 4, 4}, []int{3, 2, 3, 3}, nil, nil, nil, 1, true},
	{[]int{1, 0, 4, 4}, []int{2, 0, 3, 3}, nil, nil, nil, 1, true},
	{[]int{2, 2, 3, 3}, []int{0, 2, 3, 3}, nil, nil, nil, 1, false},
	{[]int{1, 1, 6, 1}, []int{2, 1, 1, 3}, []int{2, 1}, []int{0, 2}, []int{1, 2}, 1, true}, // taps wholly in the padding
}

func (s *suite) conv(name string) {
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: kernels.OpConv2D}, meta(dt, 1, 1, 1, 1), meta(dt, 1, 1, 1, 1)) {
			continue
		}
		for _, c := range append(slices.Clone(convCases), s.randomConv(), s.randomConv(), s.randomConv()) {
			op := &kernels.Op{Name: kernels.OpConv2D, Stride: c.stride, Padding: c.padding, Dilation: c.dilation, Groups: c.groups}
			x, w := random(s.r, dt, c.x, distAny), random(s.r, dt, c.w, distAny)
			ys := convTaps(op, c.x, c.w, func(int, int, int) {})
			switch name {
			case kernels.OpConv2D:
				if c.bias {
					b := random(s.r, dt, []int{c.w[0]}, distAny)
					s.run(op, refConv2D(op, x, w, b), x, w, b)
				} else {
					s.run(op, refConv2D(op, x, w, nil), x, w)
				}
			case kernels.OpConv2DInputGrad:
				op.Name, op.Shape = name, c.x
				dy := random(s.r, dt, ys, distAny)
				s.run(op, refConv2DInputGrad(op, dy, w, c.x), dy, w)
			default:
				op.Name, op.Shape = name, c.w
				dy := random(s.r, dt, ys, distAny)
				s.run(op, refConv2DWeightGrad(op, x, dy, c.w), x, dy)
			}
		}
	}
}

// poolCase is a pooling: input shape and attributes; maxOnly marks the
// attributes avg_pool2d refuses (dilation).
type poolCase struct {
	x                                 []int
	kernel, stride, padding, dilation []int
	maxOnly, sprinkle                 bool
}

// poolCases are fixed poolings; randomPool adds others.
var poolCases = []poolCase{
	{[]int{2, 3, 6, 6}, []int{2, 2}, nil, nil, nil, false, false},
	{[]int{1, 2, 7, 5}, []int{3, 3}, []int{1, 1}, []int{1, 1}, nil, false, true},
	{[]int{2, 2, 9, 8}, []int{3, 2}, []int{2, 1}, []int{1, 1}, []int{2, 1}, true, false},
	{[]int{1, 1, 5, 5}, []int{2, 2}, []int{1, 1}, nil, []int{3, 3}, true, false},
	{[]int{1, 1, 2, 2}, []int{2, 2}, nil, []int{1, 1}, []int{3, 3}, true, false},
	{[]int{2, 2, 5, 7}, []int{3, 1}, []int{2, 3}, []int{1, 0}, nil, false, true},
	{[]int{0, 2, 4, 4}, []int{2, 2}, nil, nil, nil, false, false},
	{[]int{8, 16, 16, 16}, []int{2, 2}, nil, nil, nil, false, false},
	{[]int{2, 3, 4, 4}, []int{4, 4}, []int{1, 1}, []int{2, 2}, nil, false, false},
}

func (s *suite) pool(name string) {
	isMax := name == kernels.OpMaxPool2D || name == kernels.OpMaxPool2DGrad
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{1, 1}}, meta(dt, 1, 1, 1, 1)) {
			continue
		}
		for _, c := range append(slices.Clone(poolCases), s.randomPool(isMax), s.randomPool(isMax), s.randomPool(isMax)) {
			if c.maxOnly && !isMax {
				continue
			}
			op := &kernels.Op{Name: name, Kernel: c.kernel, Stride: c.stride, Padding: c.padding, Dilation: c.dilation}
			x := random(s.r, dt, c.x, distAny)
			if c.sprinkle && name != kernels.OpAvgPool2DGrad {
				sprinkle(s.r, x)
			}
			ys := poolTaps(op, c.x, func(int, []int) {})
			switch name {
			case kernels.OpMaxPool2D:
				s.run(op, refMaxPool2D(op, x), x)
			case kernels.OpAvgPool2D:
				s.run(op, refAvgPool2D(op, x), x)
			case kernels.OpMaxPool2DGrad:
				dy := random(s.r, dt, ys, distAny)
				s.run(op, refMaxPool2DGrad(op, dy, x), dy, x)
			default:
				op.Shape = c.x
				dy := random(s.r, dt, ys, distAny)
				s.run(op, refAvgPool2DGrad(op, dy, c.x), dy)
			}
		}
		if isMax { // ties and repeated maxima across overlapping windows
			x := newHost(dt, []int{1, 2, 4, 5})
			for j := range x.f {
				x.f[j] = float64(j % 3)
			}
			op := &kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{3, 3}, Stride: []int{1, 1}, Padding: []int{1, 1}}
			if name == kernels.OpMaxPool2D {
				s.run(op, refMaxPool2D(op, x), x)
			} else {
				op.Name = name
				dy := random(s.r, dt, []int{1, 2, 4, 5}, distAny)
				s.run(op, refMaxPool2DGrad(op, dy, x), dy, x)
			}
		}
	}
}

func (s *suite) crossEntropy(name string) {
	shapes := [][2]int{{4, 3}, {1, 1}, {0, 5}, {37, 10}, {300, 20}, {3, 1000}}
	for _, dt := range allDTypes {
		if !s.accepts(&kernels.Op{Name: kernels.OpCrossEntropy}, meta(dt, 1, 1), meta(kernels.Int64, 1)) {
			continue
		}
		for _, red := range []string{"", kernels.ReduceMean, kernels.ReduceSum, kernels.ReduceNone} {
			for k, sh := range shapes {
				logits := random(s.r, dt, sh[:], distAny)
				if k == 1 || k == 3 { // a wider range
					for j := range logits.f {
						logits.f[j] = roundFloat(logits.f[j]*20, dt)
					}
				}
				target := s.indices([]int{sh[0]}, sh[1])
				for j := range target.i {
					target.i[j] = int64(target.index(j, sh[1]))
				}
				op := &kernels.Op{Name: name, Reduce: red}
				if name == kernels.OpCrossEntropy {
					s.run(op, refCrossEntropy(op, logits, target), logits, target)
					continue
				}
				var dy *host
				if red == kernels.ReduceNone {
					dy = random(s.r, dt, []int{sh[0]}, distAny)
				} else {
					dy = random(s.r, dt, []int{}, distAny)
				}
				s.run(op, refCrossEntropyGrad(op, logits, target, dy), logits, target, dy)
			}
		}
	}
	logits := random(s.r, kernels.Float32, []int{3, 4}, distAny)
	for _, bad := range []int64{4, -1, math.MaxInt32} {
		for _, dt := range []kernels.DType{kernels.Int32, kernels.Int64} {
			target := newHost(dt, []int{3})
			target.i[1] = bad
			op := &kernels.Op{Name: name}
			if name == kernels.OpCrossEntropy {
				s.fails(op, kernels.ErrIndex, logits, target)
			} else {
				s.fails(op, kernels.ErrIndex, logits, target, random(s.r, kernels.Float32, []int{}, distAny))
			}
		}
	}
}

// nnExecErrors hands Exec convolution, pooling and loss ops whose tensors
// do not fit: each must fail without panicking.
func nnExecErrors(s *suite) {
	b := s.b
	buf, err := b.Alloc(4 * 12)
	if err != nil {
		s.t.Fatal(err)
	}
	defer b.Free(buf)
	f32 := func(shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(kernels.Float32, shape...), Buf: buf}
	}
	i64 := func(shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(kernels.Int64, shape...), Buf: buf}
	}
	ts := func(t ...*kernels.Tensor) []*kernels.Tensor { return t }
	cases := []execCase{
		{"conv2d output shape", kernels.Op{Name: kernels.OpConv2D}, ts(f32(1, 1, 3, 3), f32(1, 1, 2, 2)), ts(f32(1, 1, 3, 3))},
		{"conv2d short input", kernels.Op{Name: kernels.OpConv2D}, ts(f32(1, 2, 4, 4), f32(1, 2, 2, 2)), ts(f32(1, 1, 3, 3))},
		{"conv2d one input", kernels.Op{Name: kernels.OpConv2D}, ts(f32(1, 1, 3, 3)), ts(f32(1, 1, 3, 3))},
		{"conv2d bad stride", kernels.Op{Name: kernels.OpConv2D, Stride: []int{0, 0}}, ts(f32(1, 1, 3, 3), f32(1, 1, 2, 2)), ts(f32(1, 1, 2, 2))},
		{"conv2d_input_grad no shape", kernels.Op{Name: kernels.OpConv2DInputGrad}, ts(f32(1, 1, 2, 2), f32(1, 1, 2, 2)), ts(f32(1, 1, 3, 3))},
		{"conv2d_weight_grad output shape", kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: []int{1, 1, 2, 2}},
			ts(f32(1, 1, 3, 3), f32(1, 1, 2, 2)), ts(f32(1, 1, 3, 3))},
		{"max_pool2d no kernel", kernels.Op{Name: kernels.OpMaxPool2D}, ts(f32(1, 1, 2, 2)), ts(f32(1, 1, 1, 1))},
		{"max_pool2d_grad output shape", kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, ts(f32(1, 1, 1, 1), f32(1, 1, 2, 2)), ts(f32(1, 1, 1, 1))},
		{"avg_pool2d_grad short output", kernels.Op{Name: kernels.OpAvgPool2DGrad, Kernel: []int{2, 2}, Shape: []int{1, 1, 4, 4}}, ts(f32(1, 1, 2, 2)), ts(f32(1, 1, 4, 4))},
		{"cross_entropy float target", kernels.Op{Name: kernels.OpCrossEntropy}, ts(f32(3, 4), f32(3)), ts(f32())},
		{"cross_entropy output shape", kernels.Op{Name: kernels.OpCrossEntropy, Reduce: kernels.ReduceNone}, ts(f32(3, 4), i64(3)), ts(f32(2))},
		{"cross_entropy_grad dy shape", kernels.Op{Name: kernels.OpCrossEntropyGrad}, ts(f32(3, 4), i64(3), f32(3)), ts(f32(3, 4))},
	}
	expectExecErrors(s, cases)
}

// randomConv draws a small convolution: 1 or 2 groups, strides,
// paddings and dilations of 1 or 2, kernels of 1 to 3, inputs large
// enough for an output of 1 to 4 rows and columns.
func (s *suite) randomConv() convCase {
	r := s.r
	g := 1 + r.IntN(2)
	c := convCase{groups: g, bias: r.IntN(2) == 0}
	kh, kw := 1+r.IntN(3), 1+r.IntN(3)
	c.w = []int{g * (1 + r.IntN(3)), 1 + r.IntN(3), kh, kw}
	c.stride = []int{1 + r.IntN(2), 1 + r.IntN(2)}
	c.dilation = []int{1 + r.IntN(2), 1 + r.IntN(2)}
	c.padding = []int{r.IntN(3), r.IntN(3)}
	size := func(k, s, p, d int) int {
		return max(1, d*(k-1)+1-2*p+s*r.IntN(4)+r.IntN(s))
	}
	c.x = []int{1 + r.IntN(3), g * c.w[1], size(kh, c.stride[0], c.padding[0], c.dilation[0]),
		size(kw, c.stride[1], c.padding[1], c.dilation[1])}
	return c
}

// randomPool draws a small pooling: windows of 1 to 3, strides of 1 to 3,
// paddings up to half the window, dilations of 1 or 2 for max pools.
func (s *suite) randomPool(isMax bool) poolCase {
	r := s.r
	c := poolCase{kernel: []int{1 + r.IntN(3), 1 + r.IntN(3)}, maxOnly: isMax, sprinkle: r.IntN(2) == 0}
	c.stride = []int{1 + r.IntN(3), 1 + r.IntN(3)}
	c.padding = []int{r.IntN(c.kernel[0]/2 + 1), r.IntN(c.kernel[1]/2 + 1)}
	c.dilation = []int{1, 1}
	if isMax {
		c.dilation = []int{1 + r.IntN(2), 1 + r.IntN(2)}
	}
	size := func(a int) int {
		k, s, p, d := c.kernel[a], c.stride[a], c.padding[a], c.dilation[a]
		return max(1, d*(k-1)+1-2*p+s*r.IntN(4)+r.IntN(s))
	}
	c.x = []int{1 + r.IntN(3), 1 + r.IntN(3), size(0), size(1)}
	return c
}
