//go:build amd64 && !purego

package cpu

import (
	"runtime"
	"sync/atomic"
)

// The float matmul on amd64: a packed product (B packed in panels of nr
// columns, or read in place; A read in place) around assembly
// micro-kernels (gemm_amd64.s), AVX-512 ones where the CPU has AVX-512,
// else AVX2 and FMA ones; without AVX2 and FMA, the pure-Go product of
// matmul.go. An operand given as its transpose (ExecMatmulT) is packed
// from there by the block transposes of transpose_amd64.s: B always, A a
// micro-panel of rows at a time; a product of B given transposed and
// fewer rows than columns (x·Wᵀ) runs as its transpose, packing the
// smaller A instead (swapRoles).
//
// Each element of C sums k in blocks (gemmBlocks), in order, the first
// block stored and each later one added, each block one chain of fused
// multiply-adds in k order. So on a given CPU the bits depend on the shape
// alone: not on the number of cores or which goroutine computes what (the
// work is shared out as it comes), nor on which kernel runs.

// The micro-kernels: C[mr×nr] at c (row length ldc) = A[mr×k] at a (row
// length lda) · B[k×nr] at b (row length ldb: nr for a packed panel);
// stored, or added to C if add.

//go:noescape
func gemm6x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func gemm6x8d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)

//go:noescape
func gemm12x32(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func gemm12x16d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)

//go:noescape
func gemm12x16(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, add bool)

//go:noescape
func gemm12x8d(k int, a *float64, lda int, b *float64, ldb int, c *float64, ldc int, add bool)

// The block transposes of packing (transpose_amd64.s): n square blocks,
// block i at src + i*sstep (rows lds apart) written transposed to dst +
// i*dstep (rows ldd apart); lengths in elements.

//go:noescape
func transpose8x8(n int, src *float32, lds, sstep int, dst *float32, ldd, dstep int)

//go:noescape
func transpose4x4d(n int, src *float64, lds, sstep int, dst *float64, ldd, dstep int)

// cpuid executes CPUID with EAX=leaf and ECX=sub.
func cpuid(leaf, sub uint32) (a, b, c, d uint32)

// xgetbv0 reads XCR0, the state the OS saves and restores.
func xgetbv0() (lo, hi uint32)

// hasAVX2FMA reports whether the CPU has AVX2 and FMA and the OS saves the
// YMM registers; hasAVX512 whether it also has AVX-512F and the OS saves
// the ZMM and mask registers.
var hasAVX2FMA, hasAVX512 = detectSIMD()

func detectSIMD() (avx2, avx512 bool) {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false, false
	}
	_, _, c1, _ := cpuid(1, 0)
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if c1&(fma|osxsave|avx) != fma|osxsave|avx {
		return false, false
	}
	xcr0, _ := xgetbv0()
	if xcr0&6 != 6 { // XMM and YMM state
		return false, false
	}
	_, b7, _, _ := cpuid(7, 0)
	avx2 = b7&(1<<5) != 0
	avx512 = avx2 && b7&(1<<16) != 0 && xcr0&0xe0 == 0xe0 // opmask, ZMM0-15 upper halves, ZMM16-31
	return avx2, avx512
}

// gemmKernel is a micro-kernel and its block shape.
type gemmKernel[T float] struct {
	mr, nr int
	run    func(k int, a *T, lda int, b *T, ldb int, c *T, ldc int, add bool)
}

var (
	kern6x16   = gemmKernel[float32]{6, 16, gemm6x16}
	kern12x32  = gemmKernel[float32]{12, 32, gemm12x32}
	kern12x16  = gemmKernel[float32]{12, 16, gemm12x16}
	kern6x8d   = gemmKernel[float64]{6, 8, gemm6x8d}
	kern12x16d = gemmKernel[float64]{12, 16, gemm12x16d}
	kern12x8d  = gemmKernel[float64]{12, 8, gemm12x8d}
)

