package cpu

// bcast is a broadcast of up to three inputs to an output shape, with unit
// dimensions dropped and adjacent dimensions merged wherever every operand
// stays contiguous across them. Strides are in elements, 0 where an input
// is broadcast. The innermost strides are always 0 or 1.
type bcast struct {
	rank  int
	n     int // output elements
	shape [maxRank]int
	st    [3][maxRank]int
}

// newBcast describes broadcasting ins to out; ok is false if some input
// does not broadcast to out.
func newBcast(out []int, ins ...[]int) (bc bcast, ok bool) {
	r := len(out)
	var full [3][maxRank]int
	for k, in := range ins {
		if len(in) > r {
			return bc, false
		}
		s := 1
		for j := len(in) - 1; j >= 0; j-- {
			o := out[r-len(in)+j]
			switch in[j] {
			case o:
				if o != 1 {
					full[k][r-len(in)+j] = s
				}
			case 1:
			default:
				return bc, false
			}
			s *= in[j]
		}
	}
	bc.n = 1
	for _, d := range out {
		bc.n *= d
	}
	// Drop unit dims, merge where contiguous for every operand.
	for j := 0; j < r; j++ {
		d := out[j]
		if d == 1 {
			continue
		}
		if bc.rank > 0 {
			p := bc.rank - 1
			merge := true
			for k := range ins {
				if bc.st[k][p] != full[k][j]*d {
					merge = false
					break
				}
			}
			if merge {
				bc.shape[p] *= d
				for k := range ins {
					bc.st[k][p] = full[k][j]
				}
				continue
			}
		}
		bc.shape[bc.rank] = d
		for k := range ins {
			bc.st[k][bc.rank] = full[k][j]
		}
		bc.rank++
	}
	return bc, true
}

// walk calls run for each innermost run of output elements [lo, hi), with
// the offset of each input's first element; run handles a run of length
// at most the innermost dimension.
func (bc *bcast) walk(lo, hi int, run func(o int, off [3]int, n int)) {
	if bc.rank == 0 {
		if lo < hi {
			run(lo, [3]int{}, hi-lo)
		}
		return
	}
	last := bc.rank - 1
	var idx [maxRank]int
	var off [3]int
	rem := lo
	for j := last; j >= 0; j-- {
		idx[j] = rem % bc.shape[j]
		rem /= bc.shape[j]
		for k := range off {
			off[k] += idx[j] * bc.st[k][j]
		}
	}
	inner := bc.shape[last]
	for o := lo; o < hi; {
		n := min(inner-idx[last], hi-o)
		run(o, off, n)
		o += n
		for k := range off {
			off[k] += n * bc.st[k][last]
		}
		idx[last] += n
		for j := last; j > 0 && idx[j] == bc.shape[j]; j-- {
			idx[j] = 0
			idx[j-1]++
			for k := range off {
				off[k] += bc.st[k][j-1] - bc.shape[j]*bc.st[k][j]
			}
		}
	}
}

// mode is how the two inputs of an innermost run advance.
type mode uint8

const (
	vv   mode = iota // both advance
	vs               // the first advances, the second is one scalar
	sv               // the first is a scalar, the second advances
	ss               // both scalars
	walk             // not a mode of a run: the operands need a broadcast walk
)

func (bc *bcast) mode() mode {
	if bc.rank == 0 {
		return ss
	}
	l := bc.rank - 1
	return mode(1-bc.st[0][l])<<1 | mode(1-bc.st[1][l])
}

// sameShape reports whether shapes a and b are equal.
func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
