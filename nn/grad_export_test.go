package nn

// AvgPool2dGrad exposes a gradient op, which has no rule of its own, to
// the tests of Backward's refusals.
func AvgPool2dGrad(dy *Tensor, xshape []int, o PoolOpts) *Tensor {
	k := o.op("avg_pool2d", false)
	return avgPool2dGrad(dy, xshape, &k)
}
