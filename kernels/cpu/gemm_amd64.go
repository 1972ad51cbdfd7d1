//go:build amd64 && !purego

package cpu

import "runtime"

// The float32 matmul on amd64 with AVX2 and FMA: the packed product of
// matmul.go with a 6×16 assembly micro-kernel (gemm_amd64.s). Each element
// of C sums k in blocks of gkc, in order, the first block stored and each
// later one added, so the bits do not depend on how the tiles are spread
// over the cores.

// gemm6x16 computes the 6×16 product of a packed A panel (6 rows, k
// interleaved) and a packed B panel (16 columns, k interleaved), both k
// long, and stores it to C at c (row length ldc), or adds it there if add.
//
//go:noescape
func gemm6x16(k int, a, b, c *float32, ldc int, add bool)

// cpuid executes CPUID with EAX=leaf and ECX=sub.
func cpuid(leaf, sub uint32) (a, b, c, d uint32)

// xgetbv0 reads XCR0, the state the OS saves and restores.
func xgetbv0() (lo, hi uint32)

// hasAVX2FMA reports whether the CPU has AVX2 and FMA and the OS saves
// the YMM registers.
var hasAVX2FMA = detectAVX2FMA()

func detectAVX2FMA() bool {
	maxLeaf, _, _, _ := cpuid(0, 0)
	if maxLeaf < 7 {
		return false
	}
	_, _, c1, _ := cpuid(1, 0)
	const fma, osxsave, avx = 1 << 12, 1 << 27, 1 << 28
	if c1&(fma|osxsave|avx) != fma|osxsave|avx {
		return false
	}
	if xcr0, _ := xgetbv0(); xcr0&6 != 6 { // XMM and YMM state
		return false
	}
	_, b7, _, _ := cpuid(7, 0)
	return b7&(1<<5) != 0 // AVX2
}

// Blocking of the assembly path: gmr×gnr micro-tiles; k in blocks of gkc
// (a B micro-panel of gkc×gnr stays in L1); tiles of at most gmc×gnc (the
// packed A block in L2, B block in L2 or L3).
const (
	gmr = 6
	gnr = 16
	gkc = 256
	gmc = 192
	gnc = 512
)

// matmulF32 is the float32 matmul: the assembly path where the CPU has
// it, else the pure-Go one.
func matmulF32(p *mm, c, a, b []float32) {
	if !hasAVX2FMA {
		matmulFloat(p, c, a, b, micro2x4)
		return
	}
	if p.k == 0 {
		clear(c)
		return
	}
	if p.n < gnr || p.m < gmr || p.m*p.n*p.k <= smallMatmul {
		matmulSimple(p, c, a, b)
		return
	}
	gemmAVX(*p, c, a, b)
}

