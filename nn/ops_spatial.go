package nn

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// The names of convolution, pooling and cross-entropy ops and of their
// gradients (docs/PROTOCOL.md).
const (
	opConv2d           = "conv2d"
	opConv2dInputGrad  = "conv2d_input_grad"
	opConv2dWeightGrad = "conv2d_weight_grad"
	opMaxPool2d        = "max_pool2d"
	opMaxPool2dGrad    = "max_pool2d_grad"
	opAvgPool2d        = "avg_pool2d"
	opAvgPool2dGrad    = "avg_pool2d_grad"
	opCrossEntropy     = "cross_entropy"
	opCrossEntropyGrad = "cross_entropy_grad"
)

// setSpatialKernels copies the spatial attributes to shape inference's op.
func setSpatialKernels(k *kernels.Op, sp *spatial) {
	_ = k
	_ = sp
}

// setSpatialWire copies the spatial attributes to the wire op.
func setSpatialWire(w *codec.Op, sp *spatial) {
	if sp.reduce != "" {
		w.Reduce = sp.reduce
	}
}

// Conv2dOpts are a 2-D convolution's attributes. Zero values take the
// defaults: stride 1, padding 0, dilation 1, groups 1.
type Conv2dOpts struct {
	Stride, Padding, Dilation [2]int
	Groups                    int
}

func (o Conv2dOpts) spatial() spatial {
	sp := spatial{stride: []int{1, 1}, padding: o.Padding[:], dilation: []int{1, 1}, groups: max(o.Groups, 1)}
	if o.Stride != [2]int{} {
		sp.stride = slices.Clone(o.Stride[:])
	}
	if o.Dilation != [2]int{} {
		sp.dilation = slices.Clone(o.Dilation[:])
	}
	sp.padding = slices.Clone(sp.padding)
	return sp
}

// Conv2d is the 2-D convolution (cross-correlation, as in PyTorch) of
// x [N, C, H, W] with weight w [O, C/groups, KH, KW], plus bias b [O] per
// output channel when b is not nil: y [N, O, OH, OW].
func Conv2d(x, w, b *Tensor, o Conv2dOpts) *Tensor {
	in := []*Tensor{x, w}
	if b != nil {
		in = append(in, b)
	}
	return apply(&opDesc{k: kernels.Op{Name: opConv2d}, sp: o.spatial()}, in...)
}

func conv2dInputGrad(dy, w *Tensor, xshape []int, sp spatial) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opConv2dInputGrad, Shape: slices.Clone(xshape)}, sp: sp}, dy, w)
}

func conv2dWeightGrad(x, dy *Tensor, wshape []int, sp spatial) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opConv2dWeightGrad, Shape: slices.Clone(wshape)}, sp: sp}, x, dy)
}

// PoolOpts are a 2-D pooling's attributes: the window (required), the
// stride (zero: the window), the padding and, for max pooling, the
// dilation (zero: 1).
type PoolOpts struct {
	Kernel, Stride, Padding, Dilation [2]int
}

func (o PoolOpts) spatial(dilation bool) spatial {
	sp := spatial{kernel: slices.Clone(o.Kernel[:]), stride: slices.Clone(o.Kernel[:]), padding: slices.Clone(o.Padding[:])}
	if o.Stride != [2]int{} {
		sp.stride = slices.Clone(o.Stride[:])
	}
	if dilation {
		sp.dilation = []int{1, 1}
		if o.Dilation != [2]int{} {
			sp.dilation = slices.Clone(o.Dilation[:])
		}
	}
	return sp
}

// MaxPool2d is the maximum over windows of x [N, C, H, W] (floor mode;
// padded positions never win).
func MaxPool2d(x *Tensor, o PoolOpts) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opMaxPool2d}, sp: o.spatial(true)}, x)
}

// AvgPool2d is the mean over windows of x [N, C, H, W], dividing by the
// window's size always (padded positions count as 0).
func AvgPool2d(x *Tensor, o PoolOpts) *Tensor {
	if o.Dilation != [2]int{} && o.Dilation != [2]int{1, 1} {
		return failed(sessionOf(x), fmt.Errorf("%w: avg_pool2d has no dilation (got %v)", ErrInvalidArgument, o.Dilation))
	}
	return apply(&opDesc{k: kernels.Op{Name: opAvgPool2d}, sp: o.spatial(false)}, x)
}

// Reductions of CrossEntropy.
const (
	ReduceMean = "mean"
	ReduceSum  = "sum"
	ReduceNone = "none"
)

// CrossEntropy is the loss of logits [N, C] against class indices target
// [N] (i32 or i64): logsumexp(logits_i) - logits_i[target_i] per row,
// averaged (reduce "mean" or ""), summed ("sum") or kept per row
// ("none"). A target outside [0, C) fails on the worker.
func CrossEntropy(logits, target *Tensor, reduce string) *Tensor {
	if reduce == "" {
		reduce = ReduceMean
	}
	return apply(&opDesc{k: kernels.Op{Name: opCrossEntropy}, sp: spatial{reduce: reduce}}, logits, target)
}

// Dropout zeroes each element of x with probability p and scales the rest
// by 1/(1-p). The mask is a bernoulli tensor keyed by the session seed and
// its id, so a replay draws the same one. p = 0 returns x itself.
func Dropout(x *Tensor, p float64) *Tensor {
	switch {
	case x == nil || x.err != nil:
		return op1(kernels.OpMul, x)
	case !(p >= 0 && p < 1):
		return failed(x.s, fmt.Errorf("%w: dropout probability %v outside [0, 1)", ErrInvalidArgument, p))
	case p == 0:
		return x
	}
	mask := Bernoulli(x.s, x.meta.DType, x.meta.Shape, 1-p)
	return Mul(x, ScalarMul(mask, 1/(1-p)))
}

func sessionOf(x *Tensor) *client.Session {
	if x == nil {
		return nil
	}
	return x.s
}

func maxPool2dGrad(dy, x *Tensor, sp spatial) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opMaxPool2dGrad}, sp: sp}, dy, x)
}

func avgPool2dGrad(dy *Tensor, xshape []int, sp spatial) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opAvgPool2dGrad, Shape: slices.Clone(xshape)}, sp: sp}, dy)
}

func crossEntropyGrad(logits, target, dy *Tensor, reduce string) *Tensor {
	return apply(&opDesc{k: kernels.Op{Name: opCrossEntropyGrad}, sp: spatial{reduce: reduce}}, logits, target, dy)
}
