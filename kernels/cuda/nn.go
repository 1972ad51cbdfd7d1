//go:build cgo && linux

package cuda

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// isNN reports whether exec runs op with the kernels of this file.
func isNN(name string) bool {
	switch name {
	case kernels.OpConv2D, kernels.OpConv2DInputGrad, kernels.OpConv2DWeightGrad,
		kernels.OpMaxPool2D, kernels.OpMaxPool2DGrad, kernels.OpAvgPool2D, kernels.OpAvgPool2DGrad,
		kernels.OpCrossEntropy, kernels.OpCrossEntropyGrad:
		return true
	}
	return false
}

// maxIm2col bounds the bytes of the im2col matrix of one chunk of images;
// a batch whose matrix is larger is convolved chunk by chunk. Tests lower
// it.
var maxIm2col = 256 << 20

// nn queues a convolution, pooling or cross-entropy op. An output that
// shares memory with an input is written through scratch memory.
func (b *Backend) nn(op *kernels.Op, inM []kernels.Meta, y kernels.Meta, inB []*buffer, out *buffer) error {
	dst, n := out, y.Bytes()
	for i, in := range inB {
		if m := inM[i].Bytes(); n > 0 && m > 0 && in.ptr < out.ptr+uint64(n) && out.ptr < in.ptr+uint64(m) {
			tmp, err := b.alloc(n)
			if err != nil {
				return err
			}
			defer b.free(tmp)
			dst = tmp
			break
		}
	}
	var err error
	switch op.Name {
	case kernels.OpConv2D:
		err = b.conv2d(op, inM, y, inB, dst)
	case kernels.OpConv2DInputGrad:
		err = b.conv2dInputGrad(op, inM, y, inB, dst)
	case kernels.OpConv2DWeightGrad:
		err = b.conv2dWeightGrad(op, inM, y, inB, dst)
	case kernels.OpMaxPool2D, kernels.OpAvgPool2D:
		err = b.pool(op, inM, y, inB, dst)
	case kernels.OpMaxPool2DGrad, kernels.OpAvgPool2DGrad:
		err = b.poolGrad(op, inM, y, inB, dst)
	case kernels.OpCrossEntropy, kernels.OpCrossEntropyGrad:
		err = b.crossEntropy(op, inM, y, inB, dst)
	default:
		err = fmt.Errorf("%w: %s", kernels.ErrNotImplemented, op.Name)
	}
	if err != nil || dst == out {
		return err
	}
	b.queueCopy(out.ptr, dst.ptr, n)
	return nil
}

// convBLAS returns cuBLAS's handle and types for a convolution of dt:
// float32 and float64 only, others (and a missing cuBLAS) decline with
// kernels.ErrNotImplemented.
func (b *Backend) convBLAS(name string, dt kernels.DType) (h blasHandle, data, compute int, err error) {
	if dt != kernels.Float32 && dt != kernels.Float64 {
		return nil, 0, 0, fmt.Errorf("%w: %s in %v", kernels.ErrNotImplemented, name, dt)
	}
	data, compute, _ = b.blasTypes(dt)
	if h, err = b.blasHandle(); err != nil {
		return nil, 0, 0, fmt.Errorf("%w: %s: %w", kernels.ErrNotImplemented, name, err)
	}
	return h, data, compute, nil
}

// convChunk is the number of images whose im2col matrix is built at once.
func convChunk(g *kernels.Window, es int) int {
	per := g.C * g.KH * g.KW * g.OH * g.OW * es
	if per == 0 {
		return max(g.N, 1)
	}
	return max(1, min(g.N, maxIm2col/per))
}

// rowGrid is the grid of a kernel that gives each block a row at a time.
func rowGrid(rows int) [3]uint32 { return [3]uint32{uint32(max(1, min(rows, 1<<20))), 1, 1} }

// im2col queues the im2col matrix of nc images starting at x.
func (b *Backend) im2col(g *kernels.Window, es int, col, x uint64, nc int) error {
	total := g.C * g.KH * g.KW * nc * g.OH * g.OW
	if total == 0 {
		return nil
	}
	s := im2colSpec{size: es, idx64: total > idx32Max || nc*g.C*g.H*g.W > idx32Max, g: newGeom(g, nc)}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(col)
	a.ptr(x)
	a.idx(total, s.idx64)
	b.queueLaunch(f, b.launchGrid(total), blockSize, &a)
	return nil
}

