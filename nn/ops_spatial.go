package nn

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// Conv2dOpts are a 2-D convolution's attributes. Zero values take the
// defaults: stride 1, padding 0, dilation 1, groups 1.
type Conv2dOpts struct {
	Stride, Padding, Dilation [2]int
	Groups                    int
}

func (o Conv2dOpts) op(name string) kernels.Op {
	k := kernels.Op{Name: name, Stride: []int{1, 1}, Padding: slices.Clone(o.Padding[:]), Dilation: []int{1, 1}, Groups: max(o.Groups, 1)}
	if o.Stride != [2]int{} {
		k.Stride = slices.Clone(o.Stride[:])
	}
	if o.Dilation != [2]int{} {
		k.Dilation = slices.Clone(o.Dilation[:])
	}
	return k
}

// Conv2d is the 2-D convolution (cross-correlation, as in PyTorch) of
// x [N, C, H, W] with weight w [O, C/groups, KH, KW], plus bias b [O] per
// output channel when b is not nil: y [N, O, OH, OW] with
// OH = (H + 2·padding - dilation·(KH-1) - 1)/stride + 1, likewise OW.
func Conv2d(x, w, b *Tensor, o Conv2dOpts) *Tensor {
	in := []*Tensor{x, w}
	if b != nil {
		in = append(in, b)
	}
	return apply(&opDesc{k: o.op(kernels.OpConv2D)}, in...)
}

// windowOp is the forward op's attributes under another op's name, with
// shape set (the gradient ops' output shape).
func windowOp(fwd *kernels.Op, name string, shape []int) *kernels.Op {
	return &kernels.Op{Name: name, Shape: slices.Clone(shape), Stride: fwd.Stride, Padding: fwd.Padding,
		Dilation: fwd.Dilation, Groups: fwd.Groups, Kernel: fwd.Kernel, Reduce: fwd.Reduce}
}

func conv2dInputGrad(dy, w *Tensor, xshape []int, fwd *kernels.Op) *Tensor {
	return apply(&opDesc{k: *windowOp(fwd, kernels.OpConv2DInputGrad, xshape)}, dy, w)
}

func conv2dWeightGrad(x, dy *Tensor, wshape []int, fwd *kernels.Op) *Tensor {
	return apply(&opDesc{k: *windowOp(fwd, kernels.OpConv2DWeightGrad, wshape)}, x, dy)
}

func maxPool2dGrad(dy, x *Tensor, fwd *kernels.Op) *Tensor {
	return apply(&opDesc{k: *windowOp(fwd, kernels.OpMaxPool2DGrad, nil)}, dy, x)
}

func avgPool2dGrad(dy *Tensor, xshape []int, fwd *kernels.Op) *Tensor {
	return apply(&opDesc{k: *windowOp(fwd, kernels.OpAvgPool2DGrad, xshape)}, dy)
}

func crossEntropyGrad(logits, target, dy *Tensor, fwd *kernels.Op) *Tensor {
	return apply(&opDesc{k: *windowOp(fwd, kernels.OpCrossEntropyGrad, nil)}, logits, target, dy)
}

// PoolOpts are a 2-D pooling's attributes: the window (required), the
// stride (zero: the window), the padding and, for max pooling, the
// dilation (zero: 1).
type PoolOpts struct {
	Kernel, Stride, Padding, Dilation [2]int
}

func (o PoolOpts) op(name string, dilation bool) kernels.Op {
	k := kernels.Op{Name: name, Kernel: slices.Clone(o.Kernel[:]), Stride: slices.Clone(o.Kernel[:]), Padding: slices.Clone(o.Padding[:])}
	if o.Stride != [2]int{} {
		k.Stride = slices.Clone(o.Stride[:])
	}
	if dilation {
		k.Dilation = []int{1, 1}
		if o.Dilation != [2]int{} {
			k.Dilation = slices.Clone(o.Dilation[:])
		}
	}
	return k
}

// MaxPool2d is the maximum over windows of x [N, C, H, W] (floor mode;
// padded positions never win). Its gradient goes to the first maximum of
// each window.
func MaxPool2d(x *Tensor, o PoolOpts) *Tensor {
	return apply(&opDesc{k: o.op(kernels.OpMaxPool2D, true)}, x)
}

// AvgPool2d is the mean over windows of x [N, C, H, W], dividing by the
// window's size always (padded positions count as 0).
func AvgPool2d(x *Tensor, o PoolOpts) *Tensor {
	if o.Dilation != [2]int{} && o.Dilation != [2]int{1, 1} {
		return failed(sessionOf(x), fmt.Errorf("%w: avg_pool2d has no dilation (got %v)", ErrInvalidArgument, o.Dilation))
	}
	return apply(&opDesc{k: o.op(kernels.OpAvgPool2D, false)}, x)
}

// Reductions of CrossEntropy.
const (
	ReduceMean = kernels.ReduceMean
	ReduceSum  = kernels.ReduceSum
	ReduceNone = kernels.ReduceNone
)

// CrossEntropy is the loss of logits [N, C] against class indices target
// [N] (i32 or i64): logsumexp(logits_i) - logits_i[target_i] per row,
// averaged (reduce "mean" or ""), summed ("sum") or kept per row
// ("none"). A target outside [0, C) fails on the worker.
func CrossEntropy(logits, target *Tensor, reduce string) *Tensor {
	if reduce == "" {
		reduce = ReduceMean
	}
	return apply(&opDesc{k: kernels.Op{Name: kernels.OpCrossEntropy, Reduce: reduce}}, logits, target)
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
