package kernels

import (
	"fmt"
	"slices"
)

// Convolution, pooling and loss ops, all on NCHW tensors of rank 4 (the
// losses on [N, C] logits). Their attributes are Stride, Padding, Dilation,
// Groups, Kernel and Reduce on Op, documented there and in docs/PROTOCOL.md.
const (
	OpConv2D           = "conv2d"             // conv2d(x, w[, b])
	OpConv2DInputGrad  = "conv2d_input_grad"  // conv2d_input_grad(dy, w), dx of shape Shape
	OpConv2DWeightGrad = "conv2d_weight_grad" // conv2d_weight_grad(x, dy), dw of shape Shape

	OpMaxPool2D     = "max_pool2d"      // max_pool2d(x) over Kernel windows
	OpMaxPool2DGrad = "max_pool2d_grad" // max_pool2d_grad(dy, x)
	OpAvgPool2D     = "avg_pool2d"      // avg_pool2d(x), divisor kh*kw
	OpAvgPool2DGrad = "avg_pool2d_grad" // avg_pool2d_grad(dy), dx of shape Shape

	OpCrossEntropy     = "cross_entropy"      // cross_entropy(logits, target), reduced by Reduce
	OpCrossEntropyGrad = "cross_entropy_grad" // cross_entropy_grad(logits, target, dy)
)

// Cross entropy's reductions (Op.Reduce); the empty string means ReduceMean.
const (
	ReduceMean = "mean"
	ReduceSum  = "sum"
	ReduceNone = "none"
)

// Conv lists the 2-D convolution and its two gradients: float dtypes, every
// input of one dtype.
var Conv = []string{OpConv2D, OpConv2DInputGrad, OpConv2DWeightGrad}

// Pools lists the 2-D poolings and their gradients: float dtypes.
var Pools = []string{OpMaxPool2D, OpMaxPool2DGrad, OpAvgPool2D, OpAvgPool2DGrad}

// Losses lists the losses: float logits, i32 or i64 class targets checked
// while running (a target outside [0, C) makes Exec fail with an error
// wrapping ErrIndex).
var Losses = []string{OpCrossEntropy, OpCrossEntropyGrad}

// maxWindowAttr bounds stride, padding, dilation and kernel values, so that
// window arithmetic never overflows.
const maxWindowAttr = 1 << 24

func init() {
	register(OpConv2D, -1, inferConv2D)
	register(OpConv2DInputGrad, 2, inferConv2DInputGrad)
	register(OpConv2DWeightGrad, 2, inferConv2DWeightGrad)
	register(OpMaxPool2D, 1, inferPool)
	register(OpMaxPool2DGrad, 2, inferMaxPoolGrad)
	register(OpAvgPool2D, 1, inferPool)
	register(OpAvgPool2DGrad, 1, inferAvgPoolGrad)
	register(OpCrossEntropy, 2, inferCrossEntropy)
	register(OpCrossEntropyGrad, 3, inferCrossEntropyGrad)
}

// Window is the geometry of a 2-D convolution or pooling, resolved from an
// op's attributes and its input shapes. For pools O is C, Groups is 1 and
// KH, KW are the window.
type Window struct {
	N, C, H, W int // input x[N, C, H, W]
	O          int // output channels
	KH, KW     int // kernel
	OH, OW     int // output y[N, O, OH, OW]
	SH, SW     int // stride
	PH, PW     int // padding
	DH, DW     int // dilation
	Groups     int
}

// XShape is the input's shape [N, C, H, W].
func (g Window) XShape() []int { return []int{g.N, g.C, g.H, g.W} }

// WShape is a convolution's weight shape [O, C/Groups, KH, KW].
func (g Window) WShape() []int { return []int{g.O, g.C / g.Groups, g.KH, g.KW} }

// YShape is the output's shape [N, O, OH, OW].
func (g Window) YShape() []int { return []int{g.N, g.O, g.OH, g.OW} }