// gemmAVX is the packed product with the assembly micro-kernel, in tiles
// spread over the cores. It takes p by value so that the caller's copy
// stays on its stack.
func gemmAVX(pv mm, c, a, b []float32) {
	p := &pv
	m, n := p.m, p.n
	procs := runtime.GOMAXPROCS(0)
	w := 1
	if p.m*p.n*p.k >= 1<<18 {
		w = procs
	}
	// Tiles of at most gnc columns and as many rows as can be, so that each
	// packed block of B serves many blocks of A; cut into at least two
	// tiles a core, as long as tiles keep at least 48 rows and 64 columns.
	// (The tiling does not change the bits: see above.)
	tm, tn := 1, (n+gnc-1)/gnc
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
	tmc := roundUp((m+tm-1)/tm, gmr)
	tnc := roundUp((n+tn-1)/tn, gnr)
	tm, tn = (m+tmc-1)/tmc, (n+tnc-1)/tnc
	tasks := p.batch.n * tm * tn
	run := func(lo, hi int) {
		ah, bh, eh := getF64(0), getF64(0), getF64(0) // handles; resized below
		defer f64Pool.Put(ah)
		defer f64Pool.Put(bh)
		defer f64Pool.Put(eh)
		pa := packBuf[float32](ah, min(tmc, gmc)*gkc)
		pb := packBuf[float32](bh, tnc*gkc)
		edge := packBuf[float32](eh, gmr*gnr)
		for t := lo; t < hi; t++ {
			bi, rest := t/(tm*tn), t%(tm*tn)
			ti, tj := rest/tn, rest%tn
			oa, ob, oc := p.offsets(bi)
			i0, j0 := ti*tmc, tj*tnc
			gemmTileAVX(p, c[oc:oc+m*n], a[oa:oa+m*p.k], b[ob:ob+p.k*n],
				i0, j0, min(tmc, m-i0), min(tnc, n-j0), pa, pb, edge)
		}
	}
	w = min(w, tasks)
	if w > 1 {
		parallelDynamic(tasks, w, run)
		return
	}
	run(0, tasks)
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// gemmTileAVX computes rows [i0, i0+rows) and columns [j0, j0+cols) of
// one batch's C (m×n) = A (m×k) · B (k×n): per block of k, it packs that
// block of B once, then A gmc rows at a time.
func gemmTileAVX(p *mm, c, a, b []float32, i0, j0, rows, cols int, pa, pb, edge []float32) {
	n, k := p.n, p.k
	jp := (cols + gnr - 1) / gnr
	edge = edge[:gmr*gnr]
	for pc := 0; pc < k; pc += gkc {
		kk := min(gkc, k-pc)
		pb := pb[:jp*gnr*kk]
		packB16(pb, b, n, j0, cols, pc, kk)
		add := pc > 0
		for ic := i0; ic < i0+rows; ic += gmc {
			mrows := min(gmc, i0+rows-ic)
			ip := (mrows + gmr - 1) / gmr
			pa := pa[:ip*gmr*kk]
			packA6(pa, a, k, ic, mrows, pc, kk)
			for jb := range jp {
				bpan := pb[jb*gnr*kk : (jb+1)*gnr*kk]
				cj := j0 + jb*gnr
				wide := cj+gnr <= j0+cols
				for ib := range ip {
					apan := pa[ib*gmr*kk : (ib+1)*gmr*kk]
					ci := ic + ib*gmr
					if wide && ci+gmr <= ic+mrows {
						_ = c[(ci+gmr-1)*n+cj+gnr-1] // the kernel's last element
						gemm6x16(kk, &apan[0], &bpan[0], &c[ci*n+cj], n, add)
						continue
					}
					gemm6x16(kk, &apan[0], &bpan[0], &edge[0], gnr, false)
					for r := 0; r < gmr && ci+r < ic+mrows; r++ {
						w := min(gnr, j0+cols-cj)
						dst := c[(ci+r)*n+cj : (ci+r)*n+cj+w]
						src := edge[r*gnr : r*gnr+w]
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
	}
}

// packA6 packs rows [i0, i0+rows) and columns [pc, pc+kk) of A (row
// length k) into panels of 6 rows: element (r, q) of panel ib at
// ib*6*kk + q*6 + r. Rows past the end are zero.
func packA6(dst, a []float32, k, i0, rows, pc, kk int) {
	for ib := 0; ib*gmr < rows; ib++ {
		pan := dst[ib*gmr*kk : (ib+1)*gmr*kk]
		base := (i0+ib*gmr)*k + pc
		if ib*gmr+gmr <= rows {
			r0 := a[base : base+kk]
			r1 := a[base+k : base+k+kk]
			r2 := a[base+2*k : base+2*k+kk]
			r3 := a[base+3*k : base+3*k+kk]
			r4 := a[base+4*k : base+4*k+kk]
			r5 := a[base+5*k : base+5*k+kk]
			for q, v := range r0 {
				d := pan[q*gmr : q*gmr+gmr : q*gmr+gmr]
				d[0], d[1], d[2], d[3], d[4], d[5] = v, r1[q], r2[q], r3[q], r4[q], r5[q]
			}
			continue
		}
		for r := range gmr {
			if ib*gmr+r >= rows {
				for q := range kk {
					pan[q*gmr+r] = 0
				}
				continue
			}
			for q, v := range a[base+r*k : base+r*k+kk] {
				pan[q*gmr+r] = v
			}
		}
	}
}

// packB16 packs rows [pc, pc+kk) and columns [j0, j0+cols) of B (row
// length n) into panels of 16 columns: element (q, s) of panel jb at
// jb*16*kk + q*16 + s. Columns past the end are zero.
func packB16(dst, b []float32, n, j0, cols, pc, kk int) {
	full := cols / gnr
	for q := range kk {
		row := b[(pc+q)*n+j0 : (pc+q)*n+j0+cols]
		for jb := range full {
			o := jb*gnr*kk + q*gnr
			*(*[gnr]float32)(dst[o:]) = *(*[gnr]float32)(row[jb*gnr:])
		}
		if full*gnr < cols {
			o := full*gnr*kk + q*gnr
			d := dst[o : o+gnr]
			m := copy(d, row[full*gnr:])
			clear(d[m:])
		}
	}
}
