//go:build cgo && linux

package cuda

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// maxMoveRank bounds the rank of a strided copy: its parameters must fit
// the 4 KiB a launch takes.
const maxMoveRank = 64

// isMovement reports whether exec runs op with the kernels of this file.
func isMovement(name string) bool {
	switch name {
	case kernels.OpExpand, kernels.OpSlice, kernels.OpPad, kernels.OpConcat, kernels.OpStack, kernels.OpSplit,
		kernels.OpFlip, kernels.OpSqueeze, kernels.OpUnsqueeze, kernels.OpTril, kernels.OpTriu,
		kernels.OpZeros, kernels.OpOnes, kernels.OpLinspace, kernels.OpEye, kernels.OpBernoulli:
		return true
	}
	return false
}

// rowStrides are the element strides of a row-major shape.
func rowStrides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for d := len(shape) - 1; d >= 0; d-- {
		st[d] = s
		s *= shape[d]
	}
	return st
}

// movement queues one of the ops of isMovement or isIndexing, or a norm. Outputs that share memory
// with an input are written through scratch memory.
func (b *Backend) movement(op *kernels.Op, inM, want []kernels.Meta, inB, outB []*buffer) error {
	dsts := make([]*buffer, len(outB))
	var fix [][2]*buffer
	defer func() {
		for _, f := range fix {
			b.free(f[1])
		}
	}()
	for k, o := range outB {
		dsts[k] = o
		if op.Name == kernels.OpTril || op.Name == kernels.OpTriu || o.n == 0 {
			continue // each element is read and written by one thread
		}
		for _, in := range inB {
			if in.n > 0 && in.ptr < o.ptr+uint64(o.n) && o.ptr < in.ptr+uint64(in.n) {
				tmp, err := b.alloc(o.n)
				if err != nil {
					return err
				}
				fix = append(fix, [2]*buffer{o, tmp})
				dsts[k] = tmp
				break
			}
		}
	}
	if err := b.moveOp(op, inM, want, inB, dsts); err != nil {
		return err
	}
	for _, f := range fix {
		b.queueCopy(f[0].ptr, f[1].ptr, f[0].n)
	}
	return nil
}

func (b *Backend) moveOp(op *kernels.Op, inM, want []kernels.Meta, inB, outB []*buffer) error {
	y := want[0]
	switch op.Name {
	case kernels.OpZeros, kernels.OpOnes:
		v := 0.0
		if op.Name == kernels.OpOnes {
			v = 1
		}
		return b.generate(&kernels.Op{Name: kernels.OpFull, Value: v}, y, outB[0])
	case kernels.OpLinspace, kernels.OpEye, kernels.OpBernoulli:
		return b.generate(op, y, outB[0])
	case kernels.OpSqueeze, kernels.OpUnsqueeze:
		if n := y.Bytes(); n > 0 && inB[0].ptr != outB[0].ptr {
			b.queueCopy(outB[0].ptr, inB[0].ptr, n)
			return nil
		}
		return nil
	case kernels.OpTril, kernels.OpTriu:
		return b.tri(op, y, inB[0], outB[0])
	}
	if isIndexing(op.Name) {
		return b.indexOp(op, inM, y, inB, outB[0])
	}
	if op.Name == kernels.OpLayerNorm || op.Name == kernels.OpRMSNorm {
		return b.norm(op, inM, inB, outB[0])
	}
	x := inM[0]
	es := y.DType.Size()
	switch op.Name {
	case kernels.OpExpand:
		r, xr := len(y.Shape), len(x.Shape)
		xst := rowStrides(x.Shape)
		sst := make([]int, r)
		for d := range r {
			if j := d - (r - xr); j >= 0 && x.Shape[j] == y.Shape[d] {
				sst[d] = xst[j]
			}
		}
		return b.move(es, outB[0].ptr, 0, rowStrides(y.Shape), inB[0].ptr, 0, sst, y.Shape)
	case kernels.OpSlice:
		start, step, n, err := kernels.SliceRanges(op, x.Shape)
		if err != nil {
			return err
		}
		xst := rowStrides(x.Shape)
		sst := make([]int, len(n))
		base := 0
		for d := range n {
			sst[d] = step[d] * xst[d]
			base += start[d] * xst[d]
		}
		return b.move(es, outB[0].ptr, 0, rowStrides(n), inB[0].ptr, base, sst, n)
	case kernels.OpFlip:
		axes, err := kernels.NormAxes(op.Axes, len(x.Shape))
		if err != nil {
			return err
		}
		sst := rowStrides(x.Shape)
		base := 0
		for _, a := range axes {
			if x.Shape[a] > 0 {
				base += (x.Shape[a] - 1) * sst[a]
			}
			sst[a] = -sst[a]
		}
		return b.move(es, outB[0].ptr, 0, rowStrides(x.Shape), inB[0].ptr, base, sst, x.Shape)
	case kernels.OpPad:
		if err := b.generate(&kernels.Op{Name: kernels.OpFull, Value: op.Value}, y, outB[0]); err != nil {
			return err
		}
		yst := rowStrides(y.Shape)
		base := 0
		for d := range x.Shape {
			base += op.Pads[2*d] * yst[d]
		}
		return b.move(es, outB[0].ptr, base, yst, inB[0].ptr, 0, rowStrides(x.Shape), x.Shape)
	case kernels.OpConcat:
		axis, err := kernels.NormAxis(op.Name, op.Axis, len(y.Shape))
		if err != nil {
			return err
		}
		yst := rowStrides(y.Shape)
		off := 0
		for i, m := range inM {
			if err := b.move(es, outB[0].ptr, off*yst[axis], yst, inB[i].ptr, 0, rowStrides(m.Shape), m.Shape); err != nil {
				return err
			}
			off += m.Shape[axis]
		}
		return nil
	case kernels.OpStack:
		axis, err := kernels.NormAxis(op.Name, op.Axis, len(y.Shape))
		if err != nil {
			return err
		}
		yst := rowStrides(y.Shape)
		for i, m := range inM {
			shape := slices.Insert(slices.Clone(m.Shape), axis, 1)
			if err := b.move(es, outB[0].ptr, i*yst[axis], yst, inB[i].ptr, 0, rowStrides(shape), shape); err != nil {
				return err
			}
		}
		return nil
	case kernels.OpSplit:
		axis, err := kernels.NormAxis(op.Name, op.Axis, len(x.Shape))
		if err != nil {
			return err
		}
		xst := rowStrides(x.Shape)
		off := 0
		for k, m := range want {
			if err := b.move(es, outB[k].ptr, 0, rowStrides(m.Shape), inB[0].ptr, off*xst[axis], xst, m.Shape); err != nil {
				return err
			}
			off += m.Shape[axis]
		}
		return nil
	}
	return fmt.Errorf("%w: %s", kernels.ErrNotImplemented, op.Name)
}

