package cpu

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	defVar(execConv, -1, 1, kernels.OpConv2D)
	def(execConv, 2, kernels.OpConv2DInputGrad, kernels.OpConv2DWeightGrad)
}

// The convolutions run as matrix products over column matrices (im2col):
// for one group, the column matrix of a chunk of the input has a row per
// (input channel, kernel row, kernel column) and a column per output pixel
// of the chunk, so that
//
//	y     = W   · col             (forward)
//	dcol  = Wᵀ  · dy, then summed back into dx (input grad, col2im)
//	dWᵀ   = col · dyᵀ, summed over chunks     (weight grad)
//
// each through the matmul kernels. Chunks are whole samples, or ranges of
// output rows of one sample, sized so that a column matrix stays near
// colElems elements; the chunking depends on the shapes alone, and every
// sum runs in a fixed order, so results do not depend on the core count.

// colElems is the target size of one chunk's column matrix, in elements
// (a variable so that tests can make chunks small).
var colElems = 1 << 20

// minCols is the column matrix size below which a chunk takes several
// samples, and minTasks the number of chunks it keeps at least, where
// there are enough samples.
const (
	minCols  = 1 << 13
	minTasks = 16
)

// maxPartials bounds the partial weight gradients summed at the end.
const maxPartials = 16

// convPlan is a convolution's geometry and its chunking.
type convPlan struct {
	kernels.Window
	cg, og    int // input and output channels per group
	r         int // rows of a column matrix: cg*KH*KW
	p         int // pixels of an output plane: OH*OW
	rows      int // output rows per chunk; below OH, chunks cut one sample
	samples   int // samples per chunk when rows == OH
	perSample int // chunks per sample when rows < OH
	pointwise bool
}

// chunk is samples [n0, n1), output rows [oh0, oh1) of each.
type chunk struct{ n0, n1, oh0, oh1 int }

func newConvPlan(g kernels.Window) *convPlan {
	p := &convPlan{Window: g, cg: g.C / g.Groups, og: g.O / g.Groups}
	p.r = p.cg * g.KH * g.KW
	p.p = g.OH * g.OW
	p.pointwise = g.KH == 1 && g.KW == 1 && g.SH == 1 && g.SW == 1 && g.PH == 0 && g.PW == 0
	p.rows = max(1, colElems/max(1, p.r*g.OW))
	if p.rows >= g.OH {
		// One sample a chunk, whose outputs the products then write in
		// place, unless samples are so small that the products would be
		// tiny; but at least minTasks chunks where there are the samples.
		p.rows = g.OH
		p.samples = max(1, min(minCols/max(1, p.r*p.p), (g.N+minTasks-1)/minTasks))
		p.perSample = 1
	} else {
		p.samples = 1
		p.perSample = (g.OH + p.rows - 1) / p.rows
	}
	return p
}

// chunks is the number of chunks.
func (p *convPlan) chunks() int {
	if p.rows < p.OH {
		return p.N * p.perSample
	}
	return (p.N + p.samples - 1) / p.samples
}

func (p *convPlan) chunk(i int) chunk {
	if p.rows < p.OH {
		n, k := i/p.perSample, i%p.perSample
		return chunk{n, n + 1, k * p.rows, min(p.OH, (k+1)*p.rows)}
	}
	return chunk{i * p.samples, min(p.N, (i+1)*p.samples), 0, p.OH}
}

// cols is the number of output pixels of c: the columns of its column matrix.
func (p *convPlan) cols(c chunk) int { return (c.n1 - c.n0) * (c.oh1 - c.oh0) * p.OW }

// whole reports whether c is exactly one sample, whose output planes are
// then contiguous.
func (p *convPlan) whole(c chunk) bool { return c.n1-c.n0 == 1 && c.oh0 == 0 && c.oh1 == p.OH }

// flops is the multiply-adds of one pass, for deciding on parallelism.
func (p *convPlan) flops() int { return p.N * p.O * p.p * max(p.r, 1) }

// chunkWorkers is the number of goroutines runChunks shares n tasks
// among: the cores when the work is large.
func chunkWorkers(n, work int) int {
	if work >= 1<<18 {
		return max(1, min(threads(), n))
	}
	return 1
}

// runChunks runs tasks [0, n) on the cores when the work is large.
func runChunks(n, work int, run func(lo, hi int)) {
	if w := chunkWorkers(n, work); w > 1 {
		parallelDynamic(n, w, run)
		return
	}
	run(0, n)
}

