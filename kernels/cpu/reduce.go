package cpu

import (
	"fmt"
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

// red is a reduction.
type red uint8

const (
	rSum red = iota
	rMean
	rMax
	rMin
	rProd
	rArgmax
	rArgmin
	rLogsumexp
	rVar
)

var reductions = map[string]red{
	"sum": rSum, "mean": rMean, "max": rMax, "min": rMin, "prod": rProd,
	"argmax": rArgmax, "argmin": rArgmin, "logsumexp": rLogsumexp, "var": rVar,
}

func init() {
	for name, rd := range reductions {
		def(func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
			return b.reduce(rd, op, in, out)
		}, 1, name)
	}
}

// needsElements: reductions with no value over an empty axis.
func (rd red) needsElements() bool {
	return rd == rMax || rd == rMin || rd == rArgmax || rd == rArgmin
}

func (rd red) isArg() bool { return rd == rArgmax || rd == rArgmin }

func (rd red) floatOnly() bool { return rd == rLogsumexp || rd == rVar }

// columns: reductions with a kernel for reducing leading or middle axes
// in place; the others see such inputs transposed.
func (rd red) columns() bool { return rd <= rProd }

// redPlan is a reduction with unit dims dropped and adjacent dims of the
// same kind merged: sizes alternate between kept and reduced groups.
type redPlan struct {
	ng      int
	size    [maxRank]int
	reduced [maxRank]bool
	k, r    int // kept and reduced elements
}

// planReduce checks axes against x and y and plans the reduction.
func planReduce(op *kernels.Op, rd red, x, y *kernels.Tensor) (p redPlan, err error) {
	r := len(x.Shape)
	var mask uint64
	if len(op.Axes) == 0 {
		mask = 1<<r - 1
	}
	for _, a := range op.Axes {
		if a < -r || a >= r {
			return p, fmt.Errorf("%w: cpu: %s: axis %d out of range for rank %d", kernels.ErrAttr, op.Name, a, r)
		}
		if a < 0 {
			a += r
		}
		if mask&(1<<a) != 0 {
			return p, fmt.Errorf("%w: cpu: %s: axis %d repeated", kernels.ErrAttr, op.Name, a)
		}
		mask |= 1 << a
	}
	// The output shape must be the kept dims, with ones for reduced dims
	// under keepdims.
	j := 0
	p.k, p.r = 1, 1
	for i, d := range x.Shape {
		red := mask&(1<<i) != 0
		if red {
			p.r *= d
		} else {
			p.k *= d
		}
		if red && !op.Keepdims {
			continue
		}
		want := d
		if red {
			want = 1
		}
		if j >= len(y.Shape) || y.Shape[j] != want {
			return p, shapeErr(op, "reducing %v over axes %v gives output %v", x.Shape, op.Axes, y.Shape)
		}
		j++
	}
	if j != len(y.Shape) {
		return p, shapeErr(op, "reducing %v over axes %v gives output %v", x.Shape, op.Axes, y.Shape)
	}
	if rd.needsElements() && p.r == 0 && p.k != 0 {
		return p, shapeErr(op, "%s over an empty axis of %v", op.Name, x.Shape)
	}
	for i, d := range x.Shape {
		if d == 1 {
			continue
		}
		red := mask&(1<<i) != 0
		if p.ng > 0 && p.reduced[p.ng-1] == red {
			p.size[p.ng-1] *= d
			continue
		}
		p.size[p.ng], p.reduced[p.ng] = d, red
		p.ng++
	}
	return p, nil
}

