//go:build cgo && linux

package cuda

import (
	"math"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// roundValues rounds v to dt, as uploading it does.
func roundValues(t testing.TB, dt kernels.DType, v []float64) []float64 {
	t.Helper()
	raw, err := kernels.EncodeValues(dt, v)
	if err != nil {
		t.Fatal(err)
	}
	r, err := kernels.DecodeValues(dt, raw)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// nnReference computes op in float64 straight from its definition.
func nnReference(t testing.TB, op *kernels.Op, ins []nnInput, shape []int) []float64 {
	t.Helper()
	out := make([]float64, kernels.Numel(shape))
	at4 := func(s []int, a, b, c, d int) int { return ((a*s[1]+b)*s[2]+c)*s[3] + d }
	// conv visits every (image, output channel, output position, input
	// channel of the group, tap) whose input position is in range.
	conv := func(g kernels.Window, f func(n, o, oh, ow, c, kh, kw, h, w int)) {
		cg, og := g.C/g.Groups, g.O/g.Groups
		for n := range g.N {
			for o := range g.O {
				for oh := range g.OH {
					for ow := range g.OW {
						for ci := range cg {
							for kh := range g.KH {
								for kw := range g.KW {
									h, w := oh*g.SH-g.PH+kh*g.DH, ow*g.SW-g.PW+kw*g.DW
									if h >= 0 && h < g.H && w >= 0 && w < g.W {
										f(n, o, oh, ow, o/og*cg+ci, kh, kw, h, w)
									}
								}
							}
						}
					}
				}
			}
		}
	}
	// window visits the in-range positions of each pooling window.
	window := func(g kernels.Window, n, c, oh, ow int, f func(h, w int)) {
		for kh := range g.KH {
			for kw := range g.KW {
				h, w := oh*g.SH-g.PH+kh*g.DH, ow*g.SW-g.PW+kw*g.DW
				if h >= 0 && h < g.H && w >= 0 && w < g.W {
					f(h, w)
				}
			}
		}
	}
	pools := func(g kernels.Window, f func(n, c, oh, ow int)) {
		for n := range g.N {
			for c := range g.C {
				for oh := range g.OH {
					for ow := range g.OW {
						f(n, c, oh, ow)
					}
				}
			}
		}
	}
	window2 := func(op *kernels.Op, x []int) kernels.Window {
		g, err := kernels.PoolWindow(op, x)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	switch op.Name {
	case kernels.OpConv2D:
		g, _ := kernels.ConvWindow(op, ins[0].shape, ins[1].shape)
		x, w, ys := ins[0].v, ins[1].v, g.YShape()
		conv(g, func(n, o, oh, ow, c, kh, kw, h, ww int) {
			out[at4(ys, n, o, oh, ow)] += x[at4(ins[0].shape, n, c, h, ww)] * w[at4(ins[1].shape, o, c%(g.C/g.Groups), kh, kw)]
		})
		if len(ins) == 3 {
			for i := range out {
				out[i] += ins[2].v[i/(g.OH*g.OW)%g.O]
			}
		}
	case kernels.OpConv2DInputGrad:
		g, _ := kernels.ConvWindow(op, op.Shape, ins[1].shape)
		dy, w := ins[0].v, ins[1].v
		conv(g, func(n, o, oh, ow, c, kh, kw, h, ww int) {
			out[at4(op.Shape, n, c, h, ww)] += dy[at4(ins[0].shape, n, o, oh, ow)] * w[at4(ins[1].shape, o, c%(g.C/g.Groups), kh, kw)]
		})
	case kernels.OpConv2DWeightGrad:
		g, _ := kernels.ConvWindow(op, ins[0].shape, op.Shape)
		x, dy := ins[0].v, ins[1].v
		conv(g, func(n, o, oh, ow, c, kh, kw, h, ww int) {
			out[at4(op.Shape, o, c%(g.C/g.Groups), kh, kw)] += dy[at4(ins[1].shape, n, o, oh, ow)] * x[at4(ins[0].shape, n, c, h, ww)]
		})
	case kernels.OpMaxPool2D, kernels.OpMaxPool2DGrad:
		xs := ins[0].shape
		if op.Name == kernels.OpMaxPool2DGrad {
			xs = ins[1].shape
		}
		g := window2(op, xs)
		x := ins[len(ins)-1].v
		pools(g, func(n, c, oh, ow int) {
			best, at := 0.0, -1
			window(g, n, c, oh, ow, func(h, w int) {
				j := at4(xs, n, c, h, w)
				v := x[j]
				if at < 0 || v > best || (math.IsNaN(v) && !math.IsNaN(best)) {
					best, at = v, j
				}
			})
			yi := at4(g.YShape(), n, c, oh, ow)
			if op.Name == kernels.OpMaxPool2D {
				if at < 0 {
					best = math.Inf(-1)
				}
				out[yi] = best
			} else if at >= 0 {
				out[at] += ins[0].v[yi]
			}
		})
	case kernels.OpAvgPool2D, kernels.OpAvgPool2DGrad:
		xs := ins[0].shape
		if op.Name == kernels.OpAvgPool2DGrad {
			xs = op.Shape
		}
		g := window2(op, xs)
		div := float64(g.KH * g.KW)
		pools(g, func(n, c, oh, ow int) {
			yi := at4(g.YShape(), n, c, oh, ow)
			window(g, n, c, oh, ow, func(h, w int) {
				if op.Name == kernels.OpAvgPool2D {
					out[yi] += ins[0].v[at4(xs, n, c, h, w)] / div
				} else {
					out[at4(xs, n, c, h, w)] += ins[0].v[yi] / div
				}
			})
		})
	case kernels.OpCrossEntropy, kernels.OpCrossEntropyGrad:
		red, _ := kernels.CrossEntropyReduce(op)
		n, c := ins[0].shape[0], ins[0].shape[1]
		sum := 0.0
		for i := range n {
			row := ins[0].v[i*c : (i+1)*c]
			m := math.Inf(-1)
			for _, v := range row {
				m = math.Max(m, v)
			}
			s := 0.0
			for _, v := range row {
				s += math.Exp(v - m)
			}
			tg := int(ins[1].v[i])
			if op.Name == kernels.OpCrossEntropy {
				loss := m + math.Log(s) - row[tg]
				if red == kernels.ReduceNone {
					out[i] = loss
				}
				sum += loss
				continue
			}
			gi := ins[2].v[0]
			switch red {
			case kernels.ReduceNone:
				gi = ins[2].v[i]
			case kernels.ReduceMean:
				gi /= float64(n)
			}
			for j, v := range row {
				p := math.Exp(v-m) / s
				if j == tg {
					p--
				}
				out[i*c+j] = p * gi
			}
		}
		if op.Name == kernels.OpCrossEntropy && red != kernels.ReduceNone {
			if red == kernels.ReduceMean {
				sum /= float64(n)
			}
			out[0] = sum
		}
	default:
		t.Fatalf("no reference for %s", op.Name)
	}
	return out
}
