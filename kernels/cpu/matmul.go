package cpu

import (
	"fmt"
	"sync"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execMatmul, 2, kernels.OpMatmul)
}

// mm is a batched matrix product: per batch index, C[m×n] = A[m×k]·B[k×n],
// all row-major, with A and B offsets given by the broadcast of the batch
// dims.
type mm struct {
	m, k, n int
	batch   bcast // over batch dims; strides in matrices
	// serial keeps the product on the calling goroutine: its caller
	// already runs one product a core.
	serial bool
	// ta and tb say that A, B are given as their transposes (A as k×m, B
	// as n×k, row-major), of a product without batch dims; tc that C is
	// written as its transpose (n×m), which only gemmShared does (see
	// swapRoles).
	ta, tb, tc bool
}

// offsets returns the offsets, in elements, of batch t's A, B and C.
func (p *mm) offsets(t int) (oa, ob, oc int) {
	rem := t
	for j := p.batch.rank - 1; j >= 0; j-- {
		i := rem % p.batch.shape[j]
		rem /= p.batch.shape[j]
		oa += i * p.batch.st[0][j]
		ob += i * p.batch.st[1][j]
	}
	return oa * p.m * p.k, ob * p.k * p.n, t * p.m * p.n
}

func execMatmul(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, z, y := in[0], in[1], out[0]
	p, err := matmulOf(op, x, z, y, x.Shape, z.Shape)
	if err != nil || y.Numel() == 0 {
		return err
	}
	return runMatmul(b, op, &p, in, out)
}

// matmulOf checks the dtypes of x, z and y and the shapes as, bs of the
// operands (x's and z's, or their transposes') against y's, and returns the
// product.
func matmulOf(op *kernels.Op, x, z, y *kernels.Tensor, as, bs []int) (mm, error) {
	var p mm
	if z.DType != x.DType {
		return p, dtypeErr(op, "input", 1, z.DType)
	}
	if y.DType != x.DType {
		return p, dtypeErr(op, "output", 0, y.DType)
	}
	ys := y.Shape
	if len(as) == 0 || len(bs) == 0 {
		return p, shapeErr(op, "matmul of a scalar")
	}
	var ab, bb []int // batch dims
	if len(as) == 1 {
		p.m, p.k = 1, as[0]
	} else {
		p.m, p.k, ab = as[len(as)-2], as[len(as)-1], as[:len(as)-2]
	}
	k2 := bs[0]
	if len(bs) == 1 {
		p.n = 1
	} else {
		k2, p.n, bb = bs[len(bs)-2], bs[len(bs)-1], bs[:len(bs)-2]
	}
	if k2 != p.k {
		return p, shapeErr(op, "inner dimensions of %v and %v differ", as, bs)
	}
	// The output is the batch dims, then m unless A is a vector, then n
	// unless B is a vector.
	nb := len(ys)
	if len(as) > 1 {
		nb--
	}
	if len(bs) > 1 {
		nb--
	}
	if nb < 0 || nb != max(len(ab), len(bb)) ||
		len(as) > 1 && ys[nb] != p.m || len(bs) > 1 && ys[len(ys)-1] != p.n {
		return p, shapeErr(op, "%v times %v does not give %v", as, bs, ys)
	}
	yb := ys[:nb]
	for j := range yb {
		da, db := 1, 1
		if i := j - (nb - len(ab)); i >= 0 {
			da = ab[i]
		}
		if i := j - (nb - len(bb)); i >= 0 {
			db = bb[i]
		}
		want := da
		if da == 1 {
			want = db
		}
		if da != db && da != 1 && db != 1 || yb[j] != want {
			return p, shapeErr(op, "batch dims of %v and %v do not broadcast to %v", as, bs, ys)
		}
	}
	var ok bool
	if p.batch, ok = newBcast(yb, ab, bb); !ok {
		return p, shapeErr(op, "batch dims of %v and %v do not broadcast to %v", as, bs, ys)
	}
	return p, nil
}