func (b *Backend) reduce(rd red, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	want := x.DType
	if rd.isArg() {
		want = kernels.Int64
	}
	if y.DType != want {
		return dtypeErr(op, "output", 0, y.DType)
	}
	p, err := planReduce(op, rd, x, y)
	if err != nil {
		return err
	}
	corr := corrOf(op)
	xd, yd := data(x), data(y)
	n := x.Numel()
	var yi []int64
	if rd.isArg() {
		yi = view[int64](yd, p.k)
	}
	switch x.DType {
	case kernels.Float32:
		reduceFloat(rd, corr, &p, view[float32](xd, n), outView[float32](rd, yd, p.k), yi)
	case kernels.Float64:
		reduceFloat(rd, corr, &p, view[float64](xd, n), outView[float64](rd, yd, p.k), yi)
	case kernels.Int32:
		if rd.floatOnly() {
			return dtypeErr(op, "input", 0, x.DType)
		}
		reduceInt(rd, &p, view[int32](xd, n), outView[int32](rd, yd, p.k), yi)
	case kernels.Int64:
		if rd.floatOnly() {
			return dtypeErr(op, "input", 0, x.DType)
		}
		reduceInt(rd, &p, view[int64](xd, n), outView[int64](rd, yd, p.k), yi)
	case kernels.Uint8:
		if rd.floatOnly() {
			return dtypeErr(op, "input", 0, x.DType)
		}
		reduceInt(rd, &p, view[uint8](xd, n), outView[uint8](rd, yd, p.k), yi)
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

func outView[T any](rd red, yd []byte, k int) []T {
	if rd.isArg() {
		return nil
	}
	return view[T](yd, k)
}

// layout is how a planned reduction is run.
type layout uint8

const (
	lRows    layout = iota // [K, R]: each output reduces one contiguous row
	lColumns               // [K1, R, K2]: outputs reduce strided columns
	lOther                 // transpose to [K, R] first
)

func (p *redPlan) layout(rd red) (l layout, k1, k2 int) {
	switch {
	case p.ng == 0, p.ng == 1 && !p.reduced[0]: // nothing reduced: R is 1
		return lRows, 0, 0
	case p.reduced[p.ng-1] && p.ng <= 2:
		return lRows, 0, 0
	case !rd.columns():
	case p.ng == 2: // [R, K]
		return lColumns, 1, p.size[1]
	case p.ng == 3 && p.reduced[1]:
		return lColumns, p.size[0], p.size[2]
	}
	return lOther, 0, 0
}

// transposed copies x into scratch with the kept groups first.
func (p *redPlan) transposed(x []byte, esize int) ([]byte, *[]uint64) {
	var shape, perm [maxRank]int
	j := 0
	for i := range p.ng {
		shape[i] = p.size[i]
		if !p.reduced[i] {
			perm[j] = i
			j++
		}
	}
	for i := range p.ng {
		if p.reduced[i] {
			perm[j] = i
			j++
		}
	}
	t, h := getBytes(len(x))
	permuteBytes(t, x, esize, shape[:p.ng], perm[:p.ng])
	return t, h
}

func reduceFloat[T float](rd red, corr float64, p *redPlan, x, y []T, yi []int64) {
	if p.k == 0 {
		return
	}
	l, k1, k2 := p.layout(rd)
	switch l {
	case lOther:
		if (rd == rSum || rd == rMean) && p.ng == 3 && p.reduced[0] && !p.reduced[1] {
			// [A, K, B] summed over A and B (a convolution's bias
			// gradient): each kept row gathered a block at a time.
			sumOuterInner(rd, x, y, p.size[0], p.size[1], p.size[2])
			return
		}
		t, h := p.transposed(asBytes(x), sizeOf[T]())
		defer wordPool.Put(h)
		rowsFloat(rd, corr, view[T](t, len(x)), y, yi, p.k, p.r)
	case lRows:
		rowsFloat(rd, corr, x, y, yi, p.k, p.r)
	case lColumns:
		columns[T, float64](rd, x, y, k1, p.r, k2)
	}
}

func reduceInt[T integer](rd red, p *redPlan, x, y []T, yi []int64) {
	if p.k == 0 {
		return
	}
	l, k1, k2 := p.layout(rd)
	switch l {
	case lOther:
		t, h := p.transposed(asBytes(x), sizeOf[T]())
		defer wordPool.Put(h)
		rowsInt(rd, view[T](t, len(x)), y, yi, p.k, p.r)
	case lRows:
		rowsInt(rd, x, y, yi, p.k, p.r)
	case lColumns:
		columns[T, int64](rd, x, y, k1, p.r, k2)
	}
}

// rowsFloat reduces the k rows of length r of x.
func rowsFloat[T float](rd red, corr float64, x, y []T, yi []int64, k, r int) {
	if r == 1 && rd.columns() { // nothing to reduce
		copy(y, x[:len(y)])
		return
	}
	if w := split(k, r*rd.cost()); w > 1 && k >= w {
		parallel(k, w, func(lo, hi int) { rowsFloatRange(rd, corr, x, y, yi, r, lo, hi, false) })
		return
	}
	rowsFloatRange(rd, corr, x, y, yi, r, 0, k, k*r >= parallelMin)
}

// sumOuterInner sums (rSum) or averages (rMean) x, [a, k, b], over a and
// b. Row j of the transposed layout, x[0, j, :], x[1, j, :], ..., is
// gathered redBlock elements at a time into a scratch and summed with
// block, in the order blocked sums the transposed row: the same bits, but
// x is read once instead of copied whole first.
func sumOuterInner[T float](rd red, x, y []T, a, k, b int) {
	if w := split(k, a*b); w > 1 && k >= w {
		parallel(k, w, func(lo, hi int) { sumOuterInnerRows(rd, x, y, a, k, b, lo, hi) })
		return
	}
	sumOuterInnerRows(rd, x, y, a, k, b, 0, k)
}

// sumOuterInnerRows is sumOuterInner for kept rows [lo, hi).
func sumOuterInnerRows[T float](rd red, x, y []T, a, k, b, lo, hi int) {
	r := a * b
	h := getF64(0)
	defer f64Pool.Put(h)
	buf := packBuf[T](h, min(r, redBlock))
	for j := lo; j < hi; j++ {
		var s float64
		for q0 := 0; q0 < r; q0 += redBlock {
			n := min(redBlock, r-q0)
			for q := q0; q < q0+n; {
				i, o := q/b, q%b
				seg := min(b-o, q0+n-q)
				copy(buf[q-q0:q-q0+seg], x[(i*k+j)*b+o:])
				q += seg
			}
			v := block(buf[:n], bSum, 0)
			if q0 == 0 {
				s = v
			} else {
				s += v
			}
		}
		if rd == rMean {
			s /= float64(r)
		}
		y[j] = T(s)
	}
}

func (rd red) cost() int {
	switch rd {
	case rLogsumexp:
		return 10
	case rVar:
		return 3
	}
	return 1
}

func rowsFloatRange[T float](rd red, corr float64, x, y []T, yi []int64, r, lo, hi int, par bool) {
	for i := lo; i < hi; i++ {
		row := x[i*r : (i+1)*r]
		switch rd {
		case rSum:
			y[i] = T(blocked(row, par, bSum, 0))
		case rMean:
			y[i] = T(blocked(row, par, bSum, 0) / float64(r))
		case rProd:
			y[i] = T(blockedProd(row))
		case rMax:
			y[i] = maxF(row)
		case rMin:
			y[i] = minF(row)
		case rArgmax:
			yi[i] = argF(row, true)
		case rArgmin:
			yi[i] = argF(row, false)
		case rLogsumexp:
			m := float64(maxF(row))
			if r == 0 || math.IsInf(m, 0) || m != m {
				y[i] = T(m)
				if r == 0 {
					y[i] = T(math.Inf(-1))
				}
				continue
			}
			y[i] = T(m + math.Log(blocked(row, par, bExp, m)))
		case rVar:
			mean := blocked(row, par, bSum, 0) / float64(r)
			ss := blocked(row, par, bSqDev, mean)
			d := float64(r) - corr
			if d <= 0 {
				y[i] = T(math.NaN())
				continue
			}
			y[i] = T(ss / d)
		}
	}
}

// redBlock is the block size of float sums: each block is summed alone and
// the partial sums added in order, whatever the number of cores.
const redBlock = 4096

// What blocked sums over each block.
const (
	bSum   = iota // the elements
	bExp          // exp(x - c)
	bSqDev        // (x - c)²
)

// blocked is the sum of a function of x's elements (kind, with constant c)
// taken over blocks of redBlock elements whose sums are added in order; the
// blocks are computed in parallel when par is set and x is long.
func blocked[T float](x []T, par bool, kind int, c float64) float64 {
	nb := (len(x) + redBlock - 1) / redBlock
	if !par || nb < 4 {
		if len(x) <= redBlock {
			return block(x, kind, c)
		}
		s := block(x[:redBlock], kind, c)
		for lo := redBlock; lo < len(x); lo += redBlock {
			s += block(x[lo:min(lo+redBlock, len(x))], kind, c)
		}
		return s
	}
	pp := getF64(nb)
	defer f64Pool.Put(pp)
	parts := *pp
	parallel(nb, split(nb, redBlock), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			parts[i] = block(x[i*redBlock:min((i+1)*redBlock, len(x))], kind, c)
		}
	})
	s := parts[0]
	for _, v := range parts[1:] {
		s += v
	}
	return s
}