// conv2d queues y = conv2d(x, w) (+ bias): per chunk of images, the
// im2col matrix, then per group one strided batched GEMM over the chunk's
// images, y[n, g] = w[g] * col[g, n].
func (b *Backend) conv2d(op *kernels.Op, inM []kernels.Meta, y kernels.Meta, inB []*buffer, out *buffer) error {
	g, err := kernels.ConvWindow(op, inM[0].Shape, inM[1].Shape)
	if err != nil {
		return err
	}
	dt := y.DType
	h, data, compute, err := b.convBLAS(op.Name, dt)
	if err != nil || y.Numel() == 0 {
		return err
	}
	es := dt.Size()
	P, K, Og := g.OH*g.OW, g.C/g.Groups*g.KH*g.KW, g.O/g.Groups
	if K == 0 {
		b.queueMemset(out.ptr, 0, y.Bytes())
	} else {
		nc := convChunk(&g, es)
		col, err := b.alloc(g.C * g.KH * g.KW * nc * P * es)
		if err != nil {
			return err
		}
		defer b.free(col)
		for n0 := 0; n0 < g.N; n0 += nc {
			m := min(nc, g.N-n0)
			if err := b.im2col(&g, es, col.ptr, inB[0].ptr+uint64(n0*g.C*g.H*g.W*es), m); err != nil {
				return err
			}
			for gi := range g.Groups {
				ga := gemmArgs{
					m: P, n: Og, k: K,
					a: col.ptr + uint64(gi*K*m*P*es), lda: m * P, sa: P,
					b: inB[1].ptr + uint64(gi*Og*K*es), ldb: K, sb: 0,
					c: out.ptr + uint64((n0*g.O*P+gi*Og*P)*es), ldc: P, sc: g.O * P,
					count: m, dtype: data, compute: compute,
				}
				b.queueGemm(h, ga)
			}
		}
	}
	if len(inB) < 3 {
		return nil
	}
	s := biasSpec{dt: dt, idx64: y.Numel() > idx32Max}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(out.ptr)
	a.ptr(inB[2].ptr)
	a.idx(g.N*g.O, s.idx64)
	a.idx(P, s.idx64)
	a.idx(g.O, s.idx64)
	b.queueLaunch(f, rowGrid(g.N*g.O), blockSize, &a)
	return nil
}

// conv2dInputGrad queues dx = conv2d_input_grad(dy, w): per chunk of
// images and per group the gradient of the im2col matrix,
// dcol[g, n] = w[g]ᵀ * dy[n, g] (a strided batched GEMM), then the col2im
// gather into dx.
func (b *Backend) conv2dInputGrad(op *kernels.Op, inM []kernels.Meta, dx kernels.Meta, inB []*buffer, out *buffer) error {
	g, err := kernels.ConvWindow(op, dx.Shape, inM[1].Shape)
	if err != nil {
		return err
	}
	dt := dx.DType
	h, data, compute, err := b.convBLAS(op.Name, dt)
	if err != nil || dx.Numel() == 0 {
		return err
	}
	es := dt.Size()
	P, K, Og := g.OH*g.OW, g.C/g.Groups*g.KH*g.KW, g.O/g.Groups
	if Og == 0 {
		b.queueMemset(out.ptr, 0, dx.Bytes())
		return nil
	}
	nc := convChunk(&g, es)
	dcol, err := b.alloc(g.C * g.KH * g.KW * nc * P * es)
	if err != nil {
		return err
	}
	defer b.free(dcol)
	idx64 := nc*g.C*g.H*g.W > idx32Max || g.C*g.KH*g.KW*nc*P > idx32Max
	for n0 := 0; n0 < g.N; n0 += nc {
		m := min(nc, g.N-n0)
		for gi := range g.Groups {
			ga := gemmArgs{
				tb: true,
				m:  P, n: K, k: Og,
				a: inB[0].ptr + uint64((n0*g.O*P+gi*Og*P)*es), lda: P, sa: g.O * P,
				b: inB[1].ptr + uint64(gi*Og*K*es), ldb: K, sb: 0,
				c: dcol.ptr + uint64(gi*K*m*P*es), ldc: m * P, sc: P,
				count: m, dtype: data, compute: compute,
			}
			b.queueGemm(h, ga)
		}
		s := col2imSpec{dt: dt, idx64: idx64, g: newGeom(&g, m)}
		f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
		if err != nil {
			return err
		}
		total := m * g.C * g.H * g.W
		var a kargs
		a.ptr(out.ptr + uint64(n0*g.C*g.H*g.W*es))
		a.ptr(dcol.ptr)
		a.idx(total, s.idx64)
		b.queueLaunch(f, b.launchGrid(total), blockSize, &a)
	}
	return nil
}

