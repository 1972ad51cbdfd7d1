package cuda

import (
	"fmt"
	"strings"

	"github.com/jetfabric/jetfabric/kernels"
)

// Indexing kernels. An index out of [-n, n) sets *bad; the backend reads
// it back after the launch and returns kernels.ErrIndex, as the CPU does.

// cIndex is the C type of an i32 or i64 index tensor's elements.
func cIndex(i64idx bool) string {
	if i64idx {
		return "i64"
	}
	return "int"
}

// indexPrelude defines jf_wrap: v wrapped into [0, n), or -1 (and *bad
// set) if out of range.
const indexPrelude = `__device__ __forceinline__ i64 jf_wrap(i64 v, i64 n, u32* bad) {
	if (v < -n || v >= n) { *bad = 1u; return -1; }
	return v < 0 ? v + n : v;
}
`

// gatherSpec: output element j at position p of the index's shape reads
// x at p with p[axis] replaced by the wrapped idx[j].
type gatherSpec struct {
	size       int
	idx64      bool
	rank, axis int
}

func (g gatherSpec) key() string {
	return fmt.Sprintf("gather|%d|%v|%d|%d", g.size, g.idx64, g.rank, g.axis)
}

// source: parameters (dst, src, idx, bad, n, axisN, then per axis k:
// shape_k of the index, xstride_k).
func (g gatherSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	b.WriteString(indexPrelude)
	t := elemType(g.size)
	p := []string{t + "* __restrict__ dst", "const " + t + "* __restrict__ src", "const " + cIndex(g.idx64) + "* __restrict__ idx", "u32* bad", "i64 n", "i64 axisN"}
	for k := range g.rank {
		p = append(p, fmt.Sprintf("i64 n%d", k), fmt.Sprintf("i64 s%d", k))
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(p, ", "))
	fmt.Fprintf(&b, "\tfor (i64 i = (i64)blockIdx.x * %d + threadIdx.x; i < n; i += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	b.WriteString("\t\ti64 r = i, soff = 0;\n")
	for k := g.rank - 1; k >= 0; k-- {
		if k == g.axis {
			if k == 0 {
				continue
			}
			fmt.Fprintf(&b, "\t\tr = r / n%d;\n", k)
			continue
		}
		if k == 0 {
			b.WriteString("\t\tsoff += r * s0;\n")
			continue
		}
		fmt.Fprintf(&b, "\t\t{ const i64 q = r / n%[1]d, c = r - q * n%[1]d; soff += c * s%[1]d; r = q; }\n", k)
	}
	fmt.Fprintf(&b, "\t\tconst i64 v = jf_wrap((i64)idx[i], axisN, bad);\n\t\tif (v < 0) continue;\n")
	fmt.Fprintf(&b, "\t\tdst[i] = src[soff + v * s%d];\n\t}\n}\n", g.axis)
	return b.String()
}

// selectSpec is index_select: output element (o, i, r) of shape
// (outer, k, inner) reads x at (o, wrapped idx[i], r) of (outer, n, inner).
type selectSpec struct {
	size  int
	idx64 bool
}

func (s selectSpec) key() string { return fmt.Sprintf("select|%d|%v", s.size, s.idx64) }

// source: parameters (dst, src, idx, bad, total, k, n, inner).
func (s selectSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	b.WriteString(indexPrelude)
	t := elemType(s.size)
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* __restrict__ dst, const %s* __restrict__ src, const %s* __restrict__ idx, u32* bad, i64 total, i64 k, i64 n, i64 inner) {\n",
		blockSize, kernelName, t, t, cIndex(s.idx64))
	fmt.Fprintf(&b, "\tfor (i64 e = (i64)blockIdx.x * %d + threadIdx.x; e < total; e += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	b.WriteString("\t\tconst i64 q = e / inner, r = e - q * inner, o = q / k, i = q - o * k;\n")
	b.WriteString("\t\tconst i64 v = jf_wrap((i64)idx[i], n, bad);\n\t\tif (v < 0) continue;\n")
	b.WriteString("\t\tdst[e] = src[(o * n + v) * inner + r];\n\t}\n}\n")
	return b.String()
}

// oneHotSpec: output element (j, c) is 1 where c is the wrapped idx[j].
type oneHotSpec struct {
	dt    kernels.DType
	idx64 bool
}

func (s oneHotSpec) key() string { return fmt.Sprintf("onehot|%v|%v", s.dt, s.idx64) }

// source: parameters (dst, idx, bad, total, depth).
func (s oneHotSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	b.WriteString(indexPrelude)
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s* __restrict__ dst, const %s* __restrict__ idx, u32* bad, i64 total, i64 depth) {\n",
		blockSize, kernelName, cStore(s.dt), cIndex(s.idx64))
	fmt.Fprintf(&b, "\tfor (i64 e = (i64)blockIdx.x * %d + threadIdx.x; e < total; e += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	b.WriteString("\t\tconst i64 j = e / depth, c = e - j * depth;\n")
	b.WriteString("\t\tconst i64 v = jf_wrap((i64)idx[j], depth, bad);\n")
	fmt.Fprintf(&b, "\t\tdst[e] = %s;\n\t}\n}\n", cStoreConv(s.dt, cFromDouble(s.dt, "(v == c ? 1.0 : 0.0)")))
	return b.String()
}

// scatterSpec is scatter_add, deterministic: one thread per output
// element walks the index entries that may land on it in order, so the
// sums round as the CPU's, which adds in index order.
type scatterSpec struct {
	dt         kernels.DType
	idx64      bool
	rank, axis int
}

func (s scatterSpec) key() string {
	return fmt.Sprintf("scatter|%v|%v|%d|%d", s.dt, s.idx64, s.rank, s.axis)
}

// scatterAcc is the type scatter_add sums in: float16 and bfloat16 in
// float32, as the CPU does; integers in unsigned types, wrapping.
func scatterAcc(dt kernels.DType) string {
	switch dt {
	case kernels.Float32, kernels.Float16, kernels.BFloat16:
		return "float"
	case kernels.Float64:
		return "double"
	case kernels.Int32:
		return "u32"
	case kernels.Int64:
		return "u64"
	}
	return "u8"
}

// source: parameters (y, x, idx, src, bad, n, then per axis k: yshape_k,
// ishape_k (the index's, = the source's)). The index's row-major strides
// are computed from ishape.
func (s scatterSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	b.WriteString(indexPrelude)
	st, acc := cStore(s.dt), scatterAcc(s.dt)
	p := []string{st + "* __restrict__ y", "const " + st + "* __restrict__ x", "const " + cIndex(s.idx64) + "* __restrict__ idx", "const " + st + "* __restrict__ src", "u32* bad", "i64 n"}
	for k := range s.rank {
		p = append(p, fmt.Sprintf("i64 y%d", k), fmt.Sprintf("i64 m%d", k))
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(p, ", "))
	fmt.Fprintf(&b, "\tfor (i64 i = (i64)blockIdx.x * %d + threadIdx.x; i < n; i += (i64)gridDim.x * %d) {\n", blockSize, blockSize)
	load := func(v string) string {
		switch s.dt {
		case kernels.Float16, kernels.BFloat16:
			return cLoad(s.dt, v)
		}
		return "(" + acc + ")" + v
	}
	fmt.Fprintf(&b, "\t\t%s a = %s;\n", acc, load("x[i]"))
	// Position of i in y; base offset of the matching index row; stride of
	// the index along axis.
	b.WriteString("\t\ti64 r = i, base = 0, istr = 1, astr = 1, pa = 0;\n\t\tbool in = true;\n")
	for k := s.rank - 1; k >= 0; k-- {
		fmt.Fprintf(&b, "\t\t{ const i64 q = r / y%[1]d, c = r - q * y%[1]d; r = q;\n", k)
		if k == s.axis {
			b.WriteString("\t\t  pa = c; astr = istr; ")
		} else {
			fmt.Fprintf(&b, "\t\t  if (c >= m%[1]d) in = false; base += c * istr; ", k)
		}
		fmt.Fprintf(&b, "istr *= m%d; }\n", k)
	}
	fmt.Fprintf(&b, "\t\tif (in) {\n\t\t\tfor (i64 t = 0; t < m%d; t++) {\n", s.axis)
	b.WriteString("\t\t\t\tconst i64 j = base + t * astr;\n")
	fmt.Fprintf(&b, "\t\t\t\tif (jf_wrap((i64)idx[j], y%d, bad) == pa) a += %s;\n", s.axis, load("src[j]"))
	b.WriteString("\t\t\t}\n\t\t}\n")
	switch s.dt {
	case kernels.Float16, kernels.BFloat16:
		fmt.Fprintf(&b, "\t\ty[i] = %s;\n", cStoreConv(s.dt, "a"))
	default:
		fmt.Fprintf(&b, "\t\ty[i] = (%s)a;\n", st)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}
