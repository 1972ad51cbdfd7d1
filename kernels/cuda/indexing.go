//go:build cgo && linux

package cuda

import (
	"encoding/binary"
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// isIndexing reports whether exec runs op with the kernels of this file.
func isIndexing(name string) bool {
	switch name {
	case kernels.OpGather, kernels.OpScatterAdd, kernels.OpIndexSelect, kernels.OpOneHot:
		return true
	}
	return false
}

// indexErr is the error of an index out of range, as the CPU's.
func indexErr(op *kernels.Op, n int) error {
	return fmt.Errorf("%w: %w: cuda: %s index out of range for an axis of %d", kernels.ErrIndex, kernels.ErrShape, op.Name, n)
}

// indexOp queues gather, scatter_add, index_select or one_hot and waits
// for it: an index out of range sets a flag on the device, read back
// after the launch.
func (b *Backend) indexOp(op *kernels.Op, inM []kernels.Meta, y kernels.Meta, inB []*buffer, out *buffer) error {
	var idxM kernels.Meta
	var axis, axisN int
	switch op.Name {
	case kernels.OpOneHot:
		idxM, axisN = inM[0], op.Depth
	default:
		idxM = inM[1]
		var err error
		if axis, err = kernels.NormAxis(op.Name, op.Axis, len(inM[0].Shape)); err != nil {
			return err
		}
		axisN = inM[0].Shape[axis]
	}
	if idxM.Numel() > 0 && axisN == 0 {
		return indexErr(op, 0) // every index is out of range
	}
	n := y.Numel()
	if n == 0 {
		return nil
	}
	if len(y.Shape) > maxMoveRank {
		return fmt.Errorf("%w: %s of rank %d", kernels.ErrNotImplemented, op.Name, len(y.Shape))
	}
	i64idx := idxM.DType == kernels.Int64
	flag, err := b.alloc(4)
	if err != nil {
		return err
	}
	defer b.free(flag)
	b.queueMemset(flag.ptr, 0, 4)
	var key string
	var gen func() string
	var a kargs
	switch op.Name {
	case kernels.OpGather:
		x := inM[0]
		s := gatherSpec{size: x.DType.Size(), idx64: i64idx, rank: len(x.Shape), axis: axis}
		key, gen = s.key(), s.source
		a.ptr(out.ptr)
		a.ptr(inB[0].ptr)
		a.ptr(inB[1].ptr)
		a.ptr(flag.ptr)
		a.i64(n)
		a.i64(axisN)
		xst := rowStrides(x.Shape)
		for k := range x.Shape {
			a.i64(idxM.Shape[k])
			a.i64(xst[k])
		}
	case kernels.OpIndexSelect:
		x := inM[0]
		s := selectSpec{size: x.DType.Size(), idx64: i64idx}
		key, gen = s.key(), s.source
		a.ptr(out.ptr)
		a.ptr(inB[0].ptr)
		a.ptr(inB[1].ptr)
		a.ptr(flag.ptr)
		a.i64(n)
		a.i64(idxM.Shape[0])
		a.i64(axisN)
		a.i64(kernels.Numel(x.Shape[axis+1:]))
	case kernels.OpOneHot:
		s := oneHotSpec{dt: y.DType, idx64: i64idx}
		key, gen = s.key(), s.source
		a.ptr(out.ptr)
		a.ptr(inB[0].ptr)
		a.ptr(flag.ptr)
		a.i64(n)
		a.i64(op.Depth)
	case kernels.OpScatterAdd:
		s := scatterSpec{dt: y.DType, idx64: i64idx, rank: len(y.Shape), axis: axis}
		key, gen = s.key(), s.source
		a.ptr(out.ptr)
		a.ptr(inB[0].ptr)
		a.ptr(inB[1].ptr)
		a.ptr(inB[2].ptr)
		a.ptr(flag.ptr)
		a.i64(n)
		for k := range y.Shape {
			a.i64(y.Shape[k])
			a.i64(idxM.Shape[k])
		}
	default:
		return fmt.Errorf("%w: %s", kernels.ErrNotImplemented, op.Name)
	}
	f, err := b.function(key, func() (string, error) { return gen(), nil })
	if err != nil {
		return err
	}
	b.queueLaunch(f, b.launchGrid(n), blockSize, &a)
	bad, err := b.readFlag(flag, op.Name)
	if err != nil {
		return err
	}
	if bad != 0 {
		return indexErr(op, axisN)
	}
	return nil
}

// readFlag queues the device calls of op recorded so far, waits for the
// work queued and returns the u32 at d. A queued op that failed to launch,
// and was not reported yet, fails it with an *AsyncError.
func (b *Backend) readFlag(d *buffer, op string) (uint32, error) {
	b.notRecordable(op + " checks its indices on the host")
	b.pushRun(op)
	var v uint32
	err := b.call(func() error {
		if err := b.takeAsync(); err != nil {
			return err
		}
		st, err := b.stage.take()
		if err != nil {
			return err
		}
		if err := memcpyDtoH(st.host, d.ptr, 4, b.stream); err != nil {
			return err
		}
		if err := eventRecord(st.ev, b.stream); err != nil {
			return err
		}
		if err := eventSync(st.ev); err != nil {
			return err
		}
		st.busy = false
		v = binary.LittleEndian.Uint32(st.bytes(4))
		return nil
	})
	return v, err
}