// conv2dWeightGrad queues dw = conv2d_weight_grad(x, dy): per chunk of
// images the im2col matrix and dy moved to [O][images][OH*OW], then per
// group one GEMM over the chunk's images and positions,
// dw[g] (+)= dy[g] * col[g]ᵀ, the chunks accumulated in order.
func (b *Backend) conv2dWeightGrad(op *kernels.Op, inM []kernels.Meta, dw kernels.Meta, inB []*buffer, out *buffer) error {
	g, err := kernels.ConvWindow(op, inM[0].Shape, dw.Shape)
	if err != nil {
		return err
	}
	dt := dw.DType
	h, data, compute, err := b.convBLAS(op.Name, dt)
	if err != nil || dw.Numel() == 0 {
		return err
	}
	es := dt.Size()
	P, K, Og := g.OH*g.OW, g.C/g.Groups*g.KH*g.KW, g.O/g.Groups
	if g.N*P == 0 {
		b.queueMemset(out.ptr, 0, dw.Bytes())
		return nil
	}
	nc := convChunk(&g, es)
	col, err := b.alloc(g.C * g.KH * g.KW * nc * P * es)
	if err != nil {
		return err
	}
	defer b.free(col)
	dyp, err := b.alloc(g.O * nc * P * es)
	if err != nil {
		return err
	}
	defer b.free(dyp)
	rs := rowsSpec{size: es}
	rf, err := b.function(rs.key(), func() (string, error) { return rs.source(), nil })
	if err != nil {
		return err
	}
	for n0 := 0; n0 < g.N; n0 += nc {
		m := min(nc, g.N-n0)
		if err := b.im2col(&g, es, col.ptr, inB[0].ptr+uint64(n0*g.C*g.H*g.W*es), m); err != nil {
			return err
		}
		var a kargs
		a.ptr(dyp.ptr)
		a.ptr(inB[1].ptr + uint64(n0*g.O*P*es))
		a.i64(m * g.O)
		a.i64(g.O)
		a.i64(m)
		a.i64(P)
		b.queueLaunch(rf, rowGrid(m*g.O), blockSize, &a)
		for gi := range g.Groups {
			ga := gemmArgs{
				ta: true, acc: n0 > 0,
				m: K, n: Og, k: m * P,
				a: col.ptr + uint64(gi*K*m*P*es), lda: m * P,
				b: dyp.ptr + uint64(gi*Og*m*P*es), ldb: m * P,
				c: out.ptr + uint64(gi*Og*K*es), ldc: K,
				count: 1, dtype: data, compute: compute,
			}
			b.queueGemm(h, ga)
		}
	}
	return nil
}

// pool queues max_pool2d or avg_pool2d.
func (b *Backend) pool(op *kernels.Op, inM []kernels.Meta, y kernels.Meta, inB []*buffer, out *buffer) error {
	g, err := kernels.PoolWindow(op, inM[0].Shape)
	if err != nil {
		return err
	}
	total := y.Numel()
	if total == 0 {
		return nil
	}
	s := poolSpec{dt: y.DType, max: op.Name == kernels.OpMaxPool2D, idx64: total > idx32Max || inM[0].Numel() > idx32Max, g: newGeom(&g, 0)}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(out.ptr)
	a.ptr(inB[0].ptr)
	a.idx(total, s.idx64)
	b.queueLaunch(f, b.launchGrid(total), blockSize, &a)
	return nil
}

