//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels"
)

// The direct float32 convolution and input gradient, for stride 1, no
// padding, no dilation, one group and at least directMinK channels on the
// summed side: no column matrix. A plane of x read from offset i·W+j is, for every output
// pixel (oh, ow), x at (oh+i, ow+j), when the output rows are taken W wide
// (the last KW-1 columns of each row are then garbage, computed and
// dropped). So the product over the kernel tap (i, j) is a matrix product
// whose B is x itself, read in place (its k rows are the channel planes,
// H·W apart), and a convolution is the sum of KH·KW such products, each
// added to the last by the micro-kernels. The gradient with respect to x
// is the same over dy padded by KH-1 rows and KW-1 columns on each side,
// with the taps flipped. Each element is a fixed sequence of fused
// multiply-add chains, tap by tap, so the bits depend on the shapes alone,
// as everywhere in this package.

// directMinK is the fewest channels summed per tap for which the direct
// path pays: below it the micro-kernels' k loops are too short.
const directMinK = 8

// directKern is the micro-kernel of the direct convolutions.
func directKern() (gemmKernel[float32], bool) {
	switch {
	case directForce != nil:
		return *directForce, true
	case hasAVX512:
		return kern12x32, true
	case hasAVX2FMA:
		return kern6x16, true
	}
	return gemmKernel[float32]{}, false
}

// direct reports whether the direct path takes op (the name of a
// convolution op) on p.
func (p *convPlan) direct(op string) bool {
	if _, ok := directKern(); !ok || directOff {
		return false
	}
	if p.Groups != 1 || p.SH != 1 || p.SW != 1 || p.DH != 1 || p.DW != 1 || p.PH != 0 || p.PW != 0 {
		return false
	}
	if p.OH < 1 || p.OW < 1 || p.N < 1 {
		return false
	}
	switch op {
	case "input_grad":
		return p.O >= directMinK
	case "forward":
		return p.C >= directMinK
	}
	return false
}

// directOff turns the direct path off, and directForce picks its
// micro-kernel, for tests that compare the paths.
var (
	directOff   = false
	directForce *gemmKernel[float32]
)

// runKern calls the micro-kernel on slices, checking that the elements it
// reads and writes are inside them: k rows of b (ldb apart, kern.nr
// wide), kern.mr rows of a (lda apart, k long) and of c (ldc apart,
// kern.nr wide).
func runKern(kern gemmKernel[float32], k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, add bool) {
	if k > 0 {
		_ = a[(kern.mr-1)*lda+k-1]
		_ = b[(k-1)*ldb+kern.nr-1]
	}
	_ = c[(kern.mr-1)*ldc+kern.nr-1]
	kern.run(k, unsafe.SliceData(a), lda, unsafe.SliceData(b), ldb, unsafe.SliceData(c), ldc, add)
}

// conv2DDirect is conv2D on the direct path: y = conv2d(x, w) + bias,
// then relu of it if relu.
func conv2DDirect(p *convPlan, y, x, w, bias []float32, relu bool) {
	kern, _ := directKern()
	mr, nr := kern.mr, kern.nr
	C, O, W, KW := p.C, p.O, p.W, p.KW
	T := p.KH * KW
	R, HW := T*C, p.H*W
	Q := p.OH * W // output pixels, rows taken W wide
	Qp, Op := roundUp(Q, nr), roundUp(O, mr)
	// wt: A of every tap, [o][tap][ci], zero rows past O.
	wt := make([]float32, Op*R)
	for o := range O {
		for ci := range C {
			for t := range T {
				wt[o*R+t*C+ci] = w[(o*C+ci)*T+t]
			}
		}
	}
	// xs: one sample's x, with zeros after it for the garbage columns
	// of the last panel.
	xsLen := C*HW + Qp - Q + (p.KH-1)*W + KW
	run := func(lo, hi int) {
		hx, hy := getF64(0), getF64(0)
		defer f64Pool.Put(hx)
		defer f64Pool.Put(hy)
		xs := packBuf[float32](hx, xsLen)
		ye := packBuf[float32](hy, Op*Qp)
		clear(xs[C*HW:])
		for n := lo; n < hi; n++ {
			copy(xs, x[n*C*HW:(n+1)*C*HW])
			for o0 := 0; o0 < Op; o0 += mr {
				for c0 := 0; c0 < Qp; c0 += nr {
					for t := range T {
						off := t/KW*W + t%KW
						runKern(kern, C, wt[o0*R+t*C:], R, xs[off+c0:], HW, ye[o0*Qp+c0:], Qp, t > 0)
					}
				}
			}
			for o := range O {
				for oh := range p.OH {
					writeOut(y[((n*O+o)*p.OH+oh)*p.OW:][:p.OW], ye[o*Qp+oh*W:][:p.OW], bias, o, relu)
				}
			}
		}
	}
	runChunks(p.N, p.flops(), run)
}

