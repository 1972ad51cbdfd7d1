package cuda

import (
	"fmt"
	"strings"

	"github.com/jetfabric/jetfabric/kernels"
)

// normSpec is layer_norm or rms_norm: one block per normalised row of g
// elements, summing in float64 as the CPU does (in a tree, not in its
// order); weight and bias broadcast to the input through strides.
type normSpec struct {
	dt         kernels.DType
	rms        bool
	rank       int
	hasW, hasB bool
}

func (s normSpec) key() string {
	return fmt.Sprintf("norm|%v|%v|%d|%v|%v", s.dt, s.rms, s.rank, s.hasW, s.hasB)
}

// source: parameters (y, x, w, bias, rows, g, eps, then per axis k:
// shape_k, wstride_k, bstride_k); w and bias may be null when absent.
func (s normSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	st := cStore(s.dt)
	ld := func(v string) string { return "(double)" + cLoad(s.dt, v) }
	b.WriteString(`__device__ __forceinline__ double jf_block_sum(double v, double* sh) {
	sh[threadIdx.x] = v;
	__syncthreads();
	for (int h = blockDim.x / 2; h > 0; h >>= 1) {
		if (threadIdx.x < h) sh[threadIdx.x] += sh[threadIdx.x + h];
		__syncthreads();
	}
	const double r = sh[0];
	__syncthreads();
	return r;
}
`)
	p := []string{st + "* __restrict__ y", "const " + st + "* __restrict__ x", "const " + st + "* __restrict__ w", "const " + st + "* __restrict__ bias", "i64 rows", "i64 g", "double eps"}
	for k := range s.rank {
		p = append(p, fmt.Sprintf("i64 n%d", k), fmt.Sprintf("i64 w%d", k), fmt.Sprintf("i64 b%d", k))
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(p, ", "))
	fmt.Fprintf(&b, "\t__shared__ double sh[%d];\n", blockSize)
	b.WriteString("\tfor (i64 row = blockIdx.x; row < rows; row += gridDim.x) {\n")
	b.WriteString("\t\tconst i64 base = row * g;\n\t\tdouble mean = 0.0;\n")
	loop := fmt.Sprintf("for (i64 t = threadIdx.x; t < g; t += %d)", blockSize)
	if !s.rms {
		fmt.Fprintf(&b, "\t\t{ double a = 0.0; %s a += %s; mean = jf_block_sum(a, sh) / (double)g; }\n", loop, ld("x[base + t]"))
	}
	fmt.Fprintf(&b, "\t\tdouble q = 0.0;\n\t\t%s { const double d = %s - mean; q += d * d; }\n", loop, ld("x[base + t]"))
	b.WriteString("\t\tconst double rstd = 1.0 / sqrt(jf_block_sum(q, sh) / (double)g + eps);\n")
	fmt.Fprintf(&b, "\t\t%s {\n", loop)
	b.WriteString("\t\t\tconst i64 e = base + t;\n")
	fmt.Fprintf(&b, "\t\t\tdouble r = (%s - mean) * rstd;\n", ld("x[e]"))
	if s.hasW || s.hasB {
		b.WriteString("\t\t\ti64 rr = e, wo = 0, bo = 0;\n")
		for k := s.rank - 1; k >= 0; k-- {
			fmt.Fprintf(&b, "\t\t\t{ const i64 qq = rr / n%[1]d, c = rr - qq * n%[1]d; wo += c * w%[1]d; bo += c * b%[1]d; rr = qq; }\n", k)
		}
	}
	if s.hasW {
		fmt.Fprintf(&b, "\t\t\tr *= %s;\n", ld("w[wo]"))
	}
	if s.hasB {
		fmt.Fprintf(&b, "\t\t\tr += %s;\n", ld("bias[bo]"))
	}
	fmt.Fprintf(&b, "\t\t\ty[e] = %s;\n\t\t}\n\t}\n}\n", cStoreConv(s.dt, cFromDouble(s.dt, "r")))
	return b.String()
}
