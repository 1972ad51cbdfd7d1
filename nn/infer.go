package nn

import (
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// fromWire is a wire op as shape inference reads it, the inverse of
// opDesc.wire, with the defaults the worker gives attributes left unset
// (an arange's step, a uniform's range, a normal's deviation, a norm's
// eps).
func fromWire(op *codec.Op) (kernels.Op, error) {
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

// inferWire is shape inference of a wire op: the client.InferFunc with
// which a captured graph is split.
func inferWire(op *codec.Op, in []codec.Placeholder) ([]codec.Placeholder, error) {
	k, err := fromWire(op)
	if err != nil {
		return nil, err
	}
	metas := make([]kernels.Meta, len(in))
	for i, p := range in {
		dt, err := kernels.ParseDType(p.DType)
		if err != nil {
			return nil, err
		}
		metas[i] = kernels.Meta{DType: dt, Shape: p.Shape}
	}
	out, err := kernels.Infer(&k, metas, limits)
	if err != nil {
		return nil, err
	}
	ph := make([]codec.Placeholder, len(out))
	for i, m := range out {
		ph[i] = codec.Placeholder{DType: m.DType.String(), Shape: append([]int{}, m.Shape...)}
	}
	return ph, nil
}