// Blocking: k in blocks of at most gkc (mr rows of A over a block stay in
// L1 while the tile's B panels stream from L2); a tile has at most gnc
// bytes of columns of B a k step, and packs as many k blocks of B at once
// as fit in gpb bytes, so that with k up to gpb/gnc its strip of C stays in
// L1 from the first block to the last.
const (
	gkc = 256
	gnc = 1024
	gpb = 1 << 20
)

// matmulF32 is the float32 matmul.
func matmulF32(p *mm, c, a, b []float32) {
	if !hasAVX2FMA {
		matmulFloat(p, c, a, b, micro2x4)
		return
	}
	p.fold()
	a, b = swapRoles(p, a, b)
	kern := kern6x16
	switch {
	case hasAVX512 && p.m >= 12 && p.n > 16:
		kern = kern12x32
	case hasAVX512 && p.m >= 12:
		kern = kern12x16
	}
	gemmSIMD(p, c, a, b, kern)
}

// matmulF64 is the float64 matmul.
func matmulF64(p *mm, c, a, b []float64) {
	if !hasAVX2FMA {
		matmulFloat(p, c, a, b, micro2x4f64)
		return
	}
	p.fold()
	a, b = swapRoles(p, a, b)
	kern := kern6x8d
	switch {
	case hasAVX512 && p.m >= 12 && p.n > 8:
		kern = kern12x16d
	case hasAVX512 && p.m >= 12:
		kern = kern12x8d
	}
	gemmSIMD(p, c, a, b, kern)
}

// swapRoles turns a product of B given as its transpose, C = A·B, into
// its transpose, Cᵀ = Bᵀ·Aᵀ, where that packs less: Bᵀ, as it is given,
// is the new A, read in place, and Aᵀ the new B, packed from A, m·k
// elements instead of n·k, and C is written transposed. Each element of C
// is the same chain of fused multiply-adds (a product's operands commute),
// so the bits do not change. It swaps only where m < n, m fills panels of
// 32 columns with little waste, and gemmShared then computes the product;
// it returns the operands, swapped if p is.
func swapRoles[T float](p *mm, a, b []T) ([]T, []T) {
	m, k, n := p.m, p.k, p.n
	if !p.tb || p.ta || p.tc || p.batch.rank != 0 || m < 2 || m >= n || n < 12 ||
		m*n*k <= smallMatmul || 8*roundUp(m, 32) > 9*m ||
		k*128 > gpb || k*roundUp(m, 32)*sizeOf[T]() > gpbShared {
		return a, b
	}
	p.m, p.n = n, m
	p.tc = true // and tb stays: the new B is given as its transpose, A
	return b, a
}

func gemmSIMD[T float](p *mm, c, a, b []T, kern gemmKernel[T]) {
	if p.k == 0 {
		clear(c)
		return
	}
	// Few rows of A would not pay for packing B.
	if p.m*p.n*p.k <= smallMatmul || p.n == 1 || p.m < kern.mr && p.n%kern.nr != 0 {
		matmulSimple(p, c, a, b)
		return
	}
	gemmPacked(*p, c, a, b, kern)
}

// fold makes a batch of products that share B, A's matrices following
// each other, one product of all of A's rows (C's follow each other too).
// The bits do not change: each element of C is computed the same way.
func (p *mm) fold() {
	if p.batch.rank == 1 && p.batch.st[0][0] == 1 && p.batch.st[1][0] == 0 {
		p.m *= p.batch.n
		p.batch, _ = newBcast(nil)
	}
}

// gemmBlocks is the number of k blocks: k is cut into that many blocks of
// nearly equal length, block i from gemmBlock(k, nb, i).
func gemmBlocks(k int) int { return (k + gkc - 1) / gkc }

// gemmBlock is the start of k block i of nb.
func gemmBlock(k, nb, i int) int { return k * i / nb }

