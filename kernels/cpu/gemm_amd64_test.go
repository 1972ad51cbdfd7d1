//go:build amd64 && !purego

package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// gemmShape is a matmul shape with batch dims of A and B.
type gemmShape struct {
	m, k, n int
	ab, bb  []int
}

// gemmShapes are many odd shapes, with and without broadcast batch dims.
func gemmShapes(r *rand.Rand) []gemmShape {
	var shapes []gemmShape
	for range 300 {
		shapes = append(shapes, gemmShape{m: 1 + r.IntN(70), k: 1 + r.IntN(70), n: 1 + r.IntN(70)})
	}
	for _, s := range [][3]int{
		{1, 1, 1}, {6, 1, 16}, {7, 3, 17}, {12, 1, 32}, {13, 5, 33}, {70, 70, 70}, {5, 9, 15},
		{193, 257, 513}, {200, 600, 530}, {385, 513, 100}, {6, 1000, 16}, {37, 256, 1030},
		{12, 2100, 40}, {300, 1500, 300}, {1000, 20, 64}, {100, 300, 64}, {128, 513, 96}, {130, 40, 128},
		{1, 700, 1024}, {5, 300, 2048}, {3, 3000, 64},
	} {
		shapes = append(shapes, gemmShape{m: s[0], k: s[1], n: s[2]})
	}
	return append(shapes,
		gemmShape{m: 13, k: 29, n: 37, ab: []int{3}, bb: []int{3}},
		gemmShape{m: 50, k: 300, n: 70, ab: []int{2, 1}, bb: []int{3}},
		gemmShape{m: 9, k: 20, n: 33, ab: []int{1}, bb: []int{4, 2}},
		gemmShape{m: 64, k: 64, n: 64, bb: []int{5}},
		gemmShape{m: 30, k: 50, n: 40, ab: []int{4}},
		gemmShape{m: 5, k: 300, n: 70, ab: []int{3, 7}},
		gemmShape{m: 7, k: 20, n: 33, ab: []int{2, 3}, bb: []int{1, 1}},
	)
}

// setup returns the mm of s and random operands.
func (s gemmShape) setup(t *testing.T, r *rand.Rand) (p mm, a, b []float64) {
	nb := max(len(s.ab), len(s.bb))
	yb := make([]int, nb)
	for j := range yb {
		da, db := 1, 1
		if i := j - (nb - len(s.ab)); i >= 0 {
			da = s.ab[i]
		}
		if i := j - (nb - len(s.bb)); i >= 0 {
			db = s.bb[i]
		}
		yb[j] = max(da, db)
	}
	p = mm{m: s.m, k: s.k, n: s.n}
	var ok bool
	if p.batch, ok = newBcast(yb, s.ab, s.bb); !ok {
		t.Fatalf("%+v: batch dims do not broadcast", s)
	}
	na, nbB := s.m*s.k, s.k*s.n
	for _, d := range s.ab {
		na *= d
	}
	for _, d := range s.bb {
		nbB *= d
	}
	a, b = make([]float64, na), make([]float64, nbB)
	for i := range a {
		a[i] = float64(r.Float32()*2 - 1)
	}
	for i := range b {
		b[i] = float64(r.Float32()*2 - 1)
	}
	return p, a, b
}

func convert[T, U float](x []U) []T {
	y := make([]T, len(x))
	for i, v := range x {
		y[i] = T(v)
	}
	return y
}

// TestGemmSIMD compares each assembly kernel the CPU has with a reference
// summed in float64 (float32) or with error bounds (float64) on many odd
// shapes, and checks that the kernels of one dtype give the same bits.
func TestGemmSIMD(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no AVX2 and FMA")
	}
	k32 := []gemmKernel[float32]{kern6x16}
	k64 := []gemmKernel[float64]{kern6x8d}
	if hasAVX512 {
		k32 = append(k32, kern12x32, kern12x16)
		k64 = append(k64, kern12x16d, kern12x8d)
	}
	r := rand.New(rand.NewPCG(11, 12))
	for _, s := range gemmShapes(r) {
		p, a, b := s.setup(t, r)
		ref := s.reference(p, a, b)
		checkKernels(t, s, p, convert[float32](a), convert[float32](b), ref, k32, 0x1p-24)
		checkKernels(t, s, p, a, b, ref, k64, 0x1p-53)
	}
}

// gemmRef is a product computed in float64 element by element, and the
// sum of its terms' magnitudes (the error bound's scale), each laid out
// as the product's output.
type gemmRef struct{ want, mag []float64 }

// reference computes s's product of a and b once, for every kernel and
// both dtypes to be checked against.
func (s gemmShape) reference(p mm, a, b []float64) gemmRef {
	ref := gemmRef{want: make([]float64, p.batch.n*s.m*s.n), mag: make([]float64, p.batch.n*s.m*s.n)}
	for bi := range p.batch.n {
		oa, ob, oc := p.offsets(bi)
		for i := range s.m {
			for j := range s.n {
				var want, mag float64
				for q := range s.k {
					x := a[oa+i*s.k+q] * b[ob+q*s.n+j]
					want += x
					mag += math.Abs(x)
				}
				ref.want[oc+i*s.n+j], ref.mag[oc+i*s.n+j] = want, mag
			}
		}
	}
	return ref
}