// gemm sets c[m×n] = a[m×k]·b[k×n], row-major, with the matmul kernels;
// on the calling goroutine alone if serial (its caller runs the chunks
// of a convolution on the cores already).
func gemm[T float](c, a, b []T, m, k, n int, serial bool) {
	p := mm{m: m, k: k, n: n, serial: serial}
	p.batch, _ = newBcast(nil)
	switch c := any(c).(type) {
	case []float32:
		matmulF32(&p, c, any(a).([]float32), any(b).([]float32))
	case []float64:
		matmulFloat(&p, c, any(a).([]float64), any(b).([]float64), micro2x4f64)
	}
}

// rowRange is the q in [0, n) for which 0 <= q*s+off < w; lo == hi when
// there is none.
func rowRange(n, w, s, off int) (lo, hi int) {
	if off < 0 {
		lo = (-off + s - 1) / s
	}
	if w > off {
		hi = (w - off + s - 1) / s
	}
	hi = min(hi, n)
	lo = min(lo, hi)
	return lo, hi
}

// transposeBlock sets dst[c*ldd+r] = src[r*lds+c] for r < rows, c < cols,
// four by four inside blocks that stay in cache.
func transposeBlock[T float](dst []T, ldd int, src []T, lds, rows, cols int) {
	const bs = 32
	for r0 := 0; r0 < rows; r0 += bs {
		r1 := min(r0+bs, rows)
		for c0 := 0; c0 < cols; c0 += bs {
			c1 := min(c0+bs, cols)
			r := r0
			for ; r+4 <= r1; r += 4 {
				s0 := src[r*lds : r*lds+c1]
				s1 := src[(r+1)*lds : (r+1)*lds+c1]
				s2 := src[(r+2)*lds : (r+2)*lds+c1]
				s3 := src[(r+3)*lds : (r+3)*lds+c1]
				c := c0
				for ; c+4 <= c1; c += 4 {
					a, b, e, f := s0[c:c+4:c+4], s1[c:c+4:c+4], s2[c:c+4:c+4], s3[c:c+4:c+4]
					d0 := dst[c*ldd+r : c*ldd+r+4 : c*ldd+r+4]
					d1 := dst[(c+1)*ldd+r : (c+1)*ldd+r+4 : (c+1)*ldd+r+4]
					d2 := dst[(c+2)*ldd+r : (c+2)*ldd+r+4 : (c+2)*ldd+r+4]
					d3 := dst[(c+3)*ldd+r : (c+3)*ldd+r+4 : (c+3)*ldd+r+4]
					d0[0], d0[1], d0[2], d0[3] = a[0], b[0], e[0], f[0]
					d1[0], d1[1], d1[2], d1[3] = a[1], b[1], e[1], f[1]
					d2[0], d2[1], d2[2], d2[3] = a[2], b[2], e[2], f[2]
					d3[0], d3[1], d3[2], d3[3] = a[3], b[3], e[3], f[3]
				}
				for ; c < c1; c++ {
					d := dst[c*ldd+r : c*ldd+r+4 : c*ldd+r+4]
					d[0], d[1], d[2], d[3] = s0[c], s1[c], s2[c], s3[c]
				}
			}
			for ; r < r1; r++ {
				for c, v := range src[r*lds+c0 : r*lds+c1] {
					dst[(c0+c)*ldd+r] = v
				}
			}
		}
	}
}

// im2col writes the column matrix of chunk c and group gi of x into col:
// p.r rows of p.cols(c) elements.
func im2col[T float](p *convPlan, col, x []T, c chunk, gi int) {
	l := p.cols(c)
	rows, hw := c.oh1-c.oh0, p.H*p.W
	for n := c.n0; n < c.n1; n++ {
		base := (n - c.n0) * rows * p.OW
		for ci := range p.cg {
			plane := x[(n*p.C+gi*p.cg+ci)*hw : (n*p.C+gi*p.cg+ci+1)*hw]
			for i := range p.KH {
				for j := range p.KW {
					r := (ci*p.KH+i)*p.KW + j
					dst := col[r*l+base : r*l+base+rows*p.OW]
					off := j*p.DW - p.PW
					lo, hi := rowRange(p.OW, p.W, p.SW, off) // the outputs whose tap is inside
					for oh := c.oh0; oh < c.oh1; oh++ {
						seg := dst[(oh-c.oh0)*p.OW : (oh-c.oh0+1)*p.OW]
						ih := oh*p.SH - p.PH + i*p.DH
						if ih < 0 || ih >= p.H || lo == hi {
							clear(seg)
							continue
						}
						clear(seg[:lo])
						clear(seg[hi:])
						src := plane[ih*p.W : (ih+1)*p.W]
						if p.SW == 1 {
							copy(seg[lo:hi], src[lo+off:hi+off])
							continue
						}
						for q := lo; q < hi; q++ {
							seg[q] = src[q*p.SW+off]
						}
					}
				}
			}
		}
	}
}