// gemmPacked is the packed product, on as many cores as it is worth. It
// takes p by value so that the caller's copy stays on its stack.
func gemmPacked[T float](pv mm, c, a, b []T, kern gemmKernel[T]) {
	p := &pv
	p.fold()
	w := 1
	if p.m*p.n*p.k >= gemmParallel && !p.serial {
		w = threads()
	}
	if p.batch.n != 1 {
		gemmTiles(p, c, a, b, kern, w)
		return
	}
	// B is read in place where its panels are whole and serve one
	// micro-panel of A's rows, or few and its rows do not start at the same
	// offset in every page. Else it is packed, whole if it is small enough.
	ip := (p.m + kern.mr - 1) / kern.mr
	inplace := !p.tb && p.n%kern.nr == 0 && (ip == 1 || ip <= 12 && p.n*sizeOf[T]()%4096 != 0)
	if sz := p.k * kern.nr * sizeOf[T](); inplace || p.tc || sz <= gpb && sz*((p.n+kern.nr-1)/kern.nr) <= gpbShared {
		gemmShared(p, c, a, b, kern, w, inplace)
		return
	}
	gemmTiles(p, c, a, b, kern, w)
}

// gemmParallel is the m·n·k from which a product spreads over the cores.
const gemmParallel = 1 << 20

// gpbShared is the most bytes of packed B that gemmShared packs.
const gpbShared = 8 << 20

// gemmShared computes one matrix product whose B, packed whole, takes at
// most gpbShared bytes, a panel of it at most gpb, or that reads B in
// place (if inplace), on w goroutines: they pack B, taking a part at a
// time, then C's rows, a few micro-panels by a
// group of panels at a time, each unit once its part of B is packed. No
// goroutine waits for one that has not started, so one the scheduler
// starts late only takes less of the work.
func gemmShared[T float](p *mm, c, a, b []T, kern gemmKernel[T], w int, inplace bool) {
	m, n, k := p.m, p.n, p.k
	mr, nr := kern.mr, kern.nr
	nkb := gemmBlocks(k)
	jp := (n + nr - 1) / nr
	ip := (m + mr - 1) / mr
	var pb []T
	if !inplace {
		bh := gemmPool.Get().(*[]float64)
		defer gemmPool.Put(bh)
		pb = packBuf[T](bh, k*jp*nr)
	}
	// Work is taken in units of rp micro-panels of rows by cp panels of
	// columns: at most gpb bytes of packed B a group of panels, so that it
	// stays in L2 while the units of that group run, one after the other;
	// about 2^19 flops or more a unit; and if the columns allow, 8 units or
	// more a goroutine, so that one started late or held up leaves little
	// to wait for.
	rp := max(1, (1<<18)/(mr*n*k))
	ru := (ip + rp - 1) / rp
	cp := max(1, gpb/(k*nr*sizeOf[T]()))
	for w > 1 && ru*((jp+cp-1)/cp) < 8*w && cp >= 4 {
		cp = (cp + 1) / 2
	}
	cg := (jp + cp - 1) / cp
	units := ru * cg
	// B is packed in tasks of one k block by one part of a group of
	// panels, group by group, reading its rows a part wide: a group in sub
	// parts, so that there are packs for every goroutine to share.
	sub := 1
	if w > 1 {
		sub = max(1, min(cp, (4*w+nkb*cg-1)/(nkb*cg)))
	}
	packs := nkb * cg * sub
	if inplace {
		packs = 0
	}
	// A group's units wait for its packs: a few yields, then on ready[q],
	// closed by the goroutine that packs its last part, so that a waiting
	// goroutine never keeps the core from one packing (with more
	// goroutines than free cores, they may share one).
	var packed []atomicInt // the packed blocks of each group
	var ready []chan struct{}
	if packs > 0 {
		packed, ready = make([]atomicInt, cg), make([]chan struct{}, cg)
		for q := range ready {
			ready[q] = make(chan struct{})
		}
	}
	var nextPack, nextUnit atomicInt
	var failed atomic.Bool       // a goroutine panicked: do not wait for its packs
	abort := make(chan struct{}) // closed when failed is set
	work := func(_ int) {
		defer func() {
			if r := recover(); r != nil {
				if failed.CompareAndSwap(false, true) {
					close(abort)
				}
				panic(r)
			}
		}()
		for {
			t := nextPack.add() - 1
			if t >= packs {
				break
			}
			q, part, bi := t/(nkb*sub), t%(nkb*sub)/nkb, t%nkb
			pc, pe := gemmBlock(k, nkb, bi), gemmBlock(k, nkb, bi+1)
			kk := pe - pc
			g0, gn := q*cp, min(jp, (q+1)*cp)-q*cp
			jb0, jb1 := g0+gn*part/sub, g0+gn*(part+1)/sub
			j0, cols := jb0*nr, min(n, jb1*nr)-min(n, jb0*nr) // no columns if jb0 == jb1
			packBOf(p, pb[pc*jp*nr+jb0*kk*nr:pc*jp*nr+jb1*kk*nr], b, j0, cols, pc, kk, nr)
			if packed[q].add() == nkb*sub {
				close(ready[q])
			}
		}
		ah := getF64(0) // handle; resized below
		defer f64Pool.Put(ah)
		g := gemmScratch[T]{nkb: nkb, gb: nkb, pb: pb, cols: n, jp: jp}
		if inplace {
			g.b = b
		}
		g.initRows(k, kern, ah)
		for {
			t := nextUnit.add() - 1
			if t >= units {
				return
			}
			q, r := t/ru, t%ru
			if packs > 0 {
				for i := 0; i < 64 && packed[q].load() < nkb*sub; i++ {
					runtime.Gosched()
				}
				select {
				case <-ready[q]:
				case <-abort:
					return
				}
			}
			for ib := r * rp; ib < min(ip, (r+1)*rp); ib++ {
				gemmRows(p, c, a, ib*mr, min(mr, m-ib*mr), q*cp, min(jp, (q+1)*cp), 0, nkb, &g, kern)
			}
		}
	}
	if w = min(w, units); w > 1 {
		spread(w, work)
		return
	}
	work(0)
}