func checkKernels[T float](t *testing.T, s gemmShape, p mm, a, b []T, ref gemmRef, kerns []gemmKernel[T], eps float64) {
	t.Helper()
	var first []T
	for _, kern := range kerns {
		got := make([]T, p.batch.n*s.m*s.n)
		for i := range got {
			got[i] = T(math.NaN())
		}
		gemmPacked(p, got, a, b, kern)
		for bi := range p.batch.n {
			_, _, oc := p.offsets(bi)
			for i := range s.m {
				for j := range s.n {
					o := oc + i*s.n + j
					tol := 2*float64(s.k)*eps*ref.mag[o] + 1e-30
					if g := float64(got[o]); !(math.Abs(g-ref.want[o]) <= tol) {
						t.Fatalf("%+v %d×%d batch %d (%d,%d): got %v, want %v", s, kern.mr, kern.nr, bi, i, j, g, ref.want[o])
					}
				}
			}
		}
		// The ways of spreading a product, and folding a batch into one
		// product, give the same bits.
		tiles := make([]T, len(got))
		gemmTiles(&p, tiles, a, b, kern, 3)
		if !sameBits(got, tiles) {
			t.Errorf("%+v %d×%d: gemmTiles gives other bits than gemmPacked", s, kern.mr, kern.nr)
		}
		if p.batch.n == 1 {
			gemmShared(&p, tiles, a, b, kern, 3, false)
			if !sameBits(got, tiles) {
				t.Errorf("%+v %d×%d: gemmShared gives other bits than gemmPacked", s, kern.mr, kern.nr)
			}
			if s.n%kern.nr == 0 {
				gemmShared(&p, tiles, a, b, kern, 3, true)
			}
			if !sameBits(got, tiles) {
				t.Errorf("%+v %d×%d: gemmShared gives other bits than gemmPacked", s, kern.mr, kern.nr)
			}
		}
		if p.batch.n == 1 && p.batch.rank == 0 {
			checkTransposed(t, s, p, a, b, got, kern)
		}
		if first == nil {
			first = got
		} else if !sameBits(first, got) {
			t.Errorf("%+v: the %d×%d kernel gives other bits than the first", s, kern.mr, kern.nr)
		}
	}
}

func sameBits[T float](x, y []T) bool {
	return slices.EqualFunc(x, y, func(u, v T) bool {
		return math.Float64bits(float64(u)) == math.Float64bits(float64(v))
	})
}

// TestGemmSIMDSameBitsOnAnyCores: the tiling of the assembly path follows
// GOMAXPROCS, the bits must not.
func TestGemmSIMDSameBitsOnAnyCores(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no AVX2 and FMA")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	r := rand.New(rand.NewPCG(13, 14))
	for _, s := range [][3]int{{193, 257, 513}, {101, 600, 77}, {64, 1000, 1100}, {7, 300, 900}, {2000, 288, 64}} {
		t.Run(fmt.Sprint(s), func(t *testing.T) {
			m, k, n := s[0], s[1], s[2]
			p := mm{m: m, k: k, n: n}
			p.batch, _ = newBcast(nil, nil, nil)
			a, b := make([]float64, m*k), make([]float64, k*n)
			for i := range a {
				a[i] = r.Float64()*2 - 1
			}
			for i := range b {
				b[i] = r.Float64()*2 - 1
			}
			a32, b32 := convert[float32](a), convert[float32](b)
			var first32 []float32
			var first64 []float64
			for _, procs := range []int{1, 2, 3, 8} {
				runtime.GOMAXPROCS(procs)
				c32, c64 := make([]float32, m*n), make([]float64, m*n)
				matmulF32(&p, c32, a32, b32)
				matmulF64(&p, c64, a, b)
				if first32 == nil {
					first32, first64 = c32, c64
					continue
				}
				if !sameBits(first32, c32) {
					t.Errorf("float32: GOMAXPROCS=%d gives different bits than GOMAXPROCS=1", procs)
				}
				if !sameBits(first64, c64) {
					t.Errorf("float64: GOMAXPROCS=%d gives different bits than GOMAXPROCS=1", procs)
				}
			}
		})
	}
}

// checkTransposed checks that every way of spreading the product p gives
// the bits want with A, B or both given as their transposes, and with the
// roles of A and B swapped where swapRoles swaps them.
func checkTransposed[T float](t *testing.T, s gemmShape, p mm, a, b, want []T, kern gemmKernel[T]) {
	t.Helper()
	at, bt := flipped(a, p.m, p.k), flipped(b, p.k, p.n)
	for _, tr := range [][2]bool{{true, false}, {false, true}, {true, true}} {
		q := p
		q.ta, q.tb = tr[0], tr[1]
		x, y := a, b
		if q.ta {
			x = at
		}
		if q.tb {
			y = bt
		}
		// B given transposed may run as Cᵀ = Bᵀ·Aᵀ, C written transposed.
		sq := q
		sx, sy := swapRoles(&sq, x, y)
		ways := []struct {
			name string
			run  func(c []T)
		}{
			{"gemmPacked", func(c []T) { gemmPacked(q, c, x, y, kern) }},
			{"gemmPacked swapped", func(c []T) { gemmPacked(sq, c, sx, sy, kern) }},
			{"gemmTiles", func(c []T) { gemmTiles(&q, c, x, y, kern, 3) }},
			{"gemmShared", func(c []T) { gemmShared(&q, c, x, y, kern, 3, false) }},
			{"gemmShared on one core", func(c []T) { gemmShared(&q, c, x, y, kern, 1, false) }},
		}
		for _, w := range ways {
			got := make([]T, len(want))
			for i := range got {
				got[i] = T(math.NaN())
			}
			w.run(got)
			if !sameBits(got, want) {
				t.Fatalf("%+v %d×%d transposed %v: %s gives other bits than the plain product", s, kern.mr, kern.nr, tr, w.name)
			}
		}
	}
}

// flipped is the transpose of x, rows×cols.
func flipped[T float](x []T, rows, cols int) []T {
	y := make([]T, len(x))
	for i := range rows {
		for j := range cols {
			y[j*rows+i] = x[i*cols+j]
		}
	}
	return y
}