// col2im adds the column matrix col of chunk c and group gi into dx.
func col2im[T float](p *convPlan, dx, col []T, c chunk, gi int) {
	l := p.cols(c)
	rows, hw := c.oh1-c.oh0, p.H*p.W
	for n := c.n0; n < c.n1; n++ {
		base := (n - c.n0) * rows * p.OW
		for ci := range p.cg {
			plane := dx[(n*p.C+gi*p.cg+ci)*hw : (n*p.C+gi*p.cg+ci+1)*hw]
			for i := range p.KH {
				for j := range p.KW {
					r := (ci*p.KH+i)*p.KW + j
					src := col[r*l+base : r*l+base+rows*p.OW]
					off := j*p.DW - p.PW
					lo, hi := rowRange(p.OW, p.W, p.SW, off)
					if lo == hi {
						continue
					}
					for oh := c.oh0; oh < c.oh1; oh++ {
						ih := oh*p.SH - p.PH + i*p.DH
						if ih < 0 || ih >= p.H {
							continue
						}
						seg := src[(oh-c.oh0)*p.OW+lo : (oh-c.oh0)*p.OW+hi]
						dst := plane[ih*p.W : (ih+1)*p.W]
						if p.SW == 1 {
							d := dst[lo+off : hi+off]
							d = d[:len(seg)]
							for q, v := range seg {
								d[q] += v
							}
							continue
						}
						for q, v := range seg {
							dst[(lo+q)*p.SW+off] += v
						}
					}
				}
			}
		}
	}
}

// gatherDY copies the rows of dy that chunk c and group gi cover into
// dst, an og×cols matrix.
func gatherDY[T float](p *convPlan, dst, dy []T, c chunk, gi int) {
	l := p.cols(c)
	seg := (c.oh1 - c.oh0) * p.OW
	for o := range p.og {
		for n := c.n0; n < c.n1; n++ {
			src := dy[(n*p.O+gi*p.og+o)*p.p+c.oh0*p.OW:][:seg]
			copy(dst[o*l+(n-c.n0)*seg:][:seg], src)
		}
	}
}

// conv2D computes y = conv2d(x, w) + bias (bias may be nil), then, if
// relu, relu of it: each chunk's outputs while they are in cache.
func conv2D[T float](p *convPlan, y, x, w, bias []T, relu bool) {
	serial := chunkWorkers(p.chunks(), p.flops()) > 1
	run := func(lo, hi int) {
		hc, ht := getF64(0), getF64(0)
		defer f64Pool.Put(hc)
		defer f64Pool.Put(ht)
		for t := lo; t < hi; t++ {
			c := p.chunk(t)
			l, seg := p.cols(c), (c.oh1-c.oh0)*p.OW
			for gi := range p.Groups {
				wg := w[gi*p.og*p.r : (gi+1)*p.og*p.r]
				var col []T
				if p.pointwise && p.whole(c) {
					col = x[(c.n0*p.C+gi*p.cg)*p.p : (c.n0*p.C+gi*p.cg+p.cg)*p.p]
				} else {
					col = packBuf[T](hc, p.r*l)
					im2col(p, col, x, c, gi)
				}
				if p.whole(c) {
					gemm(y[(c.n0*p.O+gi*p.og)*p.p:(c.n0*p.O+gi*p.og+p.og)*p.p], wg, col, p.og, p.r, l, serial)
					continue
				}
				tmp := packBuf[T](ht, p.og*l)
				gemm(tmp, wg, col, p.og, p.r, l, serial)
				for o := range p.og {
					for n := c.n0; n < c.n1; n++ {
						copy(y[(n*p.O+gi*p.og+o)*p.p+c.oh0*p.OW:][:seg], tmp[o*l+(n-c.n0)*seg:][:seg])
					}
				}
			}
			if bias == nil && !relu {
				continue
			}
			for n := c.n0; n < c.n1; n++ {
				for o := range p.O {
					row := y[(n*p.O+o)*p.p+c.oh0*p.OW:][:seg]
					writeOut(row, row, bias, o, relu)
				}
			}
		}
	}
	runChunks(p.chunks(), p.flops(), run)
}