// runMatmul computes the product p of in into out.
func runMatmul(b *Backend, op *kernels.Op, p *mm, in, out []*kernels.Tensor) error {
	x, z, y := in[0], in[1], out[0]
	xd, zd, yd := data(x), data(z), data(y)
	nx, nz, ny := x.Numel(), z.Numel(), y.Numel()
	switch x.DType {
	case kernels.Float32:
		matmulF32(p, view[float32](yd, ny), view[float32](xd, nx), view[float32](zd, nz))
	case kernels.Float64:
		matmulF64(p, view[float64](yd, ny), view[float64](xd, nx), view[float64](zd, nz))
	case kernels.Int32:
		matmulSimple(p, view[int32](yd, ny), view[int32](xd, nx), view[int32](zd, nz))
	case kernels.Int64:
		matmulSimple(p, view[int64](yd, ny), view[int64](xd, nx), view[int64](zd, nz))
	case kernels.Uint8:
		matmulSimple(p, view[uint8](yd, ny), view[uint8](xd, nx), view[uint8](zd, nz))
	case kernels.Float16, kernels.BFloat16:
		if p.ta || p.tb {
			return fmt.Errorf("%w: cpu: matmul of transposed %v operands", kernels.ErrNotImplemented, x.DType)
		}
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

// ExecMatmulT runs matmul, as Exec does, of operands of which those that
// trans marks are given as their transposes: in[i], of shape [c, r], stands
// for the [r, c] operand that a permute [1, 0] of it would make. The
// product reads them where they are, and its bits are those of the
// permutes and the matmul one by one. Transposed operands must be 2-D and
// float32 or float64 (the other operand 2-D too); for others, and for an
// output that overlaps an input, it returns kernels.ErrNotImplemented,
// doing nothing. It checks and fails as Exec does.
func (b *Backend) ExecMatmulT(op *kernels.Op, trans [2]bool, in, out []*kernels.Tensor) error {
	err := b.execMatmulT(op, trans, in, out)
	if r := b.rec.Load(); r != nil && op != nil {
		c, ci, co := op.Clone(), cloneTensors(in), cloneTensors(out)
		r.note(err, "matmul of transposed operands", co, func() error { return b.execMatmulT(&c, trans, ci, co) })
	}
	return err
}

func (b *Backend) execMatmulT(op *kernels.Op, trans [2]bool, in, out []*kernels.Tensor) (err error) {
	if op == nil || op.Name != kernels.OpMatmul {
		return fmt.Errorf("%w: cpu: transposed operands of an op other than matmul", kernels.ErrNotImplemented)
	}
	if len(in) != 2 || len(out) != 1 {
		return fmt.Errorf("%w: cpu: matmul takes 2 inputs and 1 output, got %d and %d", kernels.ErrArity, len(in), len(out))
	}
	for i, t := range in {
		if err := checkTensor(op, "input", i, t); err != nil {
			return err
		}
	}
	if err := checkTensor(op, "output", 0, out[0]); err != nil {
		return err
	}
	x, z, y := in[0], in[1], out[0]
	if x.DType != kernels.Float32 && x.DType != kernels.Float64 || len(x.Shape) != 2 || len(z.Shape) != 2 {
		return fmt.Errorf("%w: cpu: matmul of transposed operands %v%v and %v%v (2-D float32 or float64 only)",
			kernels.ErrNotImplemented, x.DType, x.Shape, z.DType, z.Shape)
	}
	if aliased(in, out) {
		return fmt.Errorf("%w: cpu: matmul of transposed operands into one of them", kernels.ErrNotImplemented)
	}
	as, bs := x.Shape, z.Shape
	if trans[0] {
		as = []int{as[1], as[0]}
	}
	if trans[1] {
		bs = []int{bs[1], bs[0]}
	}
	p, err := matmulOf(op, x, z, y, as, bs)
	if err != nil || y.Numel() == 0 {
		return err
	}
	// The transpose of a vector is the vector.
	p.ta, p.tb = trans[0] && p.m > 1, trans[1] && p.n > 1
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cpu: %s: internal error: %v", op.Name, r)
		}
	}()
	return runMatmul(b, op, &p, in, out)
}