// pair reads a two-element attribute: def when absent, else both values at
// least lo and at most maxWindowAttr.
func pair(name, attr string, v []int, def [2]int, lo int) ([2]int, error) {
	if len(v) == 0 {
		return def, nil
	}
	if len(v) != 2 {
		return def, fmt.Errorf("%w: %s %s %v needs 2 values, [h, w]", ErrAttr, name, attr, v)
	}
	for _, x := range v {
		if x < lo || x > maxWindowAttr {
			return def, fmt.Errorf("%w: %s %s %v: values must lie in [%d, %d]", ErrAttr, name, attr, v, lo, maxWindowAttr)
		}
	}
	return [2]int{v[0], v[1]}, nil
}

// outLen is floor((in + 2p - d(k-1) - 1)/s) + 1, or an error when the
// window does not fit.
func outLen(name, axis string, in, k, s, p, d int) (int, error) {
	if k < 1 {
		return 0, fmt.Errorf("%w: %s kernel %s is %d", ErrShape, name, axis, k)
	}
	if k-1 > (1<<62)/d || in > 1<<60 {
		return 0, fmt.Errorf("%w: %s %s window too large", ErrShape, name, axis)
	}
	span := in + 2*p - d*(k-1) - 1
	if span < 0 {
		return 0, fmt.Errorf("%w: %s input %s %d (padding %d) is smaller than the dilated kernel %d",
			ErrShape, name, axis, in, p, d*(k-1)+1)
	}
	return span/s + 1, nil
}

// ConvWindow resolves a convolution's geometry from op's Stride, Padding,
// Dilation and Groups, the input shape x [N, C, H, W] and the weight shape
// w [O, C/groups, KH, KW]. Errors wrap ErrAttr or ErrShape.
func ConvWindow(op *Op, x, w []int) (Window, error) {
	name := op.Name
	stride, err := pair(name, "stride", op.Stride, [2]int{1, 1}, 1)
	if err != nil {
		return Window{}, err
	}
	pad, err := pair(name, "padding", op.Padding, [2]int{0, 0}, 0)
	if err != nil {
		return Window{}, err
	}
	dil, err := pair(name, "dilation", op.Dilation, [2]int{1, 1}, 1)
	if err != nil {
		return Window{}, err
	}
	groups := op.Groups
	if groups == 0 {
		groups = 1
	}
	if groups < 0 || groups > maxWindowAttr {
		return Window{}, fmt.Errorf("%w: %s groups %d must be at least 1", ErrAttr, name, op.Groups)
	}
	if len(x) != 4 {
		return Window{}, fmt.Errorf("%w: %s input %v is not rank 4 [N, C, H, W]", ErrShape, name, x)
	}
	if len(w) != 4 {
		return Window{}, fmt.Errorf("%w: %s weight %v is not rank 4 [O, C/groups, KH, KW]", ErrShape, name, w)
	}
	g := Window{N: x[0], C: x[1], H: x[2], W: x[3], O: w[0], KH: w[2], KW: w[3],
		SH: stride[0], SW: stride[1], PH: pad[0], PW: pad[1], DH: dil[0], DW: dil[1], Groups: groups}
	if g.C%groups != 0 || g.O%groups != 0 {
		return Window{}, fmt.Errorf("%w: %s channels in %d and out %d must both divide by groups %d", ErrShape, name, g.C, g.O, groups)
	}
	if w[1] != g.C/groups {
		return Window{}, fmt.Errorf("%w: %s weight %v wants %d input channels per group, input %v has %d (groups %d)",
			ErrShape, name, w, w[1], x, g.C/groups, groups)
	}
	if g.OH, err = outLen(name, "height", g.H, g.KH, g.SH, g.PH, g.DH); err != nil {
		return Window{}, err
	}
	if g.OW, err = outLen(name, "width", g.W, g.KW, g.SW, g.PW, g.DW); err != nil {
		return Window{}, err
	}
	return g, nil
}