func block[T float](x []T, kind int, c float64) float64 {
	switch kind {
	case bExp:
		return expBlock(x, c)
	case bSqDev:
		return sqDevBlock(x, c)
	}
	return sumBlock(x, c)
}

// sumBlock sums x in float64 with four chains of pairs: few enough
// registers that none spills, enough chains to hide the adds' latency.
func sumBlock[T float](x []T, _ float64) float64 {
	var s0, s1, s2, s3 float64
	for len(x) >= 8 {
		s0 += float64(x[0]) + float64(x[4])
		s1 += float64(x[1]) + float64(x[5])
		s2 += float64(x[2]) + float64(x[6])
		s3 += float64(x[3]) + float64(x[7])
		x = x[8:]
	}
	for _, v := range x {
		s0 += float64(v)
	}
	return (s0 + s1) + (s2 + s3)
}

func expBlock[T float](x []T, m float64) float64 {
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	return s
}

func sqDevBlock[T float](x []T, mean float64) float64 {
	var s0, s1 float64
	i := 0
	for ; i+2 <= len(x); i += 2 {
		d0, d1 := float64(x[i])-mean, float64(x[i+1])-mean
		s0 += d0 * d0
		s1 += d1 * d1
	}
	if i < len(x) {
		d := float64(x[i]) - mean
		s0 += d * d
	}
	return s0 + s1
}