// poolGrad queues max_pool2d_grad(dy, x) or avg_pool2d_grad(dy). A max
// pool whose windows do not overlap takes one thread per window instead
// of one per input element.
func (b *Backend) poolGrad(op *kernels.Op, inM []kernels.Meta, dx kernels.Meta, inB []*buffer, out *buffer) error {
	g, err := kernels.PoolWindow(op, dx.Shape)
	if err != nil {
		return err
	}
	total := dx.Numel()
	if total == 0 {
		return nil
	}
	isMax := op.Name == kernels.OpMaxPool2DGrad
	idx64 := total > idx32Max || inM[0].Numel() > idx32Max
	var key string
	var gen func() string
	var x uint64
	n := total
	switch {
	case isMax && g.SH > (g.KH-1)*g.DH && g.SW > (g.KW-1)*g.DW:
		tiled := g.DH == 1 && g.DW == 1 && g.SH == g.KH && g.SW == g.KW && g.PH == 0 && g.PW == 0 && g.OH*g.SH == g.H && g.OW*g.SW == g.W
		if !tiled {
			b.queueMemset(out.ptr, 0, dx.Bytes())
		}
		s := poolScatterSpec{dt: dx.DType, idx64: idx64, g: newGeom(&g, 0)}
		key, gen, x, n = s.key(), s.source, inB[1].ptr, inM[0].Numel()
	case isMax:
		s := poolGradSpec{dt: dx.DType, max: true, idx64: idx64, g: newGeom(&g, 0)}
		key, gen, x = s.key(), s.source, inB[1].ptr
	default:
		s := poolGradSpec{dt: dx.DType, idx64: idx64, g: newGeom(&g, 0)}
		key, gen = s.key(), s.source
	}
	if n == 0 {
		return nil
	}
	f, err := b.function(key, func() (string, error) { return gen(), nil })
	if err != nil {
		return err
	}
	var a kargs
	a.ptr(out.ptr)
	a.ptr(inB[0].ptr)
	a.ptr(x)
	a.idx(n, idx64)
	b.queueLaunch(f, b.launchGrid(n), blockSize, &a)
	return nil
}

// crossEntropy queues cross_entropy or cross_entropy_grad and waits for
// it: a target out of range sets a flag on the device, read back after
// the launch, and the op fails with kernels.ErrIndex.
func (b *Backend) crossEntropy(op *kernels.Op, inM []kernels.Meta, y kernels.Meta, inB []*buffer, out *buffer) error {
	red, err := kernels.CrossEntropyReduce(op)
	if err != nil {
		return err
	}
	n, c := inM[0].Shape[0], inM[0].Shape[1]
	grad := op.Name == kernels.OpCrossEntropyGrad
	s := ceSpec{dt: inM[0].DType, tgt64: inM[1].DType == kernels.Int64, grad: grad}
	switch red {
	case kernels.ReduceSum:
		s.reduce = ceSum
	case kernels.ReduceMean:
		s.reduce = ceMean
	}
	f, err := b.function(s.key(), func() (string, error) { return s.source(), nil })
	if err != nil {
		return err
	}
	var fin cuFunction
	var part *buffer
	if !grad && s.reduce != ceNone {
		fs := ceFinalSpec{dt: s.dt, mean: s.reduce == ceMean}
		if fin, err = b.function(fs.key(), func() (string, error) { return fs.source(), nil }); err != nil {
			return err
		}
		if part, err = b.alloc(8 * n); err != nil {
			return err
		}
		defer b.free(part)
	}
	if n > 0 {
		flag, err := b.alloc(4)
		if err != nil {
			return err
		}
		defer b.free(flag)
		b.queueMemset(flag.ptr, 0, 4)
		var a kargs
		a.ptr(out.ptr)
		if part != nil {
			a.ptr(part.ptr)
		} else {
			a.ptr(0)
		}
		a.ptr(inB[0].ptr)
		a.ptr(inB[1].ptr)
		if grad {
			a.ptr(inB[2].ptr)
		} else {
			a.ptr(0)
		}
		a.ptr(flag.ptr)
		a.i64(n)
		a.i64(c)
		grid := [3]uint32{uint32(min(ceilDiv(n, ceWarpsPerBlock), 32*max(b.sms, 1))), 1, 1}
		b.queueLaunch(f, grid, blockSize, &a)
		bad, err := b.readFlag(flag, op.Name)
		if err != nil {
			return err
		}
		if bad != 0 {
			return fmt.Errorf("%w: cuda: %s target out of range for %d classes", kernels.ErrIndex, op.Name, c)
		}
	}
	if fin == nil {
		return nil
	}
	var a kargs
	a.ptr(out.ptr)
	a.ptr(part.ptr)
	a.i64(n)
	b.queueLaunch(fin, [3]uint32{1, 1, 1}, blockSize, &a)
	return nil
}
