package cuda

import (
	"fmt"
	"strings"
)

// Movement kernels: element copies by element size alone, so one kernel
// serves every dtype of that size.

// elemType is the C type that moves one element of size bytes.
func elemType(size int) string {
	switch size {
	case 1:
		return "u8"
	case 2:
		return "u16"
	case 4:
		return "u32"
	}
	return "u64"
}

// moveSpec is a strided copy of rank dims: output element i, at row-major
// position (p0, ..., p{r-1}) of the shape, goes to dst[dbase + Σ pk*dk]
// from src[sbase + Σ pk*sk]. Strides may be zero (expand) or negative
// (flip, negative slice steps).
type moveSpec struct {
	size int // element size in bytes
	rank int
}

func (m moveSpec) key() string { return fmt.Sprintf("move|%d|%d", m.size, m.rank) }

// source: parameters (dst, src, n, dbase, sbase, then per axis k: shape_k,
// dstride_k, sstride_k), all counts in elements.
func (m moveSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	t := elemType(m.size)
	p := []string{t + "* __restrict__ dst", "const " + t + "* __restrict__ src", "i64 n", "i64 dbase", "i64 sbase"}
	for k := range m.rank {
		p = append(p, fmt.Sprintf("i64 n%d", k), fmt.Sprintf("i64 d%d", k), fmt.Sprintf("i64 s%d", k))
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(p, ", "))
	fmt.Fprintf(&b, "\tfor (i64 i = (i64)blockIdx.x * %d + threadIdx.x; i < n; i += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	b.WriteString("\t\ti64 r = i, doff = dbase, soff = sbase;\n")
	for k := m.rank - 1; k >= 0; k-- {
		if k == 0 {
			b.WriteString("\t\tdoff += r * d0; soff += r * s0;\n")
			continue
		}
		fmt.Fprintf(&b, "\t\t{ const i64 q = r / n%[1]d, c = r - q * n%[1]d; doff += c * d%[1]d; soff += c * s%[1]d; r = q; }\n", k)
	}
	b.WriteString("\t\tdst[doff] = src[soff];\n\t}\n}\n")
	return b.String()
}

// triSpec keeps the lower (tril) or upper (triu) triangle of each matrix
// of the last two axes and zeroes the rest: zero bits are zero in every
// dtype.
type triSpec struct {
	size  int
	upper bool
}

func (t triSpec) key() string { return fmt.Sprintf("tri|%d|%v", t.size, t.upper) }

// source: parameters (dst, src, n, rows, cols, k).
func (t triSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	e := elemType(t.size)
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* dst, const %s* src, i64 n, i64 rows, i64 cols, i64 k) {\n", blockSize, kernelName, e, e)
	fmt.Fprintf(&b, "\tfor (i64 i = (i64)blockIdx.x * %d + threadIdx.x; i < n; i += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	b.WriteString("\t\tconst i64 q = i / cols, c = i - q * cols, r = q % rows;\n")
	if t.upper {
		b.WriteString("\t\tconst bool keep = c - r >= k;\n")
	} else {
		b.WriteString("\t\tconst bool keep = c - r <= k;\n")
	}
	fmt.Fprintf(&b, "\t\tdst[i] = keep ? src[i] : (%s)0;\n\t}\n}\n", e)
	return b.String()
}
