//go:build amd64 && !purego

package cpu

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// TestGemmAVXMatchesPureGo compares the assembly path with the pure-Go
// packed product and a float64 reference on many odd shapes, with and
// without broadcast batch dims.
func TestGemmAVXMatchesPureGo(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no AVX2 and FMA")
	}
	r := rand.New(rand.NewPCG(11, 12))
	type shape struct {
		m, k, n int
		ab, bb  []int // batch dims of A and B
	}
	var shapes []shape
	for range 400 {
		shapes = append(shapes, shape{m: 1 + r.IntN(70), k: 1 + r.IntN(70), n: 1 + r.IntN(70)})
	}
	for _, s := range [][3]int{
		{1, 1, 1}, {6, 1, 16}, {7, 3, 17}, {70, 70, 70}, {5, 9, 15},
		{193, 257, 513}, {200, 600, 530}, {385, 513, 100}, {6, 1000, 16}, {37, 256, 1030},
	} {
		shapes = append(shapes, shape{m: s[0], k: s[1], n: s[2]})
	}
	shapes = append(shapes,
		shape{m: 13, k: 29, n: 37, ab: []int{3}, bb: []int{3}},
		shape{m: 50, k: 300, n: 70, ab: []int{2, 1}, bb: []int{3}},
		shape{m: 9, k: 20, n: 33, ab: []int{1}, bb: []int{4, 2}},
		shape{m: 64, k: 64, n: 64, bb: []int{5}},
	)
	for _, s := range shapes {
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
		p := mm{m: s.m, k: s.k, n: s.n}
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
		a, b := make([]float32, na), make([]float32, nbB)
		for i := range a {
			a[i] = r.Float32()*2 - 1
		}
		for i := range b {
			b[i] = r.Float32()*2 - 1
		}
		nc := p.batch.n * s.m * s.n
		got, pure := make([]float32, nc), make([]float32, nc)
		for i := range got {
			got[i], pure[i] = float32(math.NaN()), float32(math.NaN())
		}
		gemmAVX(p, got, a, b)
		gemmTiled(p, pure, a, b, micro2x4)
		for bi := range p.batch.n {
			oa, ob, oc := p.offsets(bi)
			for i := range s.m {
				for j := range s.n {
					var want, mag float64
					for q := range s.k {
						x := float64(a[oa+i*s.k+q]) * float64(b[ob+q*s.n+j])
						want += x
						mag += math.Abs(x)
					}
					tol := 2*float64(s.k)*0x1p-24*mag + 1e-30
					g, pg := float64(got[oc+i*s.n+j]), float64(pure[oc+i*s.n+j])
					if !(math.Abs(g-want) <= tol) || !(math.Abs(g-pg) <= 2*tol) {
						t.Fatalf("%+v batch %d (%d,%d): assembly %v, pure Go %v, float64 %v",
							s, bi, i, j, g, pg, want)
					}
				}
			}
		}
	}
}

// TestGemmAVXSameBitsOnAnyCores: the tiling of the assembly path follows
// GOMAXPROCS, the bits must not.
func TestGemmAVXSameBitsOnAnyCores(t *testing.T) {
	if !hasAVX2FMA {
		t.Skip("no AVX2 and FMA")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	r := rand.New(rand.NewPCG(13, 14))
	for _, s := range [][3]int{{193, 257, 513}, {101, 600, 77}, {64, 1000, 1100}, {7, 300, 900}} {
		m, k, n := s[0], s[1], s[2]
		p := mm{m: m, k: k, n: n}
		p.batch, _ = newBcast(nil, nil, nil)
		a, b := make([]float32, m*k), make([]float32, k*n)
		for i := range a {
			a[i] = r.Float32()*2 - 1
		}
		for i := range b {
			b[i] = r.Float32()*2 - 1
		}
		var first []float32
		for _, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			c := make([]float32, m*n)
			gemmAVX(p, c, a, b)
			if first == nil {
				first = c
			} else if !slices.EqualFunc(first, c, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) }) {
				t.Errorf("%v: GOMAXPROCS=%d gives different bits than GOMAXPROCS=1", s, procs)
			}
		}
	}
}
