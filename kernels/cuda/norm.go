//go:build cgo && linux

package cuda

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// norm queues layer_norm or rms_norm.
func (b *Backend) norm(op *kernels.Op, inM []kernels.Meta, inB []*buffer, out *buffer) error {
	x := inM[0]
	k, err := kernels.NormGroup(op, len(x.Shape))
	if err != nil {
		return err
	}
	n := x.Numel()
	if n == 0 {
		return nil
	}
	r := len(x.Shape)
	if r > maxMoveRank {
		return fmt.Errorf("%w: %s of rank %d", kernels.ErrNotImplemented, op.Name, r)
	}
	g := kernels.Numel(x.Shape[r-k:])
	s := normSpec{dt: x.DType, rms: op.Name == kernels.OpRMSNorm, rank: r, hasW: len(inM) > 1, hasB: len(inM) > 2}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	// bstrides are the strides of shape broadcast to x's shape.
	bstrides := func(shape []int) []int {
		st := rowStrides(shape)
		out := make([]int, r)
		for d := range r {
			if j := d - (r - len(shape)); j >= 0 && shape[j] == x.Shape[d] {
				out[d] = st[j]
			}
		}
		return out
	}
	ws, bs := make([]int, r), make([]int, r)
	var wp, bp uint64
	if s.hasW {
		ws, wp = bstrides(inM[1].Shape), inB[1].ptr
	}
	if s.hasB {
		bs, bp = bstrides(inM[2].Shape), inB[2].ptr
	}
	rows := n / g
	var a kargs
	a.ptr(out.ptr)
	a.ptr(inB[0].ptr)
	a.ptr(wp)
	a.ptr(bp)
	a.i64(rows)
	a.i64(g)
	a.f64(op.Eps)
	for d := range r {
		a.i64(x.Shape[d])
		a.i64(ws[d])
		a.i64(bs[d])
	}
	b.queueLaunch(f, [3]uint32{uint32(min(rows, 1<<20)), 1, 1}, blockSize, &a)
	return nil
}