// writeOut sets dst to src plus bias[o] (if bias is not nil), then to
// relu of that (if relu), with the arithmetic of the add and relu ops.
// dst may be src.
func writeOut[T float](dst, src, bias []T, o int, relu bool) {
	dst = dst[:len(src)]
	switch {
	case bias != nil && relu:
		bv := bias[o]
		for q, v := range src {
			dst[q] = max(v+bv, 0) // relu's own max
		}
	case bias != nil:
		bv := bias[o]
		for q, v := range src {
			dst[q] = v + bv
		}
	case relu:
		for q, v := range src {
			dst[q] = max(v, 0)
		}
	default:
		copy(dst, src)
	}
}

// conv2DInputGrad computes dx from dy and w. A task is one sample, or a
// chunk of whole samples, so that no two tasks add into the same dx.
func conv2DInputGrad[T float](p *convPlan, dx, dy, w []T) {
	// wt holds each group's Wᵀ: r×og.
	wt := make([]T, len(w))
	for gi := range p.Groups {
		src := w[gi*p.og*p.r : (gi+1)*p.og*p.r]
		dst := wt[gi*p.og*p.r : (gi+1)*p.og*p.r]
		for o := range p.og {
			for rr, v := range src[o*p.r : (o+1)*p.r] {
				dst[rr*p.og+o] = v
			}
		}
	}
	tasks, per := p.chunks(), 1
	if p.rows < p.OH {
		tasks, per = p.N, p.perSample
	}
	chw := p.C * p.H * p.W
	serial := chunkWorkers(tasks, p.flops()) > 1
	run := func(lo, hi int) {
		hc, ht := getF64(0), getF64(0)
		defer f64Pool.Put(hc)
		defer f64Pool.Put(ht)
		for t := lo; t < hi; t++ {
			first := p.chunk(t * per)
			clear(dx[first.n0*chw : p.chunk(t*per+per-1).n1*chw])
			for k := range per {
				c := p.chunk(t*per + k)
				l := p.cols(c)
				col := packBuf[T](hc, p.r*l)
				for gi := range p.Groups {
					var g []T
					if p.whole(c) {
						g = dy[(c.n0*p.O+gi*p.og)*p.p : (c.n0*p.O+gi*p.og+p.og)*p.p]
					} else {
						g = packBuf[T](ht, p.og*l)
						gatherDY(p, g, dy, c, gi)
					}
					gemm(col, wt[gi*p.og*p.r:(gi+1)*p.og*p.r], g, p.r, p.og, l, serial)
					col2im(p, dx, col, c, gi)
				}
			}
		}
	}
	runChunks(tasks, p.flops(), run)
}

// conv2DWeightGrad computes dw from x and dy: each of up to maxPartials
// tasks sums the products of a fixed run of chunks, and the partial sums
// are added in order.
func conv2DWeightGrad[T float](p *convPlan, dw, x, dy []T) {
	nch := p.chunks()
	if nch == 0 {
		clear(dw)
		return
	}
	parts := min(nch, maxPartials)
	size := p.Groups * p.r * p.og // per group, dWᵀ: r×og
	partial := make([]T, parts*size)
	serial := chunkWorkers(parts, p.flops()) > 1
	run := func(lo, hi int) {
		hc, ht, hp := getF64(0), getF64(0), getF64(0)
		defer f64Pool.Put(hc)
		defer f64Pool.Put(ht)
		defer f64Pool.Put(hp)
		prod := packBuf[T](hp, p.r*p.og)
		for t := lo; t < hi; t++ {
			acc := partial[t*size : (t+1)*size]
			for i := t * nch / parts; i < (t+1)*nch/parts; i++ {
				first := i == t*nch/parts
				c := p.chunk(i)
				l, seg := p.cols(c), (c.oh1-c.oh0)*p.OW
				col := packBuf[T](hc, p.r*l)
				dyt := packBuf[T](ht, l*p.og)
				for gi := range p.Groups {
					im2col(p, col, x, c, gi)
					for n := c.n0; n < c.n1; n++ {
						src := dy[(n*p.O+gi*p.og)*p.p+c.oh0*p.OW:]
						transposeBlock(dyt[(n-c.n0)*seg*p.og:], p.og, src, p.p, p.og, seg)
					}
					a := acc[gi*p.r*p.og : (gi+1)*p.r*p.og]
					if first {
						gemm(a, col, dyt, p.r, l, p.og, serial)
						continue
					}
					gemm(prod, col, dyt, p.r, l, p.og, serial)
					for q, v := range prod {
						a[q] += v
					}
				}
			}
		}
	}
	runChunks(parts, p.flops(), run)
	for t := 1; t < parts; t++ {
		for q, v := range partial[t*size : (t+1)*size] {
			partial[q] += v
		}
	}
	for gi := range p.Groups {
		src := partial[gi*p.r*p.og : (gi+1)*p.r*p.og]
		dst := dw[gi*p.og*p.r : (gi+1)*p.og*p.r]
		for rr := range p.r {
			for o, v := range src[rr*p.og : (rr+1)*p.og] {
				dst[o*p.r+rr] = v
			}
		}
	}
}