// PoolWindow resolves a pooling's geometry from op's Kernel (required),
// Stride (default Kernel), Padding (at most half the kernel) and Dilation
// (max_pool2d only) and the input shape x [N, C, H, W]. Errors wrap ErrAttr
// or ErrShape.
func PoolWindow(op *Op, x []int) (Window, error) {
	name := op.Name
	if len(op.Kernel) == 0 {
		return Window{}, fmt.Errorf("%w: %s needs kernel [kh, kw]", ErrAttr, name)
	}
	k, err := pair(name, "kernel", op.Kernel, [2]int{}, 1)
	if err != nil {
		return Window{}, err
	}
	stride, err := pair(name, "stride", op.Stride, k, 1)
	if err != nil {
		return Window{}, err
	}
	pad, err := pair(name, "padding", op.Padding, [2]int{0, 0}, 0)
	if err != nil {
		return Window{}, err
	}
	if pad[0] > k[0]/2 || pad[1] > k[1]/2 {
		return Window{}, fmt.Errorf("%w: %s padding %v is more than half the kernel %v", ErrAttr, name, op.Padding, op.Kernel)
	}
	dil, err := pair(name, "dilation", op.Dilation, [2]int{1, 1}, 1)
	if err != nil {
		return Window{}, err
	}
	if (name == OpAvgPool2D || name == OpAvgPool2DGrad) && dil != [2]int{1, 1} {
		return Window{}, fmt.Errorf("%w: %s takes no dilation, got %v", ErrAttr, name, op.Dilation)
	}
	if len(x) != 4 {
		return Window{}, fmt.Errorf("%w: %s input %v is not rank 4 [N, C, H, W]", ErrShape, name, x)
	}
	g := Window{N: x[0], C: x[1], H: x[2], W: x[3], O: x[1], KH: k[0], KW: k[1],
		SH: stride[0], SW: stride[1], PH: pad[0], PW: pad[1], DH: dil[0], DW: dil[1], Groups: 1}
	if g.OH, err = outLen(name, "height", g.H, g.KH, g.SH, g.PH, g.DH); err != nil {
		return Window{}, err
	}
	if g.OW, err = outLen(name, "width", g.W, g.KW, g.SW, g.PW, g.DW); err != nil {
		return Window{}, err
	}
	return g, nil
}

func inferConv2D(op *Op, in []Meta) ([]Meta, error) {
	if len(in) != 2 && len(in) != 3 {
		return nil, fmt.Errorf("%w: conv2d takes 2 or 3 (x, w[, b]), got %d", ErrArity, len(in))
	}
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	g, err := ConvWindow(op, in[0].Shape, in[1].Shape)
	if err != nil {
		return nil, err
	}
	if len(in) == 3 && !slices.Equal(in[2].Shape, []int{g.O}) {
		return nil, fmt.Errorf("%w: conv2d bias %v, want [%d]", ErrShape, in[2].Shape, g.O)
	}
	return []Meta{{DType: in[0].DType, Shape: g.YShape()}}, nil
}

func inferConv2DInputGrad(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	if len(op.Shape) != 4 {
		return nil, fmt.Errorf("%w: %s needs shape [N, C, H, W] of dx, got %v", ErrAttr, op.Name, op.Shape)
	}
	g, err := ConvWindow(op, op.Shape, in[1].Shape)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(g.YShape(), in[0].Shape) {
		return nil, fmt.Errorf("%w: %s: conv2d of %v with w %v gives %v, dy is %v",
			ErrShape, op.Name, op.Shape, in[1].Shape, g.YShape(), in[0].Shape)
	}
	return []Meta{{DType: in[0].DType, Shape: slices.Clone(op.Shape)}}, nil
}

func inferConv2DWeightGrad(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	if len(op.Shape) != 4 {
		return nil, fmt.Errorf("%w: %s needs shape [O, C/groups, KH, KW] of dw, got %v", ErrAttr, op.Name, op.Shape)
	}
	g, err := ConvWindow(op, in[0].Shape, op.Shape)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(g.YShape(), in[1].Shape) {
		return nil, fmt.Errorf("%w: %s: conv2d of %v with w %v gives %v, dy is %v",
			ErrShape, op.Name, in[0].Shape, op.Shape, g.YShape(), in[1].Shape)
	}
	return []Meta{{DType: in[0].DType, Shape: slices.Clone(op.Shape)}}, nil
}

