package nn

import (
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// inferWire is shape inference of a wire op: the client.InferFunc with
// which a captured graph is split.
func inferWire(op *codec.Op, in []codec.Placeholder) ([]codec.Placeholder, error) {
	k, err := codec.KernelOp(op)
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