// launchGrid is the grid of a grid-stride loop over n elements.
func (b *Backend) launchGrid(n int) [3]uint32 {
	return [3]uint32{uint32(min(ceilDiv(n, blockSize), 32*max(b.sms, 1))), 1, 1}
}

// move queues a strided copy of shape (see moveSpec); counts in elements
// of es bytes.
func (b *Backend) move(es int, dst uint64, dbase int, dstr []int, src uint64, sbase int, sst []int, shape []int) error {
	n := kernels.Numel(shape)
	if n == 0 {
		return nil
	}
	// Axes of extent 1 move nothing.
	var sh, ds, ss []int
	for d, c := range shape {
		if c != 1 {
			sh, ds, ss = append(sh, c), append(ds, dstr[d]), append(ss, sst[d])
		}
	}
	if len(sh) > maxMoveRank {
		return fmt.Errorf("%w: a copy of rank %d", kernels.ErrNotImplemented, len(sh))
	}
	m := moveSpec{size: es, rank: len(sh)}
	f, err := b.function(m.key(), func() (string, error) { return m.source(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(dst)
	a.ptr(src)
	a.i64(n)
	a.i64(dbase)
	a.i64(sbase)
	for k := range sh {
		a.i64(sh[k])
		a.i64(ds[k])
		a.i64(ss[k])
	}
	b.queueLaunch(f, b.launchGrid(n), blockSize, &a)
	return nil
}

// tri queues tril or triu.
func (b *Backend) tri(op *kernels.Op, y kernels.Meta, in, out *buffer) error {
	n := y.Numel()
	if n == 0 {
		return nil
	}
	r := len(y.Shape)
	rows, cols := y.Shape[r-2], y.Shape[r-1]
	t := triSpec{size: y.DType.Size(), upper: op.Name == kernels.OpTriu}
	f, err := b.function(t.key(), func() (string, error) { return t.source(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(out.ptr)
	a.ptr(in.ptr)
	a.i64(n)
	a.i64(rows)
	a.i64(cols)
	a.i64(max(-rows-1, min(op.K, cols+1)))
	b.queueLaunch(f, b.launchGrid(n), blockSize, &a)
	return nil
}