// plain returns the product p, which has transposed operands, and its
// operands a and b with those copied into their plain layout, in pooled
// scratch that h gives back.
func plain[T number](p *mm, a, b []T) (q mm, pa, pb []T, h scratchHandles) {
	flip := func(x []T, rows, cols int) []T {
		buf, hd := getBytes(rows * cols * sizeOf[T]())
		h = append(h, hd)
		permuteBytes(buf, asBytes(x[:rows*cols]), sizeOf[T](), []int{rows, cols}, []int{1, 0})
		return view[T](buf, rows*cols)
	}
	q = *p
	if q.ta {
		a = flip(a, q.k, q.m)
	}
	if q.tb {
		b = flip(b, q.n, q.k)
	}
	q.ta, q.tb = false, false
	return q, a, b, h
}

// scratchHandles are pooled scratch buffers to give back.
type scratchHandles []*[]uint64

// release gives the buffers back to the pool.
func (h scratchHandles) release() {
	for _, x := range h {
		wordPool.Put(x)
	}
}

// Blocking of the pure-Go packed float kernel (where the assembly path of
// gemm_amd64.go is not taken): the micro-kernel computes an mr×nr block of
// C over a kc-long slice of k from packed panels of A (mr rows,
// interleaved) and B (nr columns, interleaved); a task computes an mc×nc
// tile of C for all of k.
const (
	mr = 2
	nr = 4
	kc = 256
	mc = 64
	nc = 256
)

// smallMatmul is the m·n·k below which a product skips packing.
const smallMatmul = 1 << 15

func matmulFloat[T float](p *mm, c, a, b []T, micro func(a, b, c []T, ldc int)) {
	if p.ta || p.tb {
		q, a, b, h := plain(p, a, b)
		defer h.release()
		matmulFloat(&q, c, a, b, micro)
		return
	}
	if p.k == 0 {
		clear(c)
		return
	}
	if p.n < nr || p.m < mr || p.m*p.n*p.k <= smallMatmul {
		matmulSimple(p, c, a, b)
		return
	}
	gemmTiled(*p, c, a, b, micro)
}

// gemmTiled is the packed product, in tiles of mc×nc spread over the cores.
// It takes p by value so that the caller's copy stays on its stack.
func gemmTiled[T float](pv mm, c, a, b []T, micro func(a, b, c []T, ldc int)) {
	p := &pv
	tm, tn := (p.m+mc-1)/mc, (p.n+nc-1)/nc
	tasks := p.batch.n * tm * tn
	run := func(lo, hi int) {
		ap, bp := getF64(0), getF64(0) // handles; resized below
		defer f64Pool.Put(ap)
		defer f64Pool.Put(bp)
		pa := packBuf[T](ap, mc*(kc+1))
		pb := packBuf[T](bp, nc*(kc+1)+mr*nr)
		edge := pb[nc*(kc+1):]
		for t := lo; t < hi; t++ {
			bi, rest := t/(tm*tn), t%(tm*tn)
			ti, tj := rest/tn, rest%tn
			oa, ob, oc := p.offsets(bi)
			gemmTile(p, c[oc:], a[oa:], b[ob:], ti*mc, tj*nc, pa, pb, edge, micro)
		}
	}
	w := 1
	if p.m*p.n*p.k >= 1<<18 && !p.serial {
		w = min(threads(), tasks)
	}
	if w > 1 {
		parallelDynamic(tasks, w, run)
		return
	}
	run(0, tasks)
}

// gemmPool holds the buffers of packed B, apart from f64Pool's smaller
// scratch, so that a product gets back a buffer of about the size it needs.
var gemmPool = sync.Pool{New: func() any { return new([]float64) }}

// packBuf views a pooled float64 scratch as at least n elements of T.
func packBuf[T float](h *[]float64, n int) []T {
	words := (n*sizeOf[T]() + 7) / 8
	if cap(*h) < words {
		*h = make([]float64, words)
	}
	*h = (*h)[:words]
	return view[T](asBytes(*h), n)
}

