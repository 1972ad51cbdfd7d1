package cpu

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execExpand, 1, kernels.OpExpand)
	def(execSlice, 1, kernels.OpSlice)
	def(execPad, 1, kernels.OpPad)
	defVar(execConcat, -1, 1, kernels.OpConcat)
	defVar(execStack, -1, 1, kernels.OpStack)
	defVar(execSplit, 1, -1, kernels.OpSplit)
	def(execFlip, 1, kernels.OpFlip)
	def(execCopy, 1, kernels.OpSqueeze, kernels.OpUnsqueeze)
	def(execGather, 2, kernels.OpGather)
	def(execScatterAdd, 3, kernels.OpScatterAdd)
	def(execIndexSelect, 2, kernels.OpIndexSelect)
	def(execOneHot, 1, kernels.OpOneHot)
	def(execTri, 1, kernels.OpTril, kernels.OpTriu)
}

// checkMetas checks in and out against what kernels.Infer makes of op, so
// that an op run without Infer fails instead of reading or writing past a
// tensor.
func checkMetas(op *kernels.Op, in, out []*kernels.Tensor) error {
	metas := make([]kernels.Meta, len(in))
	for i, t := range in {
		metas[i] = t.Meta
	}
	want, err := kernels.Infer(op, metas, kernels.Limits{})
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	if len(want) != len(out) {
		return fmt.Errorf("%w: cpu: %s makes %d outputs, got %d", kernels.ErrArity, op.Name, len(want), len(out))
	}
	for i, m := range want {
		if out[i].DType != m.DType {
			return dtypeErr(op, "output", i, out[i].DType)
		}
		if !sameShape(out[i].Shape, m.Shape) {
			return shapeErr(op, "output %d is %v, want %v", i, out[i].Shape, m.Shape)
		}
	}
	return nil
}

// strides returns the row-major element strides of shape.
func strides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for d := len(shape) - 1; d >= 0; d-- {
		st[d] = s
		s *= shape[d]
	}
	return st
}

// move copies the elements of a tensor of shape, esize bytes each: the
// element at multi-index idx is read at element sbase + Σ idx·sst of src and
// written at element dbase + Σ idx·dst of dst. Strides may be negative or 0.
func move(dst []byte, dbase int, dstr []int, src []byte, sbase int, sst []int, shape []int, esize int) {
	if kernels.Numel(shape) == 0 {
		return
	}
	switch esize {
	case 1:
		moveRun(view[uint8](dst, len(dst)), dbase, dstr, view[uint8](src, len(src)), sbase, sst, shape)
	case 2:
		moveRun(view[uint16](dst, len(dst)/2), dbase, dstr, view[uint16](src, len(src)/2), sbase, sst, shape)
	case 4:
		moveRun(view[uint32](dst, len(dst)/4), dbase, dstr, view[uint32](src, len(src)/4), sbase, sst, shape)
	case 8:
		moveRun(view[uint64](dst, len(dst)/8), dbase, dstr, view[uint64](src, len(src)/8), sbase, sst, shape)
	}
}

func moveRun[T any](dst []T, dbase int, dstr []int, src []T, sbase int, sst []int, shape []int) {
	r := len(shape)
	if r == 0 {
		dst[dbase] = src[sbase]
		return
	}
	last, ds, ss := shape[r-1], dstr[r-1], sst[r-1]
	rows := kernels.Numel(shape) / last
	var idx [maxRank]int
	do, so := dbase, sbase
	for range rows {
		if ds == 1 && ss == 1 {
			copy(dst[do:do+last], src[so:so+last])
		} else {
			d, s := do, so
			for range last {
				dst[d] = src[s]
				d += ds
				s += ss
			}
		}
		for k := r - 2; k >= 0; k-- {
			idx[k]++
			do += dstr[k]
			so += sst[k]
			if idx[k] < shape[k] {
				break
			}
			do -= dstr[k] * shape[k]
			so -= sst[k] * shape[k]
			idx[k] = 0
		}
	}
}

