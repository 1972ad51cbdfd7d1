//go:build cgo && linux

package cuda

import (
	"github.com/jetfabric/jetfabric/kernels"
)

// optimStep queues adam_step or sgd_step: one elementwise kernel.
func (b *Backend) optimStep(op *kernels.Op, inM []kernels.Meta, inB, outB []*buffer) error {
	n := inM[0].Numel()
	if n == 0 {
		return nil
	}
	s := optimSpec{dt: inM[0].DType, sgd: op.Name == kernels.OpSGDStep}
	var a kargs
	if s.sgd {
		s.bufIn, s.bufOut, s.nesterov = len(inB) == 3, len(outB) == 2, op.Nesterov
		var bo, buf uint64
		if s.bufOut {
			bo = outB[1].ptr
		}
		if s.bufIn {
			buf = inB[2].ptr
		}
		a.ptr(outB[0].ptr)
		a.ptr(bo)
		a.ptr(inB[0].ptr)
		a.ptr(inB[1].ptr)
		a.ptr(buf)
		a.i64(n)
		a.f64(op.LR)
		a.f64(op.WeightDecay)
		a.f64(op.Momentum)
		a.f64(1 - op.Dampening)
	} else {
		c := op.Adam()
		for _, o := range outB {
			a.ptr(o.ptr)
		}
		for _, i := range inB {
			a.ptr(i.ptr)
		}
		a.i64(n)
		for _, v := range []float64{c.Decay, c.L2, c.OneMinusBeta1, c.Beta2, c.OneMinusBeta2, c.StepSize, c.BC2Sqrt, c.Eps} {
			a.f64(v)
		}
	}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	b.queueLaunch(f, [3]uint32{uint32(min(ceilDiv(n, blockSize), 1<<16)), 1, 1}, blockSize, &a)
	return nil
}
