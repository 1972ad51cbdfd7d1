package cpu

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execPermute, 1, kernels.OpPermute)
}

func execPermute(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	r := len(x.Shape)
	if y.DType != x.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	if len(op.Perm) != r || len(y.Shape) != r {
		return fmt.Errorf("%w: cpu: permute of rank %d with perm %v to output %v", kernels.ErrAttr, r, op.Perm, y.Shape)
	}
	var perm [maxRank]int
	var seen uint64
	for i, p := range op.Perm {
		if p < 0 {
			p += r
		}
		if p < 0 || p >= r || seen&(1<<p) != 0 {
			return fmt.Errorf("%w: cpu: %v is not a permutation of %d axes", kernels.ErrAttr, op.Perm, r)
		}
		seen |= 1 << p
		perm[i] = p
		if y.Shape[i] != x.Shape[p] {
			return shapeErr(op, "output %v is not input %v permuted by %v", y.Shape, x.Shape, op.Perm)
		}
	}
	permuteBytes(data(y), data(x), x.DType.Size(), x.Shape, perm[:r])
	return nil
}

// permuteBytes writes into dst the elements of src, of esize bytes and
// shape shape, with the axes reordered: output axis i is input axis perm[i].
func permuteBytes(dst, src []byte, esize int, shape, perm []int) {
	var st [maxRank]int // input strides in elements
	s := 1
	for j := len(shape) - 1; j >= 0; j-- {
		st[j] = s
		s *= shape[j]
	}
	n := s
	if n == 0 {
		return
	}
	// Output dims with their input strides, unit dims dropped, merged
	// where the input is contiguous across them.
	var od, os [maxRank]int
	r := 0
	for _, p := range perm {
		d := shape[p]
		if d == 1 {
			continue
		}
		if r > 0 && os[r-1] == st[p]*d {
			od[r-1] *= d
			os[r-1] = st[p]
			continue
		}
		od[r], os[r] = d, st[p]
		r++
	}
	if r == 0 || r == 1 && os[0] == 1 {
		parallelCopy(dst[:n*esize], src[:n*esize])
		return
	}
	if r == 1 { // cannot happen after merging, but be safe
		od[1], os[1] = od[0], os[0]
		od[0], os[0] = 1, 0
		r = 2
	}
	t := transpose{rank: r, od: od, os: os, n: n}
	switch esize {
	case 1:
		permuteRun(&t, view[uint8](dst, n), view[uint8](src, n))
	case 2:
		permuteRun(&t, view[uint16](dst, n), view[uint16](src, n))
	case 4:
		permuteRun(&t, view[uint32](dst, n), view[uint32](src, n))
	case 8:
		permuteRun(&t, view[uint64](dst, n), view[uint64](src, n))
	}
}

// transpose is a permutation as output dims od with input strides os.
type transpose struct {
	rank   int
	od, os [maxRank]int
	n      int
}

// tile is the side of the square blocks a transpose copies, so that both
// the rows read and the rows written stay in cache.
const tile = 32

func permuteRun[T any](t *transpose, dst, src []T) {
	r := t.rank
	d0, d1 := t.od[r-2], t.od[r-1]
	blocks := (d0 + tile - 1) / tile
	tasks := t.n / (d0 * d1) * blocks
	if w := split(tasks, t.n/max(tasks, 1)); w > 1 {
		tt := *t
		parallel(tasks, w, func(lo, hi int) { permuteTasks(&tt, dst, src, lo, hi) })
		return
	}
	permuteTasks(t, dst, src, 0, tasks)
}

// permuteTasks copies tasks [lo, hi): task i is block i%blocks of rows of
// the last two output dims, for outer index i/blocks.
func permuteTasks[T any](t *transpose, dst, src []T, lo, hi int) {
	r := t.rank
	d0, d1 := t.od[r-2], t.od[r-1]
	s0, s1 := t.os[r-2], t.os[r-1]
	blocks := (d0 + tile - 1) / tile
	for task := lo; task < hi; task++ {
		outer, blk := task/blocks, task%blocks
		base := 0
		rem := outer
		for j := r - 3; j >= 0; j-- {
			base += rem % t.od[j] * t.os[j]
			rem /= t.od[j]
		}
		i0, i1 := blk*tile, min(blk*tile+tile, d0)
		o := outer * d0 * d1
		if s1 == 1 {
			for i := i0; i < i1; i++ {
				copy(dst[o+i*d1:o+(i+1)*d1], src[base+i*s0:base+i*s0+d1])
			}
			continue
		}
		if s0 == 1 && i1-i0 == tile {
			transposeRows(dst[o:], src[base:], i0, d1, s1)
			continue
		}
		for j0 := 0; j0 < d1; j0 += tile {
			j1 := min(j0+tile, d1)
			for i := i0; i < i1; i++ {
				row := dst[o+i*d1+j0 : o+i*d1+j1]
				si := base + i*s0 + j0*s1
				for j := range row {
					row[j] = src[si]
					si += s1
				}
			}
		}
	}
}

// transposeRows writes rows [i0, i0+tile) of dst (row length d1) from the
// columns i0.. of src (row length s1): dst[i][j] = src[j][i]. It moves
// 4×4 blocks through registers, reading four source rows and writing four
// destination rows at a time.
func transposeRows[T any](dst, src []T, i0, d1, s1 int) {
	for i := i0; i < i0+tile; i += 4 {
		j := 0
		for ; j+4 <= d1; j += 4 {
			a := src[j*s1+i : j*s1+i+4 : j*s1+i+4]
			b := src[(j+1)*s1+i : (j+1)*s1+i+4 : (j+1)*s1+i+4]
			c := src[(j+2)*s1+i : (j+2)*s1+i+4 : (j+2)*s1+i+4]
			d := src[(j+3)*s1+i : (j+3)*s1+i+4 : (j+3)*s1+i+4]
			r0 := dst[i*d1+j : i*d1+j+4 : i*d1+j+4]
			r1 := dst[(i+1)*d1+j : (i+1)*d1+j+4 : (i+1)*d1+j+4]
			r2 := dst[(i+2)*d1+j : (i+2)*d1+j+4 : (i+2)*d1+j+4]
			r3 := dst[(i+3)*d1+j : (i+3)*d1+j+4 : (i+3)*d1+j+4]
			r0[0], r0[1], r0[2], r0[3] = a[0], b[0], c[0], d[0]
			r1[0], r1[1], r1[2], r1[3] = a[1], b[1], c[1], d[1]
			r2[0], r2[1], r2[2], r2[3] = a[2], b[2], c[2], d[2]
			r3[0], r3[1], r3[2], r3[3] = a[3], b[3], c[3], d[3]
		}
		for ; j < d1; j++ {
			for k := i; k < i+4; k++ {
				dst[k*d1+j] = src[j*s1+k]
			}
		}
	}
}