// blockedProd is the product of x in float64, by blocks multiplied in order.
func blockedProd[T float](x []T) float64 {
	p := 1.0
	for lo := 0; lo < len(x); lo += redBlock {
		q := 1.0
		for _, v := range x[lo:min(lo+redBlock, len(x))] {
			q *= float64(v)
		}
		p *= q
	}
	return p
}

// maxF is the largest element, NaN if any is NaN.
func maxF[T float](x []T) T {
	if len(x) == 0 {
		return T(math.Inf(-1))
	}
	m := x[0]
	for _, v := range x {
		if v > m || v != v {
			m = v
			if v != v {
				return v
			}
		}
	}
	return m
}

// minF is the smallest element, NaN if any is NaN.
func minF[T float](x []T) T {
	if len(x) == 0 {
		return T(math.Inf(1))
	}
	m := x[0]
	for _, v := range x {
		if v < m || v != v {
			m = v
			if v != v {
				return v
			}
		}
	}
	return m
}

// argF is the index of the first largest (or smallest) element; a NaN
// counts as beyond every number, so the first NaN wins.
func argF[T float](x []T, largest bool) int64 {
	if len(x) == 0 {
		return 0
	}
	m, at := x[0], 0
	if m != m {
		return 0
	}
	for i, v := range x {
		if v != v {
			return int64(i)
		}
		if largest && v > m || !largest && v < m {
			m, at = v, i
		}
	}
	return int64(at)
}

// rowsInt reduces the k rows of length r of x.
func rowsInt[T integer](rd red, x, y []T, yi []int64, k, r int) {
	if r == 1 && rd.columns() { // nothing to reduce
		copy(y, x)
		return
	}
	if w := split(k, r); w > 1 && k >= w {
		parallel(k, w, func(lo, hi int) { rowsIntRange(rd, x, y, yi, r, lo, hi) })
		return
	}
	rowsIntRange(rd, x, y, yi, r, 0, k)
}

func rowsIntRange[T integer](rd red, x, y []T, yi []int64, r, lo, hi int) {
	for i := lo; i < hi; i++ {
		row := x[i*r : (i+1)*r]
		switch rd {
		case rSum:
			var s int64
			for _, v := range row {
				s += int64(v)
			}
			y[i] = T(s)
		case rMean:
			var s int64
			for _, v := range row {
				s += int64(v)
			}
			if r > 0 {
				s /= int64(r)
			}
			y[i] = T(s)
		case rProd:
			p := int64(1)
			for _, v := range row {
				p *= int64(v)
			}
			y[i] = T(p)
		case rMax:
			m := row[0]
			for _, v := range row {
				m = max(m, v)
			}
			y[i] = m
		case rMin:
			m := row[0]
			for _, v := range row {
				m = min(m, v)
			}
			y[i] = m
		case rArgmax, rArgmin:
			m, at := row[0], 0
			for j, v := range row {
				if rd == rArgmax && v > m || rd == rArgmin && v < m {
					m, at = v, j
				}
			}
			yi[i] = int64(at)
		}
	}
}

