package cpu

import (
	"slices"
	"testing"
)

// TestPermuteBlocks checks transposes large enough for the blocked paths,
// with edges that are not multiples of the blocks, against a direct
// gather.
func TestPermuteBlocks(t *testing.T) {
	cases := []struct{ shape, perm []int }{
		{[]int{70, 45}, []int{1, 0}},
		{[]int{64, 32}, []int{1, 0}},
		{[]int{33, 130}, []int{1, 0}},
		{[]int{3, 67, 66}, []int{0, 2, 1}},
		{[]int{5, 40, 3, 37}, []int{0, 3, 2, 1}},
		{[]int{6, 35, 36}, []int{2, 0, 1}},
	}
	for _, c := range cases {
		n := 1
		for _, d := range c.shape {
			n *= d
		}
		src := make([]uint32, n)
		for i := range src {
			src[i] = uint32(i)
		}
		dst := make([]uint32, n)
		permuteBytes(asBytes(dst), asBytes(src), 4, c.shape, c.perm)
		st := strides(c.shape)
		oshape := make([]int, len(c.perm))
		for i, p := range c.perm {
			oshape[i] = c.shape[p]
		}
		idx := make([]int, len(oshape))
		for o := range n {
			rem := o
			for k := len(oshape) - 1; k >= 0; k-- {
				idx[k] = rem % oshape[k]
				rem /= oshape[k]
			}
			s := 0
			for k, p := range c.perm {
				s += idx[k] * st[p]
			}
			if dst[o] != src[s] {
				t.Fatalf("permute %v by %v: element %d (%v) is %d, want %d", c.shape, c.perm, o, slices.Clone(idx), dst[o], src[s])
			}
		}
	}
}