// execConv runs conv2d and its two gradients.
func execConv(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	return b.conv(op, in, out, false)
}

// ExecRelu runs op and relu of its output, as op then relu would, without
// storing op's output: the outputs take relu as they are written, while
// in cache. It takes conv2d of float32 and float64, and returns
// kernels.ErrNotImplemented, doing nothing, for any other op.
func (b *Backend) ExecRelu(op *kernels.Op, in, out []*kernels.Tensor) error {
	err := b.execRelu(op, in, out)
	if r := b.rec.Load(); r != nil && op != nil {
		c, ci, co := op.Clone(), cloneTensors(in), cloneTensors(out)
		r.note(err, op.Name+" with relu", co, func() error { return b.execRelu(&c, ci, co) })
	}
	return err
}

func (b *Backend) execRelu(op *kernels.Op, in, out []*kernels.Tensor) error {
	if op == nil || op.Name != kernels.OpConv2D || len(in) == 0 || in[0] == nil ||
		in[0].DType != kernels.Float32 && in[0].DType != kernels.Float64 {
		return fmt.Errorf("%w: cpu: relu after this op", kernels.ErrNotImplemented)
	}
	e := table[op.Name]
	if (e.nin >= 0 && len(in) != e.nin) || len(out) != 1 {
		return fmt.Errorf("%w: cpu: %s takes %d inputs and 1 output, got %d and %d", kernels.ErrArity, op.Name, e.nin, len(in), len(out))
	}
	for i, t := range in {
		if err := checkTensor(op, "input", i, t); err != nil {
			return err
		}
	}
	if err := checkTensor(op, "output", 0, out[0]); err != nil {
		return err
	}
	if aliased(in, out) {
		return fmt.Errorf("%w: cpu: relu after %s into one of its inputs", kernels.ErrNotImplemented, op.Name)
	}
	return b.conv(op, in, out, true)
}

// conv runs a convolution op, and relu of conv2d's output if relu.
func (b *Backend) conv(op *kernels.Op, in, out []*kernels.Tensor, relu bool) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	var g kernels.Window
	var err error
	switch op.Name {
	case kernels.OpConv2D:
		g, err = kernels.ConvWindow(op, in[0].Shape, in[1].Shape)
	case kernels.OpConv2DInputGrad:
		g, err = kernels.ConvWindow(op, op.Shape, in[1].Shape)
	default:
		g, err = kernels.ConvWindow(op, in[0].Shape, op.Shape)
	}
	if err != nil {
		return err
	}
	if out[0].Numel() == 0 {
		return nil
	}
	switch in[0].DType {
	case kernels.Float32:
		runConv[float32](newConvPlan(g), op.Name, in, out, relu)
	case kernels.Float64:
		runConv[float64](newConvPlan(g), op.Name, in, out, relu)
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, in[0].DType)
	}
	return nil
}

// runConv runs a convolution op, and, for conv2d, relu of its output if
// relu.
func runConv[T float](p *convPlan, name string, in, out []*kernels.Tensor, relu bool) {
	v := func(t *kernels.Tensor) []T { return view[T](data(t), t.Numel()) }
	if sizeOf[T]() == 4 && runConvDirect(p, name, in, out, relu) {
		return
	}
	switch name {
	case kernels.OpConv2D:
		var bias []T
		if len(in) == 3 {
			bias = v(in[2])
		}
		conv2D(p, v(out[0]), v(in[0]), v(in[1]), bias, relu)
	case kernels.OpConv2DInputGrad:
		conv2DInputGrad(p, v(out[0]), v(in[0]), v(in[1]))
	default:
		conv2DWeightGrad(p, v(out[0]), v(in[0]), v(in[1]))
	}
}