// parallelDynamic runs tasks [0, n) on w goroutines that take them one at
// a time, so uneven tasks balance.
func parallelDynamic(n, w int, run func(lo, hi int)) {
	var mu sync.Mutex
	next := 0
	spread(w, func(_ int) {
		for {
			mu.Lock()
			t := next
			next++
			mu.Unlock()
			if t >= n {
				return
			}
			run(t, t+1)
		}
	})
}

// spread runs f(0), …, f(w-1) on w new goroutines and waits for them; a
// panic in any is raised again on the calling goroutine. Unlike parallel,
// the caller runs no share itself: a goroutine started by one that keeps
// running waits in its processor's next slot, which an idle processor
// takes only after a delay, often for most of a product of a few hundred
// microseconds; of goroutines started together, all but the last wait in
// the run queue, which idle processors take from at once, and the caller's
// processor runs the last as soon as the caller waits.
func spread(w int, f func(i int)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var perr any
	for i := range w {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					mu.Lock()
					perr = r
					mu.Unlock()
				}
			}()
			f(i)
		})
	}
	wg.Wait()
	if perr != nil {
		panic(fmt.Sprint(perr))
	}
}

// gemmTile computes the tile of C at rows i0.., columns j0.. of one batch.
func gemmTile[T float](p *mm, c, a, b []T, i0, j0 int, pa, pb, edge []T, micro func(a, b, c []T, ldc int)) {
	m, n, k := p.m, p.n, p.k
	rows, cols := min(mc, m-i0), min(nc, n-j0)
	for i := range rows {
		clear(c[(i0+i)*n+j0 : (i0+i)*n+j0+cols])
	}
	ip, jp := (rows+mr-1)/mr, (cols+nr-1)/nr
	for pc := 0; pc < k; pc += kc {
		kk := min(kc, k-pc)
		kp := kk + kk&1 // packed length, even
		packA(pa[:ip*mr*kp], a, k, i0, rows, pc, kk, kp)
		packB(pb[:jp*nr*kp], b, n, j0, cols, pc, kk, kp)
		for jb := range jp {
			bpan := pb[jb*nr*kp : (jb+1)*nr*kp]
			cj := j0 + jb*nr
			for ib := range ip {
				apan := pa[ib*mr*kp : (ib+1)*mr*kp]
				ci := i0 + ib*mr
				if ci+mr <= i0+rows && cj+nr <= j0+cols {
					micro(apan, bpan, c[ci*n+cj:], n)
					continue
				}
				clear(edge)
				micro(apan, bpan, edge, nr)
				for r := 0; r < mr && ci+r < i0+rows; r++ {
					for q := 0; q < nr && cj+q < j0+cols; q++ {
						c[(ci+r)*n+cj+q] += edge[r*nr+q]
					}
				}
			}
		}
	}
}

// packA packs rows [i0, i0+rows) and columns [pc, pc+kk) of A (row
// length k) into panels of mr rows: element (r, q) of panel ib at
// (ib*kp+q)*mr + r. Padding is zero.
func packA[T float](dst, a []T, k, i0, rows, pc, kk, kp int) {
	for ib := 0; ib*mr < rows; ib++ {
		pan := dst[ib*mr*kp : (ib+1)*mr*kp]
		for r := range mr {
			i := ib*mr + r
			if i >= rows {
				for q := range kp {
					pan[q*mr+r] = 0
				}
				continue
			}
			src := a[(i0+i)*k+pc : (i0+i)*k+pc+kk]
			for q, v := range src {
				pan[q*mr+r] = v
			}
			for q := kk; q < kp; q++ {
				pan[q*mr+r] = 0
			}
		}
	}
}