func execExpand(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	r, xr := len(y.Shape), len(x.Shape)
	xst := strides(x.Shape)
	sst := make([]int, r)
	for d := range r {
		if j := d - (r - xr); j >= 0 && x.Shape[j] == y.Shape[d] {
			sst[d] = xst[j]
		}
	}
	move(data(y), 0, strides(y.Shape), data(x), 0, sst, y.Shape, x.DType.Size())
	return nil
}

func execSlice(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	start, step, n, err := kernels.SliceRanges(op, x.Shape)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	xst := strides(x.Shape)
	sst := make([]int, len(n))
	base := 0
	for d := range n {
		sst[d] = step[d] * xst[d]
		base += start[d] * xst[d]
	}
	move(data(y), 0, strides(n), data(x), base, sst, n, x.DType.Size())
	return nil
}

func execFlip(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	axes, err := kernels.NormAxes(op.Axes, len(x.Shape))
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	sst := strides(x.Shape)
	base := 0
	for _, a := range axes {
		if x.Shape[a] > 0 {
			base += (x.Shape[a] - 1) * sst[a]
		}
		sst[a] = -sst[a]
	}
	move(data(y), 0, strides(x.Shape), data(x), base, sst, x.Shape, x.DType.Size())
	return nil
}

func execPad(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	if err := execFull(b, &kernels.Op{Name: kernels.OpFull, Value: op.Value}, nil, out); err != nil {
		return err
	}
	yst := strides(y.Shape)
	base := 0
	for d := range x.Shape {
		base += op.Pads[2*d] * yst[d]
	}
	move(data(y), base, yst, data(x), 0, strides(x.Shape), x.Shape, x.DType.Size())
	return nil
}

func execConcat(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	y := out[0]
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(y.Shape))
	yst := strides(y.Shape)
	off := 0
	for _, x := range in {
		move(data(y), off*yst[axis], yst, data(x), 0, strides(x.Shape), x.Shape, x.DType.Size())
		off += x.Shape[axis]
	}
	return nil
}

func execStack(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	y := out[0]
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(y.Shape))
	yst := strides(y.Shape)
	for i, x := range in {
		shape := slices.Insert(slices.Clone(x.Shape), axis, 1)
		move(data(y), i*yst[axis], yst, data(x), 0, strides(shape), shape, x.DType.Size())
	}
	return nil
}

func execSplit(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x := in[0]
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(x.Shape))
	xst := strides(x.Shape)
	off := 0
	for _, y := range out {
		move(data(y), 0, strides(y.Shape), data(x), off*xst[axis], xst, y.Shape, x.DType.Size())
		off += y.Shape[axis]
	}
	return nil
}

// execCopy runs the ops that only relabel the shape.
func execCopy(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	parallelCopy(data(out[0]), data(in[0]))
	return nil
}

func execTri(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	yd := data(y)
	parallelCopy(yd, data(x))
	r := len(y.Shape)
	rows, cols := y.Shape[r-2], y.Shape[r-1]
	es := y.DType.Size()
	mats := kernels.Numel(y.Shape[:r-2])
	k := clampInt(op.K, -rows-1, cols+1) // the same rows kept, no overflow
	for m := range mats {
		for i := range rows {
			row := yd[(m*rows+i)*cols*es : (m*rows+i+1)*cols*es]
			// tril keeps j <= i+k; triu keeps j >= i+k.
			lo, hi := clampInt(i+k+1, 0, cols), cols
			if op.Name == kernels.OpTriu {
				lo, hi = 0, clampInt(i+k, 0, cols)
			}
			clear(row[lo*es : hi*es])
		}
	}
	return nil
}

func clampInt(v, lo, hi int) int { return max(lo, min(v, hi)) }

// indexAt reads element j of an i32 or i64 index tensor and resolves it
// against an axis of length n: negative values count from the end, and a
// value outside [-n, n) is an error wrapping kernels.ErrIndex.
func indexAt(op *kernels.Op, t *kernels.Tensor, j, n int) (int, error) {
	var v int64
	d := data(t)
	if t.DType == kernels.Int32 {
		v = int64(view[int32](d, t.Numel())[j])
	} else {
		v = view[int64](d, t.Numel())[j]
	}
	if v < -int64(n) || v >= int64(n) {
		return 0, fmt.Errorf("%w: %w: cpu: %s index %d out of range for an axis of %d", kernels.ErrIndex, kernels.ErrShape, op.Name, v, n)
	}
	if v < 0 {
		v += int64(n)
	}
	return int(v), nil
}

