package cuda

import (
	"fmt"
	"strings"

	"github.com/jetfabric/jetfabric/kernels"
)

// optimSpec is adam_step or sgd_step over n elements: one thread per
// element in a grid-stride loop, computing in float64 for f64 and in
// float32 otherwise, as the CPU does. Every output element is written
// after its inputs are read, so outputs may alias inputs.
type optimSpec struct {
	dt  kernels.DType
	sgd bool
	// sgd_step only: a momentum buffer in and out, and Nesterov.
	bufIn, bufOut, nesterov bool
}

func (s optimSpec) key() string {
	return fmt.Sprintf("optim|%v|%v|%v|%v|%v", s.dt, s.sgd, s.bufIn, s.bufOut, s.nesterov)
}

// compute is the C type of the arithmetic.
func (s optimSpec) compute() string {
	if s.dt == kernels.Float64 {
		return "double"
	}
	return "float"
}

// source: adam_step's parameters are (po, mo, vo, p, g, m, v, n, decay,
// l2, w1, b2, w2, step, bc2, eps), sgd_step's (po, bo, p, g, buf, n, lr,
// wd, mom, damp), the scalars as doubles rounded here to the compute
// type; bo and buf may be null when absent.
func (s optimSpec) source() string {
	var b strings.Builder
	b.WriteString(prelude)
	st, c := cStore(s.dt), s.compute()
	ld := func(v string) string { return "(" + c + ")" + cLoad(s.dt, v) }
	sv := func(v string) string { return cStoreConv(s.dt, v) }
	sqrt := "sqrtf"
	if c == "double" {
		sqrt = "sqrt"
	}
	var ptrs, scal []string
	if s.sgd {
		ptrs = []string{st + "* po", st + "* bo", "const " + st + "* p", "const " + st + "* g", "const " + st + "* buf"}
		scal = []string{"lr", "wd", "mom", "damp"}
	} else {
		ptrs = []string{st + "* po", st + "* mo", st + "* vo", "const " + st + "* p", "const " + st + "* g", "const " + st + "* m", "const " + st + "* v"}
		scal = []string{"decay", "l2", "w1", "b2", "w2", "step", "bc2", "eps"}
	}
	params := append(ptrs, "i64 n")
	for _, x := range scal {
		params = append(params, "double "+x+"_d")
	}
	fmt.Fprintf(&b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(params, ", "))
	for _, x := range scal {
		fmt.Fprintf(&b, "\tconst %s %s = (%s)%s_d;\n", c, x, c, x)
	}
	b.WriteString("\tfor (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {\n")
	fmt.Fprintf(&b, "\t\t%s pi = %s, gi = %s;\n", c, ld("p[i]"), ld("g[i]"))
	if s.sgd {
		b.WriteString("\t\tif (wd != 0) gi = gi + wd * pi;\n")
		if s.bufOut {
			fmt.Fprintf(&b, "\t\t%s bb = gi;\n", c)
			if s.bufIn {
				fmt.Fprintf(&b, "\t\tbb = %s * mom + damp * gi;\n", ld("buf[i]"))
			}
			if s.nesterov {
				b.WriteString("\t\tgi = gi + mom * bb;\n")
			} else {
				b.WriteString("\t\tgi = bb;\n")
			}
			fmt.Fprintf(&b, "\t\tbo[i] = %s;\n", sv("bb"))
		}
		fmt.Fprintf(&b, "\t\tpo[i] = %s;\n", sv("pi - lr * gi"))
	} else {
		fmt.Fprintf(&b, "\t\t%s mi = %s, vi = %s;\n", c, ld("m[i]"), ld("v[i]"))
		b.WriteString("\t\tif (l2 != 0) gi = gi + l2 * pi;\n")
		b.WriteString("\t\tpi = pi * decay;\n")
		fmt.Fprintf(&b, "\t\tif (w1 < (%s)0.5) mi = mi + w1 * (gi - mi); else mi = gi - (gi - mi) * ((%s)1 - w1);\n", c, c)
		b.WriteString("\t\tvi = vi * b2 + w2 * gi * gi;\n")
		fmt.Fprintf(&b, "\t\tconst %s denom = %s(vi) / bc2 + eps;\n", c, sqrt)
		fmt.Fprintf(&b, "\t\tpo[i] = %s;\n\t\tmo[i] = %s;\n\t\tvo[i] = %s;\n", sv("pi - step * (mi / denom)"), sv("mi"), sv("vi"))
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}