// packB packs rows [pc, pc+kk) and columns [j0, j0+cols) of B (row length
// n) into panels of nr columns: element (q, s) of panel jb at
// (jb*kp+q)*nr + s. Padding is zero.
func packB[T float](dst, b []T, n, j0, cols, pc, kk, kp int) {
	jp := (cols + nr - 1) / nr
	full := cols / nr
	for q := range kk {
		row := b[(pc+q)*n+j0 : (pc+q)*n+j0+cols]
		for jb := range full {
			s := row[jb*nr : jb*nr+nr : jb*nr+nr]
			d := dst[(jb*kp+q)*nr : (jb*kp+q)*nr+nr : (jb*kp+q)*nr+nr]
			d[0], d[1], d[2], d[3] = s[0], s[1], s[2], s[3]
		}
		if full < jp {
			d := dst[(full*kp+q)*nr : (full*kp+q)*nr+nr]
			for s := range nr {
				if j := full*nr + s; j < cols {
					d[s] = row[j]
				} else {
					d[s] = 0
				}
			}
		}
	}
	for q := kk; q < kp; q++ {
		for jb := range jp {
			clear(dst[(jb*kp+q)*nr : (jb*kp+q)*nr+nr])
		}
	}
}

// micro2x4 is micro2x4g for float32.
func micro2x4(a, b, c []float32, ldc int) { micro2x4g(a, b, c, ldc) }

// micro2x4f64 is micro2x4 for float64. (Plain functions: a generic
// instantiation used as a value would be a closure.)
func micro2x4f64(a, b, c []float64, ldc int) { micro2x4g(a, b, c, ldc) }

// micro2x4g adds to the 2×4 block of C at c (row length ldc) the product of
// a packed A panel and a packed B panel of even length. The loop walks the
// panels by reslicing, two k steps at a time, so that the compiler drops
// the bounds checks and keeps all eight sums in registers.
func micro2x4g[T float](a, b, c []T, ldc int) {
	var c00, c01, c02, c03, c10, c11, c12, c13 T
	for len(a) >= 4 && len(b) >= 8 {
		a0, a1 := a[0], a[1]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		a0, a1 = a[2], a[3]
		b0, b1, b2, b3 = b[4], b[5], b[6], b[7]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		a = a[4:]
		b = b[8:]
	}
	r := c[0:4:4]
	r[0] += c00
	r[1] += c01
	r[2] += c02
	r[3] += c03
	r = c[ldc : ldc+4 : ldc+4]
	r[0] += c10
	r[1] += c11
	r[2] += c12
	r[3] += c13
}

// matmulSimple is the unpacked product, for small or thin matrices and for
// integers (which wrap): each row of C accumulates rows of B scaled by A's
// elements, k in order; a column vector B takes dot products.
func matmulSimple[T number](p *mm, c, a, b []T) {
	if p.ta || p.tb {
		q, a, b, h := plain(p, a, b)
		defer h.release()
		matmulSimple(&q, c, a, b)
		return
	}
	rows := p.batch.n * p.m
	if w := split(rows, p.k*p.n); w > 1 && !p.serial {
		pp := *p
		spread(w, func(i int) { matmulRows(&pp, c, a, b, bound(rows, w, i), bound(rows, w, i+1)) })
		return
	}
	matmulRows(p, c, a, b, 0, rows)
}

// matmulRows computes rows [lo, hi) of C counted over all batches.
func matmulRows[T number](p *mm, c, a, b []T, lo, hi int) {
	m, k, n := p.m, p.k, p.n
	for r := lo; r < hi; r++ {
		bi, i := r/m, r%m
		oa, ob, oc := p.offsets(bi)
		arow := a[oa+i*k : oa+i*k+k]
		crow := c[oc+i*n : oc+i*n+n]
		bm := b[ob : ob+k*n]
		if n == 1 {
			crow[0] = dot(arow, bm)
			continue
		}
		clear(crow)
		for q, av := range arow {
			brow := bm[q*n : q*n+n]
			brow = brow[:len(crow)]
			for j, bv := range brow {
				crow[j] += av * bv
			}
		}
	}
}

func dot[T number](a, b []T) T {
	b = b[:len(a)]
	var s0, s1, s2, s3 T
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