// Column reductions ([K1, R, K2], reducing R) run as tasks over fixed
// blocks of colRows rows and colCols columns, each reading whole row
// segments and writing partial results, combined afterwards in block
// order: the blocks depend only on the shape, so the result does not
// depend on the number of cores.
const (
	colRows = 256
	colCols = 4096
)

// columns reduces x of shape [k1, r, k2] over r, accumulating in A.
func columns[T number, A float64 | int64](rd red, x, y []T, k1, r, k2 int) {
	nrb := max(1, (r+colRows-1)/colRows)
	nck := (k2 + colCols - 1) / colCols
	h := getF64(k1 * nrb * k2)
	defer f64Pool.Put(h)
	part := view[A](asBytes(*h), k1*nrb*k2)
	tasks := k1 * nck * nrb
	if w := split(tasks, min(r, colRows)*min(k2, colCols)); w > 1 {
		parallel(tasks, w, func(lo, hi int) { columnBlocks(rd, x, part, lo, hi, r, k2) })
	} else {
		columnBlocks(rd, x, part, 0, tasks, r, k2)
	}
	// Combine the row blocks in order.
	for o := range k1 {
		acc := part[o*nrb*k2 : o*nrb*k2+k2]
		yo := y[o*k2 : o*k2+k2]
		for b := 1; b < nrb; b++ {
			combine(rd, acc, part[(o*nrb+b)*k2:(o*nrb+b+1)*k2])
		}
		var one A = 1
		if rd == rMean && (r > 0 || one/2 != 0) { // integers: the mean of nothing is 0
			for j := range acc {
				acc[j] /= A(r)
			}
		}
		for j, v := range acc {
			yo[j] = T(v)
		}
	}
}

// columnBlocks runs column tasks [lo, hi): task t reduces row block t%nrb
// of column chunk t/nrb%nck of outer block t/nrb/nck into part.
func columnBlocks[T number, A float64 | int64](rd red, x []T, part []A, lo, hi, r, k2 int) {
	nrb := max(1, (r+colRows-1)/colRows)
	nck := (k2 + colCols - 1) / colCols
	for t := lo; t < hi; t++ {
		b, c, o := t%nrb, t/nrb%nck, t/nrb/nck
		j0, j1 := c*colCols, min(c*colCols+colCols, k2)
		r0, r1 := b*colRows, min(b*colRows+colRows, r)
		acc := part[(o*nrb+b)*k2+j0 : (o*nrb+b)*k2+j1]
		rows := x[o*r*k2:]
		switch rd {
		case rMax, rMin:
			for j, v := range rows[r0*k2+j0 : r0*k2+j1] {
				acc[j] = A(v)
			}
			r0++
		case rProd:
			for j := range acc {
				acc[j] = 1
			}
		default:
			clear(acc)
		}
		for i := r0; i < r1; i++ {
			row := rows[i*k2+j0 : i*k2+j1]
			row = row[:len(acc)]
			switch rd {
			case rMax:
				for j, v := range row {
					if a := A(v); a > acc[j] || a != a {
						acc[j] = a
					}
				}
			case rMin:
				for j, v := range row {
					if a := A(v); a < acc[j] || a != a {
						acc[j] = a
					}
				}
			case rProd:
				for j, v := range row {
					acc[j] *= A(v)
				}
			default:
				n := 0
				if r32, ok := any(row).([]float32); ok {
					if a64, ok := any(acc).([]float64); ok {
						n = addWidened(a64, r32) // on vectors where the CPU has them
					}
				}
				for j, v := range row[n:] {
					acc[n+j] += A(v)
				}
			}
		}
	}
}

// combine folds the partial results q into p.
func combine[A float64 | int64](rd red, p, q []A) {
	q = q[:len(p)]
	switch rd {
	case rMax:
		for j, v := range q {
			if v > p[j] || v != v {
				p[j] = v
			}
		}
	case rMin:
		for j, v := range q {
			if v < p[j] || v != v {
				p[j] = v
			}
		}
	case rProd:
		for j, v := range q {
			p[j] *= v
		}
	default:
		for j, v := range q {
			p[j] += v
		}
	}
}

// corrOf is the divisor correction of var.
func corrOf(op *kernels.Op) float64 { return float64(op.Correction) }
