package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execPool, 1, kernels.OpMaxPool2D, kernels.OpAvgPool2D, kernels.OpAvgPool2DGrad)
	def(execPool, 2, kernels.OpMaxPool2DGrad)
}

// execPool runs the poolings and their gradients, one task per (sample,
// channel) plane; the gradients add into each plane in a fixed order.
func execPool(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	var g kernels.Window
	var err error
	switch op.Name {
	case kernels.OpMaxPool2DGrad:
		g, err = kernels.PoolWindow(op, in[1].Shape)
	case kernels.OpAvgPool2DGrad:
		g, err = kernels.PoolWindow(op, op.Shape)
	default:
		g, err = kernels.PoolWindow(op, in[0].Shape)
	}
	if err != nil {
		return err
	}
	if out[0].Numel() == 0 {
		return nil
	}
	switch in[0].DType {
	case kernels.Float32:
		runPool[float32](&g, op.Name, in, out)
	case kernels.Float64:
		runPool[float64](&g, op.Name, in, out)
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, in[0].DType)
	}
	return nil
}

// poolAxis is the window of one output position along one axis: taps
// [lo, hi) fall inside the input, tap t at input position base + t*d.
type poolAxis struct{ lo, hi, base int }

// poolAxes returns the windows of the out positions of an axis of n
// inputs.
func poolAxes(out, n, k, s, p, d int) []poolAxis {
	ax := make([]poolAxis, out)
	for o := range ax {
		base := o*s - p
		lo, hi := rowRange(k, n, d, base)
		ax[o] = poolAxis{lo, hi, base}
	}
	return ax
}

// poolGeom is a pooling's geometry with the windows of every output row
// and column worked out once.
type poolGeom struct {
	*kernels.Window
	rows, cols []poolAxis
}

func runPool[T float](g *kernels.Window, name string, in, out []*kernels.Tensor) {
	v := func(t *kernels.Tensor) []T { return view[T](data(t), t.Numel()) }
	y := v(out[0])
	a := v(in[0])
	var x []T
	if len(in) == 2 {
		x = v(in[1])
	}
	pg := &poolGeom{Window: g,
		rows: poolAxes(g.OH, g.H, g.KH, g.SH, g.PH, g.DH),
		cols: poolAxes(g.OW, g.W, g.KW, g.SW, g.PW, g.DW)}
	hw, ohw := g.H*g.W, g.OH*g.OW
	planes := g.N * g.C
	f := func(lo, hi int) {
		val, key, idx := make([]T, g.OW), make([]uint64, g.OW), make([]int, g.OW)
		for pl := lo; pl < hi; pl++ {
			switch name {
			case kernels.OpMaxPool2D:
				maxPool(pg, y[pl*ohw:(pl+1)*ohw], a[pl*hw:(pl+1)*hw])
			case kernels.OpAvgPool2D:
				avgPool(pg, y[pl*ohw:(pl+1)*ohw], a[pl*hw:(pl+1)*hw])
			case kernels.OpMaxPool2DGrad:
				maxPoolGrad(pg, y[pl*hw:(pl+1)*hw], a[pl*ohw:(pl+1)*ohw], x[pl*hw:(pl+1)*hw], val, key, idx)
			default:
				avgPoolGrad(pg, y[pl*hw:(pl+1)*hw], a[pl*ohw:(pl+1)*ohw])
			}
		}
	}
	if w := split(planes, ohw*g.KH*g.KW+hw); w > 1 {
		parallel(planes, w, f)
		return
	}
	f(0, planes)
}

