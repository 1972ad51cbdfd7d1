package cpu

import "math"

// fast2x2 enables maxPool2x2 and maxPoolGrad2x2; tests turn it off to
// compare.
var fast2x2 = true

// maxPoolGrad2x2 is max_pool2d_grad of one plane for the common window:
// kernel 2×2, stride 2, no padding, no dilation. Windows do not overlap, so
// each input element takes its window's dy or zero, written once, without
// the general path's clear and scatter; the first maximum of each window
// is chosen without data-dependent branches. It gives the general path's
// bits (a NaN is the maximum, the first one wins; ties go to the first;
// dy lands as 0 + dy) and reports false, doing nothing, for other
// windows.
func maxPoolGrad2x2[T float](g *poolGeom, dx, dy, x []T) bool {
	if g.KH != 2 || g.KW != 2 || g.SH != 2 || g.SW != 2 || g.PH != 0 || g.PW != 0 || g.DH != 1 || g.DW != 1 {
		return false
	}
	w, oh, ow := g.W, g.OH, g.OW
	if g.H != 2*oh || w != 2*ow {
		clear(dx) // rows or columns no window covers
	}
	for i := range oh {
		r0, r1 := x[2*i*w:2*i*w+w], x[(2*i+1)*w:(2*i+1)*w+w]
		d0, d1 := dx[2*i*w:2*i*w+w], dx[(2*i+1)*w:(2*i+1)*w+w]
		dr := dy[i*ow : i*ow+ow]
		for j, gv := range dr {
			v := [4]T{r0[2*j], r0[2*j+1], r1[2*j], r1[2*j+1]}
			k := 0
			k = pick(greater(v[1], v[k]), 1, k)
			k = pick(greater(v[2], v[k]), 2, k)
			k = pick(greater(v[3], v[k]), 3, k)
			sel := [2]T{0, 0 + gv}
			d0[2*j] = sel[b2u(k == 0)]
			d0[2*j+1] = sel[b2u(k == 1)]
			d1[2*j] = sel[b2u(k == 2)]
			d1[2*j+1] = sel[b2u(k == 3)]
		}
	}
	return true
}

// greater is 1 if v ranks above w when NaN ranks above everything: v > w,
// or v is NaN and w is not; else 0. No branches.
func greater[T float](v, w T) uint8 {
	return b2u(v > w) | b2u(v != v)&b2u(w == w)
}

// pick is a if c is 1, else b, without a branch.
func pick(c uint8, a, b int) int {
	return b ^ (a^b)&-int(c)
}

// maxPool2x2 is max_pool2d of one plane for the window of maxPoolGrad2x2:
// each output is the max of its four inputs taken in maxRow's order
// (from -∞, row by row), so the bits are the general path's, without its
// loops over taps. It reports false, doing nothing, for other windows.
func maxPool2x2[T float](g *poolGeom, y, x []T) bool {
	if g.KH != 2 || g.KW != 2 || g.SH != 2 || g.SW != 2 || g.PH != 0 || g.PW != 0 || g.DH != 1 || g.DW != 1 {
		return false
	}
	w, ow := g.W, g.OW
	inf := T(math.Inf(-1))
	for i := range g.OH {
		r0, r1 := x[2*i*w:2*i*w+2*ow], x[(2*i+1)*w:(2*i+1)*w+2*ow]
		dst := y[i*ow : i*ow+ow]
		for j := range dst {
			dst[j] = max(max(max(max(inf, r0[2*j]), r0[2*j+1]), r1[2*j]), r1[2*j+1])
		}
	}
	return true
}