func inferPool(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	g, err := PoolWindow(op, in[0].Shape)
	if err != nil {
		return nil, err
	}
	return []Meta{{DType: in[0].DType, Shape: g.YShape()}}, nil
}

func inferMaxPoolGrad(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if err := sameDType(op.Name, in...); err != nil {
		return nil, err
	}
	g, err := PoolWindow(op, in[1].Shape)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(g.YShape(), in[0].Shape) {
		return nil, fmt.Errorf("%w: %s: max_pool2d of %v gives %v, dy is %v", ErrShape, op.Name, in[1].Shape, g.YShape(), in[0].Shape)
	}
	return same(in[1]), nil
}

func inferAvgPoolGrad(op *Op, in []Meta) ([]Meta, error) {
	if err := requireFloat(op.Name, in...); err != nil {
		return nil, err
	}
	if len(op.Shape) != 4 {
		return nil, fmt.Errorf("%w: %s needs shape [N, C, H, W] of dx, got %v", ErrAttr, op.Name, op.Shape)
	}
	g, err := PoolWindow(op, op.Shape)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(g.YShape(), in[0].Shape) {
		return nil, fmt.Errorf("%w: %s: avg_pool2d of %v gives %v, dy is %v", ErrShape, op.Name, op.Shape, g.YShape(), in[0].Shape)
	}
	return []Meta{{DType: in[0].DType, Shape: slices.Clone(op.Shape)}}, nil
}

// CrossEntropyReduce returns op's reduction: ReduceMean (also for ""),
// ReduceSum or ReduceNone. Errors wrap ErrAttr.
func CrossEntropyReduce(op *Op) (string, error) {
	switch op.Reduce {
	case "", ReduceMean:
		return ReduceMean, nil
	case ReduceSum, ReduceNone:
		return op.Reduce, nil
	}
	return "", fmt.Errorf("%w: %s reduce %q (want mean, sum or none)", ErrAttr, op.Name, op.Reduce)
}

// checkLogits checks logits [N, C] (float, C >= 1) and target [N] (i32 or
// i64) and returns N.
func checkLogits(op *Op, logits, target Meta) (int, error) {
	if err := requireFloat(op.Name, logits); err != nil {
		return 0, err
	}
	if err := requireIndex(op.Name, 1, target); err != nil {
		return 0, err
	}
	if len(logits.Shape) != 2 {
		return 0, fmt.Errorf("%w: %s logits %v are not [N, C]", ErrShape, op.Name, logits.Shape)
	}
	if logits.Shape[1] < 1 {
		return 0, fmt.Errorf("%w: %s logits %v have no classes", ErrShape, op.Name, logits.Shape)
	}
	n := logits.Shape[0]
	if !slices.Equal(target.Shape, []int{n}) {
		return 0, fmt.Errorf("%w: %s target %v, want [%d] for logits %v", ErrShape, op.Name, target.Shape, n, logits.Shape)
	}
	return n, nil
}

func inferCrossEntropy(op *Op, in []Meta) ([]Meta, error) {
	red, err := CrossEntropyReduce(op)
	if err != nil {
		return nil, err
	}
	n, err := checkLogits(op, in[0], in[1])
	if err != nil {
		return nil, err
	}
	shape := []int{}
	if red == ReduceNone {
		shape = []int{n}
	}
	return []Meta{{DType: in[0].DType, Shape: shape}}, nil
}

func inferCrossEntropyGrad(op *Op, in []Meta) ([]Meta, error) {
	red, err := CrossEntropyReduce(op)
	if err != nil {
		return nil, err
	}
	n, err := checkLogits(op, in[0], in[1])
	if err != nil {
		return nil, err
	}
	if in[2].DType != in[0].DType {
		return nil, fmt.Errorf("%w: %s dy is %v, logits %v; cast one first", ErrDType, op.Name, in[2].DType, in[0].DType)
	}
	want := []int{}
	if red == ReduceNone {
		want = []int{n}
	}
	if !slices.Equal(in[2].Shape, want) {
		return nil, fmt.Errorf("%w: %s dy %v, want %v for reduce %q", ErrShape, op.Name, in[2].Shape, want, red)
	}
	return same(in[0]), nil
}