// atomicInt is a counter the goroutines of a product share.
type atomicInt struct{ v atomic.Int64 }

func (x *atomicInt) add() int  { return int(x.v.Add(1)) }
func (x *atomicInt) load() int { return int(x.v.Load()) }

// gemmTiles computes the product in tiles spread over w goroutines, each
// tile packing its own B.
func gemmTiles[T float](p *mm, c, a, b []T, kern gemmKernel[T], w int) {
	m, n := p.m, p.n
	mr, nr := kern.mr, kern.nr
	// Tiles of at most gnc bytes of columns and as many rows as can be, so
	// that each packed block of B serves many rows of A; cut into at least
	// two tiles a core, as long as tiles keep at least 48 rows and 64
	// columns. (The tiling does not change the bits: see above.)
	maxCols := gnc / sizeOf[T]()
	tm, tn := 1, (n+maxCols-1)/maxCols
	for p.batch.n*tm*tn < 2*w {
		hm, hn := m/(tm+1), n/(tn+1)
		if hm >= 48 && (hm >= hn || hn < 64) {
			tm++
		} else if hn >= 64 {
			tn++
		} else {
			break
		}
	}
	tmc := roundUp((m+tm-1)/tm, mr)
	tnc := roundUp((n+tn-1)/tn, nr)
	tm, tn = (m+tmc-1)/tmc, (n+tnc-1)/tnc
	tasks := p.batch.n * tm * tn
	run := func(lo, hi int) {
		ah, bh := getF64(0), gemmPool.Get().(*[]float64) // handles; resized below
		defer f64Pool.Put(ah)
		defer gemmPool.Put(bh)
		var g gemmScratch[T]
		g.init(p.k, tnc, kern, ah, bh)
		for t := lo; t < hi; t++ {
			bi, rest := t/(tm*tn), t%(tm*tn)
			ti, tj := rest/tn, rest%tn
			oa, ob, oc := p.offsets(bi)
			i0, j0 := ti*tmc, tj*tnc
			gemmTileSIMD(p, c[oc:oc+m*n], a[oa:oa+m*p.k], b[ob:ob+p.k*n],
				i0, j0, min(tmc, m-i0), min(tnc, n-j0), &g, kern)
		}
	}
	w = min(w, tasks)
	if w > 1 {
		parallelDynamic(tasks, w, run)
		return
	}
	run(0, tasks)
}