// maxRow sets val to the largest element of each window of output row oh
// (NaN if the window holds one; -∞ for a window of padding alone),
// visiting each tap for all the row's outputs at once.
func maxRow[T float](g *poolGeom, x []T, oh int, val []T) {
	ra := g.rows[oh]
	for ow := range val {
		val[ow] = T(math.Inf(-1))
	}
	for i := ra.lo; i < ra.hi; i++ {
		off := (ra.base + i*g.DH) * g.W
		row := x[off : off+g.W]
		for j := range g.KW {
			// The outputs whose tap j is inside the input.
			o0, o1 := rowRange(g.OW, g.W, g.SW, j*g.DW-g.PW)
			if o0 == o1 {
				continue
			}
			iw := o0*g.SW + j*g.DW - g.PW
			if g.SW == 1 {
				for ow, v := range row[iw : iw+o1-o0] {
					val[o0+ow] = max(val[o0+ow], v)
				}
				continue
			}
			for ow := o0; ow < o1; ow, iw = ow+1, iw+g.SW {
				val[ow] = max(val[ow], row[iw])
			}
		}
	}
}

// floatKey is a float's bits with -0 as +0 and every NaN as one NaN, so
// that two floats have the same key if they compare equal or are both NaN.
func floatKey[T float](v T) uint64 {
	f := float64(v) + 0 // -0 + 0 is +0
	if f != f {
		return 0x7ff8000000000000
	}
	return math.Float64bits(f)
}

// argmaxRow sets idx to the input offset of the first element of each
// window of output row oh (row-major window order) that equals its largest
// val, or that is NaN where val is; -1 for a window of padding alone. It
// walks the taps backwards, so that the last match it sees is the first,
// and compares keys (see floatKey), so that its loop has no branch that
// depends on the data but for NaN.
func argmaxRow[T float](g *poolGeom, x []T, oh int, val []T, key []uint64, idx []int) {
	ra := g.rows[oh]
	for ow, v := range val {
		idx[ow] = -1
		key[ow] = floatKey(v)
	}
	for i := ra.hi - 1; i >= ra.lo; i-- {
		off := (ra.base + i*g.DH) * g.W
		row := x[off : off+g.W]
		for j := g.KW - 1; j >= 0; j-- {
			o0, o1 := rowRange(g.OW, g.W, g.SW, j*g.DW-g.PW)
			iw := o0*g.SW + j*g.DW - g.PW
			for ow := o0; ow < o1; ow, iw = ow+1, iw+g.SW {
				k := idx[ow]
				if floatKey(row[iw]) == key[ow] {
					k = off + iw
				}
				idx[ow] = k
			}
		}
	}
}

func maxPool[T float](g *poolGeom, y, x []T) {
	if fast2x2 && maxPool2x2(g, y, x) {
		return
	}
	for oh := range g.OH {
		maxRow(g, x, oh, y[oh*g.OW:(oh+1)*g.OW])
	}
}

func maxPoolGrad[T float](g *poolGeom, dx, dy, x, val []T, key []uint64, idx []int) {
	if fast2x2 && maxPoolGrad2x2(g, dx, dy, x) {
		return
	}
	clear(dx)
	for oh := range g.OH {
		maxRow(g, x, oh, val)
		argmaxRow(g, x, oh, val, key, idx)
		for ow, k := range idx {
			if k >= 0 {
				dx[k] += dy[oh*g.OW+ow]
			}
		}
	}
}

// avgPool and avgPoolGrad: avg_pool2d has no dilation.

func avgPool[T float](g *poolGeom, y, x []T) {
	div := float64(g.KH * g.KW)
	for oh, ra := range g.rows {
		for ow, ca := range g.cols {
			s := 0.0
			for i := ra.lo; i < ra.hi && ca.lo < ca.hi; i++ {
				row := x[(ra.base+i)*g.W:]
				for _, v := range row[ca.base+ca.lo : ca.base+ca.hi] {
					s += float64(v)
				}
			}
			y[oh*g.OW+ow] = T(s / div)
		}
	}
}

func avgPoolGrad[T float](g *poolGeom, dx, dy []T) {
	clear(dx)
	div := float64(g.KH * g.KW)
	for oh, ra := range g.rows {
		for ow, ca := range g.cols {
			d := T(float64(dy[oh*g.OW+ow]) / div)
			for i := ra.lo; i < ra.hi && ca.lo < ca.hi; i++ {
				row := dx[(ra.base+i)*g.W:]
				seg := row[ca.base+ca.lo : ca.base+ca.hi]
				for j := range seg {
					seg[j] += d
				}
			}
		}
	}
}
