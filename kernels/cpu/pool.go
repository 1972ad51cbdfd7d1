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

func runPool[T float](g *kernels.Window, name string, in, out []*kernels.Tensor) {
	v := func(t *kernels.Tensor) []T { return view[T](data(t), t.Numel()) }
	y := v(out[0])
	a := v(in[0])
	var x []T
	if len(in) == 2 {
		x = v(in[1])
	}
	hw, ohw := g.H*g.W, g.OH*g.OW
	planes := g.N * g.C
	gg := *g
	f := func(lo, hi int) {
		for pl := lo; pl < hi; pl++ {
			switch name {
			case kernels.OpMaxPool2D:
				maxPool(&gg, y[pl*ohw:(pl+1)*ohw], a[pl*hw:(pl+1)*hw])
			case kernels.OpAvgPool2D:
				avgPool(&gg, y[pl*ohw:(pl+1)*ohw], a[pl*hw:(pl+1)*hw])
			case kernels.OpMaxPool2DGrad:
				maxPoolGrad(&gg, y[pl*hw:(pl+1)*hw], a[pl*ohw:(pl+1)*ohw], x[pl*hw:(pl+1)*hw])
			default:
				avgPoolGrad(&gg, y[pl*hw:(pl+1)*hw], a[pl*ohw:(pl+1)*ohw])
			}
		}
	}
	if w := split(planes, ohw*g.KH*g.KW+hw); w > 1 {
		parallel(planes, w, f)
		return
	}
	f(0, planes)
}

// window returns the kernel rows [i0, i1) and columns [j0, j1) of output
// (oh, ow) that fall inside the input, and the input offsets of kernel
// row and column 0.
func window(g *kernels.Window, oh, ow int) (i0, i1, j0, j1, h0, w0 int) {
	h0, w0 = oh*g.SH-g.PH, ow*g.SW-g.PW
	i0, i1 = rowRange(g.KH, g.H, g.DH, h0)
	j0, j1 = rowRange(g.KW, g.W, g.DW, w0)
	return
}

// argmaxWindow is the input offset of the first largest element of output
// (oh, ow)'s window (the first NaN, if any), or -1 if the window holds
// only padding.
func argmaxWindow[T float](g *kernels.Window, x []T, oh, ow int) int {
	i0, i1, j0, j1, h0, w0 := window(g, oh, ow)
	best := -1
	var bv T
	for i := i0; i < i1; i++ {
		row := x[(h0+i*g.DH)*g.W:]
		for j := j0; j < j1; j++ {
			iw := w0 + j*g.DW
			v := row[iw]
			if best < 0 || v > bv || v != v && bv == bv {
				best, bv = (h0+i*g.DH)*g.W+iw, v
			}
		}
	}
	return best
}

func maxPool[T float](g *kernels.Window, y, x []T) {
	for oh := range g.OH {
		for ow := range g.OW {
			k := argmaxWindow(g, x, oh, ow)
			if k < 0 {
				y[oh*g.OW+ow] = T(math.Inf(-1))
				continue
			}
			y[oh*g.OW+ow] = x[k]
		}
	}
}

func maxPoolGrad[T float](g *kernels.Window, dx, dy, x []T) {
	clear(dx)
	for oh := range g.OH {
		for ow := range g.OW {
			if k := argmaxWindow(g, x, oh, ow); k >= 0 {
				dx[k] += dy[oh*g.OW+ow]
			}
		}
	}
}

func avgPool[T float](g *kernels.Window, y, x []T) {
	div := float64(g.KH * g.KW)
	for oh := range g.OH {
		for ow := range g.OW {
			i0, i1, j0, j1, h0, w0 := window(g, oh, ow)
			s := 0.0
			for i := i0; i < i1; i++ {
				row := x[(h0+i)*g.W:]
				for j := j0; j < j1; j++ {
					s += float64(row[w0+j])
				}
			}
			y[oh*g.OW+ow] = T(s / div)
		}
	}
}

func avgPoolGrad[T float](g *kernels.Window, dx, dy []T) {
	clear(dx)
	div := float64(g.KH * g.KW)
	for oh := range g.OH {
		for ow := range g.OW {
			d := T(float64(dy[oh*g.OW+ow]) / div)
			i0, i1, j0, j1, h0, w0 := window(g, oh, ow)
			for i := i0; i < i1; i++ {
				row := dx[(h0+i)*g.W:]
				for j := j0; j < j1; j++ {
					row[w0+j] += d
				}
			}
		}
	}
}
