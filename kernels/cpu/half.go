package cpu

import (
	"github.com/jetfabric/jetfabric/kernels"
)

// viaF32 runs op on float16 or bfloat16 tensors by widening them to
// float32, running the float32 kernel and rounding the results once.
func (b *Backend) viaF32(op *kernels.Op, in, out []*kernels.Tensor) error {
	var handles []*[]uint64
	defer func() {
		for _, h := range handles {
			wordPool.Put(h)
		}
	}()
	wide := func(t *kernels.Tensor) *kernels.Tensor {
		if t.DType != kernels.Float16 && t.DType != kernels.BFloat16 {
			return t
		}
		n := t.Numel()
		buf, h := getBytes(4 * n)
		handles = append(handles, h)
		return &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: t.Shape}, Buf: &Buffer{data: buf}}
	}
	win := make([]*kernels.Tensor, len(in))
	for i, t := range in {
		win[i] = wide(t)
		if win[i] != t {
			castBytes(data(win[i]), kernels.Float32, data(t), t.DType, t.Numel())
		}
	}
	wout := make([]*kernels.Tensor, len(out))
	for i, t := range out {
		wout[i] = wide(t)
	}
	e := table[op.Name]
	if err := e.fn(b, op, win, wout); err != nil {
		return err
	}
	for i, t := range out {
		if wout[i] != t {
			castBytes(data(t), t.DType, data(wout[i]), kernels.Float32, t.Numel())
		}
	}
	return nil
}