// gemmScratch is a goroutine's buffers: pb the packed B of a group of gb k
// blocks of nkb, columns [j0, j0+cols) in jp panels; pa the last rows of A
// when fewer than mr (row length lda, zero past them) over such a group;
// edge one micro-tile.
type gemmScratch[T float] struct {
	pa, pb, edge []T
	b            []T // B, when read in place instead of pb
	lda          int
	nkb, gb      int
	j0, cols, jp int
}

// init sizes the buffers for tiles of at most tnc columns.
func (g *gemmScratch[T]) init(k, tnc int, kern gemmKernel[T], ah, bh *[]float64) {
	g.nkb = gemmBlocks(k)
	kb := (k + g.nkb - 1) / g.nkb // longest block
	g.gb = max(1, min(g.nkb, gpb/sizeOf[T]()/(kb*tnc)))
	g.pb = packBuf[T](bh, min(k, g.gb*kb)*tnc)
	g.initRows(min(k, g.gb*kb), kern, ah)
}

// initRows sizes pa and edge, both in ah, for groups spanning at most gk
// of k.
func (g *gemmScratch[T]) initRows(gk int, kern gemmKernel[T], ah *[]float64) {
	g.lda = roundUp(gk, 16) + 16
	na := kern.mr * g.lda
	buf := packBuf[T](ah, na+kern.mr*kern.nr)
	g.pa, g.edge = buf[:na:na], buf[na:]
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// gemmTileSIMD computes rows [i0, i0+rows) and columns [j0, j0+cols) of one
// batch's C (m×n) = A (m×k) · B (k×n): per group of k blocks, it packs B,
// then runs gemmRows for each mr rows.
func gemmTileSIMD[T float](p *mm, c, a, b []T, i0, j0, rows, cols int, g *gemmScratch[T], kern gemmKernel[T]) {
	k := p.k
	mr, nr := kern.mr, kern.nr
	jp := (cols + nr - 1) / nr
	g.j0, g.cols, g.jp = j0, cols, jp
	for b0 := 0; b0 < g.nkb; b0 += g.gb {
		b1 := min(b0+g.gb, g.nkb)
		k0 := gemmBlock(k, g.nkb, b0)
		for bi := b0; bi < b1; bi++ {
			pc, pe := gemmBlock(k, g.nkb, bi), gemmBlock(k, g.nkb, bi+1)
			packBOf(p, g.pb[(pc-k0)*jp*nr:(pe-k0)*jp*nr], b, j0, cols, pc, pe-pc, nr)
		}
		for ir := 0; ir < rows; ir += mr {
			gemmRows(p, c, a, i0+ir, min(mr, rows-ir), 0, jp, b0, b1, g, kern)
		}
	}
}

// gemmRows computes, for k blocks [b0, b1) of g.nkb, rows [ci, ci+nrow)
// (nrow at most mr) of C, in the columns of panels [jb0, jb1) of g.pb,
// which holds those blocks of B from the start of block b0.
func gemmRows[T float](p *mm, c, a []T, ci, nrow, jb0, jb1, b0, b1 int, g *gemmScratch[T], kern gemmKernel[T]) {
	n, k := p.n, p.k
	mr, nr := kern.mr, kern.nr
	j0, cols, jp := g.j0, g.cols, g.jp
	k0, k1 := gemmBlock(k, g.nkb, b0), gemmBlock(k, g.nkb, b1)
	ap, lda, ak0 := a, k, ci*k // the kernel's A starts at ap[ak0+pc]
	if nrow < mr || p.ta {
		for r := range mr {
			dst := g.pa[r*g.lda : r*g.lda+k1-k0]
			switch {
			case r >= nrow:
				clear(dst)
			case !p.ta:
				src := (ci + r) * k
				copy(dst, a[src+k0:src+k1])
			}
		}
		if p.ta {
			gatherA(g.pa, g.lda, a, p.m, ci, nrow, k0, k1)
		}
		ap, lda, ak0 = g.pa, g.lda, -k0
	}
	if p.tc {
		// C is written transposed (row length m): a micro-tile sums every
		// k block in edge, as C would, then goes to C's columns.
		for jb := jb0; jb < jb1; jb++ {
			cj := j0 + jb*nr
			for bi := b0; bi < b1; bi++ {
				pc, pe := gemmBlock(k, g.nkb, bi), gemmBlock(k, g.nkb, bi+1)
				kk := pe - pc
				_ = ap[ak0+pc+(mr-1)*lda+kk-1] // the kernel's last element of A
				pb := g.pb[(pc-k0)*jp*nr : (pe-k0)*jp*nr]
				kern.run(kk, &ap[ak0+pc], lda, &pb[jb*kk*nr], nr, &g.edge[0], nr, pc > 0)
			}
			transposeSIMD(c[cj*p.m+ci:], p.m, g.edge, nr, nrow, min(nr, j0+cols-cj))
		}
		return
	}
	for bi := b0; bi < b1; bi++ {
		pc, pe := gemmBlock(k, g.nkb, bi), gemmBlock(k, g.nkb, bi+1)
		kk, add := pe-pc, pc > 0
		_ = ap[ak0+pc+(mr-1)*lda+kk-1] // the kernel's last element of A
		pa := &ap[ak0+pc]
		var pb []T
		if g.b == nil {
			pb = g.pb[(pc-k0)*jp*nr : (pe-k0)*jp*nr]
		}
		for jb := jb0; jb < jb1; jb++ {
			cj := j0 + jb*nr
			var bp *T
			ldb := nr
			if g.b != nil {
				_ = g.b[(pe-1)*n+cj+nr-1] // the kernel's last element of B
				bp, ldb = &g.b[pc*n+cj], n
			} else {
				bp = &pb[jb*kk*nr]
			}
			if nrow == mr && cj+nr <= j0+cols {
				_ = c[(ci+mr-1)*n+cj+nr-1] // the kernel's last element of C
				kern.run(kk, pa, lda, bp, ldb, &c[ci*n+cj], n, add)
				continue
			}
			kern.run(kk, pa, lda, bp, ldb, &g.edge[0], nr, false)
			wc := min(nr, j0+cols-cj)
			for r := range nrow {
				dst := c[(ci+r)*n+cj : (ci+r)*n+cj+wc]
				src := g.edge[r*nr : r*nr+wc]
				if add {
					for q, v := range src {
						dst[q] += v
					}
				} else {
					copy(dst, src)
				}
			}
		}
	}
}

// gatherA copies rows [ci, ci+nrow) and columns [k0, k1) of A, given as
// its transpose at (row length m), to the rows of pa (row length lda).
func gatherA[T float](pa []T, lda int, at []T, m, ci, nrow, k0, k1 int) {
	transposeSIMD(pa, lda, at[k0*m+ci:], m, k1-k0, nrow)
}

// packBOf packs rows [pc, pc+kk) and columns [j0, j0+cols) of p's B into
// panels of nr columns (see packBPanels), from B or from its transpose.
func packBOf[T float](p *mm, dst, b []T, j0, cols, pc, kk, nr int) {
	if p.tb {
		packBPanelsT(dst, b, p.k, j0, cols, pc, kk, nr)
		return
	}
	packBPanels(dst, b, p.n, j0, cols, pc, kk, nr)
}

// packBPanelsT is packBPanels from B's transpose bt (row length k): element
// (q, s) of panel jb is bt[(j0+jb*nr+s)*k+pc+q].
func packBPanelsT[T float](dst, bt []T, k, j0, cols, pc, kk, nr int) {
	for jb := 0; jb*nr < cols; jb++ {
		pan := dst[jb*nr*kk : (jb+1)*nr*kk]
		w := min(nr, cols-jb*nr)
		transposeSIMD(pan, nr, bt[(j0+jb*nr)*k+pc:], k, w, kk)
		if w < nr {
			for q := range kk {
				clear(pan[q*nr+w : q*nr+nr])
			}
		}
	}
}

// transposeSIMD writes the transpose of the rows×cols block at src (row
// length lds) to dst (row length ldd): dst[j*ldd+i] = src[i*lds+j]. It
// moves square blocks of 8 (float32) or 4 (float64) through vector
// registers, the last ones of each way overlapping the ones before rather
// than running past the edge; a block narrower than that is copied element
// by element.
func transposeSIMD[T float](dst []T, ldd int, src []T, lds, rows, cols int) {
	if rows == 0 || cols == 0 {
		return
	}
	_ = src[(rows-1)*lds+cols-1] // the last element read
	_ = dst[(cols-1)*ldd+rows-1] // the last element written
	bs := 32 / sizeOf[T]()
	if rows < bs || cols < bs {
		for i := range rows {
			for j, v := range src[i*lds : i*lds+cols] {
				dst[j*ldd+i] = v
			}
		}
		return
	}
	full := cols / bs
	for i := 0; ; i += bs {
		i = min(i, rows-bs)
		switch s, d := any(src[i*lds:]), any(dst[i:]); s := s.(type) {
		case []float32:
			d := d.([]float32)
			transpose8x8(full, &s[0], lds, bs, &d[0], ldd, bs*ldd)
			if cols%bs != 0 {
				transpose8x8(1, &s[cols-bs], lds, 0, &d[(cols-bs)*ldd], ldd, 0)
			}
		case []float64:
			d := d.([]float64)
			transpose4x4d(full, &s[0], lds, bs, &d[0], ldd, bs*ldd)
			if cols%bs != 0 {
				transpose4x4d(1, &s[cols-bs], lds, 0, &d[(cols-bs)*ldd], ldd, 0)
			}
		}
		if i == rows-bs {
			return
		}
	}
}

// packBPanels packs rows [pc, pc+kk) and columns [j0, j0+cols) of B (row
// length n) into panels of nr columns: element (q, s) of panel jb at
// jb*nr*kk + q*nr + s. Columns past the end are zero.
func packBPanels[T float](dst, b []T, n, j0, cols, pc, kk, nr int) {
	full := cols / nr
	for q := range kk {
		row := b[(pc+q)*n+j0 : (pc+q)*n+j0+cols]
		switch nr {
		case 16:
			for jb := range full {
				*(*[16]T)(dst[jb*nr*kk+q*nr:]) = *(*[16]T)(row[jb*nr:])
			}
		case 32:
			for jb := range full {
				*(*[32]T)(dst[jb*nr*kk+q*nr:]) = *(*[32]T)(row[jb*nr:])
			}
		default:
			for jb := range full {
				o := jb*nr*kk + q*nr
				copy(dst[o:o+nr], row[jb*nr:jb*nr+nr])
			}
		}
		if full*nr < cols {
			o := full*nr*kk + q*nr
			d := dst[o : o+nr]
			m := copy(d, row[full*nr:])
			clear(d[m:])
		}
	}
}
