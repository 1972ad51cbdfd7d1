package codec

import "github.com/jetfabric/jetfabric/kernels"

// KernelOp is op as the kernels run it: its attributes, its dtype parsed,
// and the defaults a worker gives the attributes the wire leaves unset (an
// arange's step 1, a uniform's range [0, 1), a normal's deviation 1, a
// norm's eps 1e-5; docs/PROTOCOL.md §3). The worker runs ops through it,
// and shape inference of a wire op reads it.
func KernelOp(op *Op) (kernels.Op, error) {
	k := kernels.Op{
		Name: op.Op, Shape: op.Shape, Axes: op.Axes, Keepdims: op.Keepdims, Perm: op.Perm,
		Axis: op.Axis, Correction: op.Correction,
		Value: op.Value, Start: op.Start, Stop: op.Stop, Step: op.Step,
		Low: op.Low, High: op.High, Mean: op.Mean, Std: op.Std,
		Starts: op.Starts, Ends: op.Ends, Steps: op.Steps, Pads: op.Pads, Sizes: op.Sizes,
		K: op.K, Depth: op.Depth, Eps: op.Eps, P: op.P, Num: op.Num, N: op.N, M: op.M,
		Stride: op.Stride, Padding: op.Padding, Dilation: op.Dilation, Groups: op.Groups,
		Kernel: op.Kernel, Reduce: op.Reduce,
		LR: op.LR, Beta1: op.Beta1, Beta2: op.Beta2, WeightDecay: op.WeightDecay,
		Momentum: op.Momentum, Dampening: op.Dampening, Decoupled: op.Decoupled, Nesterov: op.Nesterov, T: op.T,
	}
	if op.DType != "" {
		dt, err := kernels.ParseDType(op.DType)
		if err != nil {
			return k, err
		}
		k.DType = dt
	}
	switch op.Op {
	case kernels.OpArange:
		if k.Step == 0 {
			k.Step = 1
		}
	case kernels.OpUniform:
		if k.Low == 0 && k.High == 0 {
			k.High = 1
		}
	case kernels.OpNormal:
		if k.Std == 0 && k.Mean == 0 {
			k.Std = 1
		}
	case kernels.OpLayerNorm, kernels.OpRMSNorm:
		if k.Eps == 0 {
			k.Eps = 1e-5
		}
	}
	return k, nil
}
