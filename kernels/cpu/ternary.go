package cpu

import (
	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execWhere, 3, kernels.OpWhere)
	def(execClamp, 3, kernels.OpClamp)
	elementwise[kernels.OpWhere] = true
	elementwise[kernels.OpClamp] = true
}

// kern3 computes len(y) elements of a ternary op over a run whose operands
// advance by the strides s (0 or 1 each).
type kern3[C, T any] func(y []T, c []C, a, b []T, s [3]int)

// plan3 is the broadcast of a ternary op's inputs to its output; one flat
// run when every shape equals the output's.
func plan3(op *kernels.Op, in []*kernels.Tensor, y *kernels.Tensor) (bcast, error) {
	bc, ok := newBcast(y.Shape, in[0].Shape, in[1].Shape, in[2].Shape)
	if !ok {
		return bc, shapeErr(op, "inputs %v, %v and %v do not broadcast to output %v", in[0].Shape, in[1].Shape, in[2].Shape, y.Shape)
	}
	return bc, nil
}

// ternaryRun runs k over the broadcast bc, in parallel when it is large.
func ternaryRun[C, T any](k kern3[C, T], bc *bcast, y []T, c []C, a, b []T) {
	if len(y) == 0 {
		return
	}
	if w := split(len(y), 2); w > 1 {
		bb := *bc
		parallel(len(y), w, func(lo, hi int) { ternaryWalk(k, &bb, y, c, a, b, lo, hi) })
		return
	}
	ternaryWalk(k, bc, y, c, a, b, 0, len(y))
}

func ternaryWalk[C, T any](k kern3[C, T], bc *bcast, y []T, c []C, a, b []T, lo, hi int) {
	var s [3]int
	if bc.rank > 0 {
		l := bc.rank - 1
		s = [3]int{bc.st[0][l], bc.st[1][l], bc.st[2][l]}
	}
	bc.walk(lo, hi, func(o int, off [3]int, n int) {
		k(y[o:o+n], c[off[0]:], a[off[1]:], b[off[2]:], s)
	})
}

func execWhere(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	c, x, z, y := in[0], in[1], in[2], out[0]
	if c.DType != kernels.Bool {
		return dtypeErr(op, "input", 0, c.DType)
	}
	if z.DType != x.DType {
		return dtypeErr(op, "input", 2, z.DType)
	}
	if y.DType != x.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	bc, err := plan3(op, in, y)
	if err != nil {
		return err
	}
	cd := data(c)
	xd, zd, yd := data(x), data(z), data(y)
	nx, nz, n := x.Numel(), z.Numel(), y.Numel()
	// where only moves elements: pick by element size.
	switch x.DType.Size() {
	case 1:
		ternaryRun(whereK[uint8], &bc, yd[:n], cd, xd[:nx], zd[:nz])
	case 2:
		ternaryRun(whereK[uint16], &bc, view[uint16](yd, n), cd, view[uint16](xd, nx), view[uint16](zd, nz))
	case 4:
		ternaryRun(whereK[uint32], &bc, view[uint32](yd, n), cd, view[uint32](xd, nx), view[uint32](zd, nz))
	case 8:
		ternaryRun(whereK[uint64], &bc, view[uint64](yd, n), cd, view[uint64](xd, nx), view[uint64](zd, nz))
	}
	return nil
}

func whereK[T any](y []T, c []uint8, a, b []T, s [3]int) {
	if s == [3]int{1, 1, 1} {
		c, a, b := c[:len(y)], a[:len(y)], b[:len(y)]
		for i := range y {
			if c[i] != 0 {
				y[i] = a[i]
			} else {
				y[i] = b[i]
			}
		}
		return
	}
	var ic, ia, ib int
	for i := range y {
		if c[ic] != 0 {
			y[i] = a[ia]
		} else {
			y[i] = b[ib]
		}
		ic, ia, ib = ic+s[0], ia+s[1], ib+s[2]
	}
}

func execClamp(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, lo, hi, y := in[0], in[1], in[2], out[0]
	for i, t := range in[1:] {
		if t.DType != x.DType {
			return dtypeErr(op, "input", i+1, t.DType)
		}
	}
	if y.DType != x.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	bc, err := plan3(op, in, y)
	if err != nil {
		return err
	}
	xd, ld, hd, yd := data(x), data(lo), data(hi), data(y)
	nx, nl, nh, n := x.Numel(), lo.Numel(), hi.Numel(), y.Numel()
	switch x.DType {
	case kernels.Float32:
		ternaryRun(clampK[float32], &bc, view[float32](yd, n), view[float32](xd, nx), view[float32](ld, nl), view[float32](hd, nh))
	case kernels.Float64:
		ternaryRun(clampK[float64], &bc, view[float64](yd, n), view[float64](xd, nx), view[float64](ld, nl), view[float64](hd, nh))
	case kernels.Int32:
		ternaryRun(clampK[int32], &bc, view[int32](yd, n), view[int32](xd, nx), view[int32](ld, nl), view[int32](hd, nh))
	case kernels.Int64:
		ternaryRun(clampK[int64], &bc, view[int64](yd, n), view[int64](xd, nx), view[int64](ld, nl), view[int64](hd, nh))
	case kernels.Uint8:
		ternaryRun(clampK[uint8], &bc, yd[:n], xd[:nx], ld[:nl], hd[:nh])
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

// clampK is min(max(x, lo), hi); the builtins give NaN if any is NaN.
func clampK[T number](y []T, x, lo, hi []T, s [3]int) {
	var ix, il, ih int
	for i := range y {
		y[i] = min(max(x[ix], lo[il]), hi[ih])
		ix, il, ih = ix+s[0], il+s[1], ih+s[2]
	}
}