// alongAxis calls f for each element j of an index tensor of shape shape
// with the element offset in a tensor of strides xst that j points at:
// its own position on every axis but axis, where it takes the index value.
func alongAxis(op *kernels.Op, idx *kernels.Tensor, axis int, xshape []int, f func(j, off int)) error {
	shape := idx.Shape
	n := kernels.Numel(shape)
	xst := strides(xshape)
	var pos [maxRank]int
	base := 0 // Σ over the other axes of pos·xst
	for j := range n {
		v, err := indexAt(op, idx, j, xshape[axis])
		if err != nil {
			return err
		}
		f(j, base+v*xst[axis])
		for k := len(shape) - 1; k >= 0; k-- {
			pos[k]++
			if k != axis {
				base += xst[k]
			}
			if pos[k] < shape[k] {
				break
			}
			if k != axis {
				base -= xst[k] * shape[k]
			}
			pos[k] = 0
		}
	}
	return nil
}

func execGather(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, idx, y := in[0], in[1], out[0]
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(x.Shape))
	xd, yd, es := data(x), data(y), x.DType.Size()
	return alongAxis(op, idx, axis, x.Shape, func(j, off int) {
		copy(yd[j*es:(j+1)*es], xd[off*es:(off+1)*es])
	})
}

func execScatterAdd(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, idx, src, y := in[0], in[1], in[2], out[0]
	if x.DType == kernels.Float16 || x.DType == kernels.BFloat16 {
		return b.viaF32(op, in, out)
	}
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(x.Shape))
	parallelCopy(data(y), data(x))
	n, m := y.Numel(), src.Numel()
	yd, sd := data(y), data(src)
	switch y.DType {
	case kernels.Float32:
		return scatterAdd(op, idx, axis, y.Shape, view[float32](yd, n), view[float32](sd, m))
	case kernels.Float64:
		return scatterAdd(op, idx, axis, y.Shape, view[float64](yd, n), view[float64](sd, m))
	case kernels.Int32:
		return scatterAdd(op, idx, axis, y.Shape, view[int32](yd, n), view[int32](sd, m))
	case kernels.Int64:
		return scatterAdd(op, idx, axis, y.Shape, view[int64](yd, n), view[int64](sd, m))
	case kernels.Uint8:
		return scatterAdd(op, idx, axis, y.Shape, view[uint8](yd, n), view[uint8](sd, m))
	}
	return dtypeErr(op, "input", 0, x.DType)
}

// scatterAdd adds src into y in index order, so that repeated indices sum
// the same way on every run.
func scatterAdd[T float32 | float64 | int32 | int64 | uint8](op *kernels.Op, idx *kernels.Tensor, axis int, shape []int, y, src []T) error {
	return alongAxis(op, idx, axis, shape, func(j, off int) { y[off] += src[j] })
}

func execIndexSelect(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, idx, y := in[0], in[1], out[0]
	axis, _ := kernels.NormAxis(op.Name, op.Axis, len(x.Shape))
	es := x.DType.Size()
	outer := kernels.Numel(x.Shape[:axis])
	inner := kernels.Numel(x.Shape[axis+1:]) * es
	n, k := x.Shape[axis], idx.Numel()
	xd, yd := data(x), data(y)
	for i := range k {
		v, err := indexAt(op, idx, i, n)
		if err != nil {
			return err
		}
		for o := range outer {
			copy(yd[(o*k+i)*inner:(o*k+i+1)*inner], xd[(o*n+v)*inner:(o*n+v+1)*inner])
		}
	}
	return nil
}

func execOneHot(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	idx, y := in[0], out[0]
	yd := data(y)
	clear(yd)
	for j := range idx.Numel() {
		v, err := indexAt(op, idx, j, op.Depth)
		if err != nil {
			return err
		}
		kernels.PutValue(y.DType, yd, j*op.Depth+v, 1)
	}
	return nil
}