// conv2DInputGradDirect is conv2DInputGrad on the direct path.
func conv2DInputGradDirect(p *convPlan, dx, dy, w []float32) {
	kern, _ := directKern()
	mr, nr := kern.mr, kern.nr
	C, O, KH, KW := p.C, p.O, p.KH, p.KW
	T := KH * KW
	R := T * O
	Hp, Wp := p.OH+2*(KH-1), p.OW+2*(KW-1) // dy padded
	HWp := Hp * Wp
	Q := p.H * Wp // input pixels, rows taken Wp wide
	Qp, Cp := roundUp(Q, nr), roundUp(C, mr)
	// wf: A of every tap (i', j') = (KH-1-i, KW-1-j), [ci][tap'][o].
	wf := make([]float32, Cp*R)
	for o := range O {
		for ci := range C {
			for t := range T {
				i, j := t/KW, t%KW
				tf := (KH-1-i)*KW + (KW - 1 - j)
				wf[ci*R+tf*O+o] = w[(o*C+ci)*T+t]
			}
		}
	}
	dypLen := O*HWp + Qp - Q + (KH-1)*Wp + KW
	run := func(lo, hi int) {
		hd, hx := getF64(0), getF64(0)
		defer f64Pool.Put(hd)
		defer f64Pool.Put(hx)
		dyp := packBuf[float32](hd, dypLen)
		xe := packBuf[float32](hx, Cp*Qp)
		clear(dyp) // the borders stay zero; the inside is written for each sample
		for n := lo; n < hi; n++ {
			for o := range O {
				for oh := range p.OH {
					copy(dyp[o*HWp+(oh+KH-1)*Wp+KW-1:][:p.OW], dy[((n*O+o)*p.OH+oh)*p.OW:][:p.OW])
				}
			}
			for c0 := 0; c0 < Cp; c0 += mr {
				for q0 := 0; q0 < Qp; q0 += nr {
					for t := range T {
						off := t/KW*Wp + t%KW
						runKern(kern, O, wf[c0*R+t*O:], R, dyp[off+q0:], HWp, xe[c0*Qp+q0:], Qp, t > 0)
					}
				}
			}
			for ci := range C {
				for h := range p.H {
					copy(dx[((n*C+ci)*p.H+h)*p.W:][:p.W], xe[ci*Qp+h*Wp:][:p.W])
				}
			}
		}
	}
	runChunks(p.N, p.flops(), run)
}

// runConvDirect runs a float32 convolution op on the direct path and
// reports true, or reports false, doing nothing, where that path does not
// take it.
func runConvDirect(p *convPlan, name string, in, out []*kernels.Tensor, relu bool) bool {
	v := func(t *kernels.Tensor) []float32 { return view[float32](data(t), t.Numel()) }
	switch name {
	case kernels.OpConv2D:
		if !p.direct("forward") {
			return false
		}
		var bias []float32
		if len(in) == 3 {
			bias = v(in[2])
		}
		conv2DDirect(p, v(out[0]), v(in[0]), v(in[1]), bias, relu)
	case kernels.OpConv2DInputGrad:
		if !p.direct("input_grad") {
			return false
		}
		conv2DInputGradDirect(p, v(out[0]), v(in[0]), v(in[1]))
	default:
		// The weight gradient stays on the column path: on the direct one
		// its products waste a fifth of their work on the rows that pad
		// the channels to the micro-kernel's blocks and on the garbage
		// columns, and ran slower (34.5 against 29.3 ms at the MNIST
		// network's second convolution, 2 Xeon cores).
		return false
	}
	return true
}
