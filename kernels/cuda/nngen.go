package cuda

import (
	"fmt"
	"strings"

	"github.com/jetfabric/jetfabric/kernels"
)

// Convolution, pooling and cross-entropy kernels. None uses atomics: each
// output element is written by one thread (or one warp) that adds its
// terms in a fixed order, so every result is the same bit for bit from
// run to run.
//
// A convolution lowers to GEMMs over an im2col matrix for a chunk of nc
// images, laid out [C][KH][KW][nc][OH*OW]: row (c, kh, kw) holds, for each
// image and output position, the input element that kernel tap meets
// (zero in the padding). A group's rows are contiguous, so group g's
// matrix is rows g*K to (g+1)*K, K = C/groups*KH*KW.

// idxType is the C type of a kernel's counts: int where every index fits,
// else i64.
func idxType(idx64 bool) string {
	if idx64 {
		return "i64"
	}
	return "int"
}

// nnHead starts a kernel: the prelude, idx_t, and the signature.
func nnHead(b *strings.Builder, idx64 bool, params []string) {
	b.WriteString(prelude)
	fmt.Fprintf(b, "typedef %s idx_t;\n", idxType(idx64))
	fmt.Fprintf(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(%s) {\n", blockSize, kernelName, strings.Join(params, ", "))
}

// gridLoop opens a grid-stride loop of i over [0, total).
func gridLoop(b *strings.Builder) {
	fmt.Fprintf(b, "\tfor (idx_t i = (idx_t)blockIdx.x * %d + (idx_t)threadIdx.x; i < total; i += (idx_t)gridDim.x * %d) {\n", blockSize, blockSize)
}

// geom is the geometry a convolution or pooling kernel is compiled for:
// every extent, stride, padding and dilation is a constant of the
// source, so that the compiler turns the index arithmetic's divisions
// into multiplications. nc is the images of an im2col chunk (0 for the
// pools).
type geom struct {
	C, H, W, KH, KW, OH, OW, SH, SW, PH, PW, DH, DW int
	nc                                              int
}

func newGeom(g *kernels.Window, nc int) geom {
	return geom{g.C, g.H, g.W, g.KH, g.KW, g.OH, g.OW, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, nc}
}

func (g geom) String() string {
	return fmt.Sprintf("%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", g.C, g.H, g.W, g.KH, g.KW, g.OH, g.OW, g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, g.nc)
}

// consts declares the geometry at the top of a kernel.
func (g geom) consts(b *strings.Builder) {
	fmt.Fprintf(b, "\tconst idx_t C = %d, H = %d, W = %d, KH = %d, KW = %d, OH = %d, OW = %d;\n", g.C, g.H, g.W, g.KH, g.KW, g.OH, g.OW)
	fmt.Fprintf(b, "\tconst idx_t sh = %d, sw = %d, ph = %d, pw = %d, dh = %d, dw = %d, nc = %d;\n", g.SH, g.SW, g.PH, g.PW, g.DH, g.DW, max(g.nc, 1))
	b.WriteString("\tconst idx_t P = OH * OW, NP = nc * P;\n")
	// Not every kernel reads every constant.
	b.WriteString("\t(void)C; (void)H; (void)W; (void)KH; (void)KW; (void)OH; (void)OW; (void)sh; (void)sw; (void)ph; (void)pw; (void)dh; (void)dw; (void)nc; (void)P; (void)NP;\n")
}

// im2colSpec writes the im2col matrix of nc images, element by element
// (one thread per element, moving bytes: any dtype of the size).
type im2colSpec struct {
	size  int
	idx64 bool
	g     geom
}

func (s im2colSpec) key() string { return fmt.Sprintf("im2col|%d|%v|%v", s.size, s.idx64, s.g) }

// source: parameters (col, x, total), total = C*KH*KW*nc*P.
func (s im2colSpec) source() string {
	var b strings.Builder
	t := elemType(s.size)
	nnHead(&b, s.idx64, []string{t + "* __restrict__ col", "const " + t + "* __restrict__ x", "idx_t total"})
	s.g.consts(&b)
	gridLoop(&b)
	b.WriteString(`		idx_t q = i / P;
		const idx_t p = i - q * P;
		const idx_t n = q % nc; q /= nc;
		const idx_t kw = q % KW; q /= KW;
		const idx_t kh = q % KH;
		const idx_t c = q / KH;
		const idx_t oh = p / OW, ow = p - oh * OW;
		const idx_t h = oh * sh - ph + kh * dh, w = ow * sw - pw + kw * dw;
`)
	fmt.Fprintf(&b, "\t\tcol[i] = (h >= 0 && h < H && w >= 0 && w < W) ? x[((n * C + c) * H + h) * W + w] : (%s)0;\n\t}\n}\n", t)
	return b.String()
}

// rowsSpec moves dy[n][o][p] of m images to [o][n][p]: one block per row
// of P elements at a time.
type rowsSpec struct{ size int }

func (s rowsSpec) key() string { return fmt.Sprintf("rows|%d", s.size) }

// source: parameters (dst, src, rows, O, m, P), rows = m*O.
func (s rowsSpec) source() string {
	var b strings.Builder
	t := elemType(s.size)
	nnHead(&b, true, []string{t + "* __restrict__ dst", "const " + t + "* __restrict__ src", "i64 rows", "i64 O", "i64 m", "i64 P"})
	fmt.Fprintf(&b, `	for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
		const i64 n = r / O, o = r - n * O;
		const %[1]s* s = src + r * P;
		%[1]s* d = dst + (o * m + n) * P;
		for (i64 p = threadIdx.x; p < P; p += %[2]d) d[p] = s[p];
	}
}
`, t, blockSize)
	return b.String()
}

// nnAcc is the type a kernel of dt sums in: float for float32, float16
// and bfloat16, double for float64.
func nnAcc(dt kernels.DType) string {
	if dt == kernels.Float64 {
		return "double"
	}
	return "float"
}

// col2imSpec is the gather that turns the gradient of an im2col matrix
// into the gradient of the images: one thread per input element adds the
// matrix entries that copied it, kernel taps in row-major order.
type col2imSpec struct {
	dt    kernels.DType
	idx64 bool
	g     geom
}

func (s col2imSpec) key() string { return fmt.Sprintf("col2im|%v|%v|%v", s.dt, s.idx64, s.g) }

// source: parameters (dx, dcol, total), total = nc*C*H*W.
func (s col2imSpec) source() string {
	var b strings.Builder
	st, acc := cStore(s.dt), nnAcc(s.dt)
	nnHead(&b, s.idx64, []string{st + "* __restrict__ dx", "const " + st + "* __restrict__ dcol", "idx_t total"})
	s.g.consts(&b)
	gridLoop(&b)
	fmt.Fprintf(&b, `		idx_t q = i / W;
		const idx_t w = i - q * W;
		const idx_t h = q %% H; q /= H;
		const idx_t c = q %% C;
		const idx_t n = q / C;
		%[1]s a = 0;
		for (idx_t kh = 0; kh < KH; kh++) {
			const idx_t th = h + ph - kh * dh;
			if (th < 0) break;
			if (th %% sh != 0) continue;
			const idx_t oh = th / sh;
			if (oh >= OH) continue;
			for (idx_t kw = 0; kw < KW; kw++) {
				const idx_t tw = w + pw - kw * dw;
				if (tw < 0) break;
				if (tw %% sw != 0) continue;
				const idx_t ow = tw / sw;
				if (ow >= OW) continue;
				a += (%[1]s)%[2]s;
			}
		}
		dx[i] = %[3]s;
	}
}
`, acc, cLoad(s.dt, "dcol[((c * KH + kh) * KW + kw) * NP + n * P + oh * OW + ow]"), cStoreConv(s.dt, "a"))
	return b.String()
}

// biasSpec adds bias[o] to every element of channel o of y[N, O, P]: one
// block per row (n, o) at a time.
type biasSpec struct {
	dt    kernels.DType
	idx64 bool
}

func (s biasSpec) key() string { return fmt.Sprintf("bias|%v|%v", s.dt, s.idx64) }

// source: parameters (y, bias, rows, P, O), rows = N*O.
func (s biasSpec) source() string {
	var b strings.Builder
	st, ct := cStore(s.dt), cCompute(s.dt)
	nnHead(&b, s.idx64, []string{st + "* __restrict__ y", "const " + st + "* __restrict__ bias", "idx_t rows", "idx_t P", "idx_t O"})
	fmt.Fprintf(&b, "\tfor (idx_t r = blockIdx.x; r < rows; r += gridDim.x) {\n")
	fmt.Fprintf(&b, "\t\tconst %s bv = (%s)%s;\n", ct, ct, cLoad(s.dt, "bias[r % O]"))
	fmt.Fprintf(&b, "\t\t%s* yp = y + r * P;\n", st)
	fmt.Fprintf(&b, "\t\tfor (idx_t p = threadIdx.x; p < P; p += %d) {\n", blockSize)
	fmt.Fprintf(&b, "\t\t\tconst %s v = (%s)%s + bv;\n", ct, ct, cLoad(s.dt, "yp[p]"))
	fmt.Fprintf(&b, "\t\t\typ[p] = %s;\n\t\t}\n\t}\n}\n", cStoreConv(s.dt, "v"))
	return b.String()
}

// maxBetter is the C condition under which v replaces best in a max
// pool window: the first maximum in row-major order wins, and the first
// NaN beats every number. found says best holds a value.
const maxBetter = "(!found || v > best || (v != v && best == best))"

// poolSpec is max_pool2d or avg_pool2d: one thread per output element.
// avg sums in double and divides by KH*KW (padding counts as zeros).
type poolSpec struct {
	dt    kernels.DType
	max   bool
	idx64 bool
	g     geom
}

func (s poolSpec) key() string { return fmt.Sprintf("pool|%v|%v|%v|%v", s.dt, s.max, s.idx64, s.g) }

// source: parameters (y, x, total), total = N*C*OH*OW.
func (s poolSpec) source() string {
	var b strings.Builder
	st, ct := cStore(s.dt), cCompute(s.dt)
	nnHead(&b, s.idx64, []string{st + "* __restrict__ y", "const " + st + "* __restrict__ x", "idx_t total"})
	s.g.consts(&b)
	gridLoop(&b)
	b.WriteString(`		idx_t q = i / OW;
		const idx_t ow = i - q * OW;
		const idx_t oh = q % OH;
		const idx_t nc = q / OH;
		const idx_t h0 = oh * sh - ph, w0 = ow * sw - pw;
`)
	fmt.Fprintf(&b, "\t\tconst %s* xp = x + (i64)nc * H * W;\n", st)
	if s.max {
		fmt.Fprintf(&b, "\t\t%s best = %s;\n\t\tbool found = false;\n", ct, infOf(ct, true))
	} else {
		b.WriteString("\t\tdouble a = 0;\n")
	}
	b.WriteString(`		for (idx_t kh = 0; kh < KH; kh++) {
			const idx_t h = h0 + kh * dh;
			if (h < 0 || h >= H) continue;
			for (idx_t kw = 0; kw < KW; kw++) {
				const idx_t w = w0 + kw * dw;
				if (w < 0 || w >= W) continue;
`)
	v := cLoad(s.dt, "xp[h * W + w]")
	if s.max {
		fmt.Fprintf(&b, "\t\t\t\tconst %s v = %s;\n\t\t\t\tif %s { best = v; found = true; }\n", ct, v, maxBetter)
	} else {
		fmt.Fprintf(&b, "\t\t\t\ta += (double)%s;\n", v)
	}
	b.WriteString("\t\t\t}\n\t\t}\n")
	if s.max {
		fmt.Fprintf(&b, "\t\ty[i] = %s;\n", cStoreConv(s.dt, "best"))
	} else {
		fmt.Fprintf(&b, "\t\ty[i] = %s;\n", cStoreConv(s.dt, cFromDouble(s.dt, "a / (double)(KH * KW)")))
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// poolGradSpec is max_pool2d_grad or avg_pool2d_grad as a gather: one
// thread per input element adds the dy of the windows that cover it (for
// max, those whose first maximum it is) in row-major order of the
// windows, as a scatter over the windows in order would.
type poolGradSpec struct {
	dt    kernels.DType
	max   bool
	idx64 bool
	g     geom
}

func (s poolGradSpec) key() string {
	return fmt.Sprintf("poolgrad|%v|%v|%v|%v", s.dt, s.max, s.idx64, s.g)
}

// source: parameters (dx, dy, x, total), total = N*C*H*W; x is null for
// avg.
func (s poolGradSpec) source() string {
	var b strings.Builder
	st, ct := cStore(s.dt), cCompute(s.dt)
	acc := nnAcc(s.dt)
	if !s.max {
		acc = "double"
	}
	nnHead(&b, s.idx64, []string{st + "* __restrict__ dx", "const " + st + "* __restrict__ dy", "const " + st + "* __restrict__ x", "idx_t total"})
	s.g.consts(&b)
	gridLoop(&b)
	fmt.Fprintf(&b, `		idx_t q = i / W;
		const idx_t w = i - q * W;
		const idx_t h = q %% H;
		const idx_t nc = q / H;
		const %[1]s* dyp = dy + (i64)nc * OH * OW;
		%[2]s a = 0;
		for (idx_t kh = KH - 1; kh >= 0; kh--) {
			const idx_t th = h + ph - kh * dh;
			if (th < 0 || th %% sh != 0) continue;
			const idx_t oh = th / sh;
			if (oh >= OH) continue;
			for (idx_t kw = KW - 1; kw >= 0; kw--) {
				const idx_t tw = w + pw - kw * dw;
				if (tw < 0 || tw %% sw != 0) continue;
				const idx_t ow = tw / sw;
				if (ow >= OW) continue;
`, st, acc)
	if s.max {
		fmt.Fprintf(&b, `				const %[1]s* xp = x + (i64)nc * H * W;
				const idx_t h0 = oh * sh - ph, w0 = ow * sw - pw;
				%[2]s best = 0;
				bool found = false;
				idx_t at = -1;
				for (idx_t ah = 0; ah < KH; ah++) {
					const idx_t hh = h0 + ah * dh;
					if (hh < 0 || hh >= H) continue;
					for (idx_t aw = 0; aw < KW; aw++) {
						const idx_t ww = w0 + aw * dw;
						if (ww < 0 || ww >= W) continue;
						const %[2]s v = %[3]s;
						if %[4]s { best = v; found = true; at = hh * W + ww; }
					}
				}
				if (at != h * W + w) continue;
`, st, ct, cLoad(s.dt, "xp[hh * W + ww]"), maxBetter)
	}
	fmt.Fprintf(&b, "\t\t\t\ta += (%s)%s;\n\t\t\t}\n\t\t}\n", acc, cLoad(s.dt, "dyp[oh * OW + ow]"))
	if s.max {
		fmt.Fprintf(&b, "\t\tdx[i] = %s;\n", cStoreConv(s.dt, "a"))
	} else {
		fmt.Fprintf(&b, "\t\tdx[i] = %s;\n", cStoreConv(s.dt, cFromDouble(s.dt, "a / (double)(KH * KW)")))
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// poolScatterSpec is max_pool2d_grad where no two windows share an
// element: one thread per window writes dy to the window's first maximum
// and zero to its other elements, as the gather would (0 + dy, so that
// -0 becomes +0). Elements outside every window are zeroed before.
type poolScatterSpec struct {
	dt    kernels.DType
	idx64 bool
	g     geom
}

func (s poolScatterSpec) key() string {
	return fmt.Sprintf("poolscatter|%v|%v|%v", s.dt, s.idx64, s.g)
}

// source: parameters (dx, dy, x, total), total = N*C*OH*OW.
func (s poolScatterSpec) source() string {
	var b strings.Builder
	st, ct, acc := cStore(s.dt), cCompute(s.dt), nnAcc(s.dt)
	nnHead(&b, s.idx64, []string{st + "* __restrict__ dx", "const " + st + "* __restrict__ dy", "const " + st + "* __restrict__ x", "idx_t total"})
	s.g.consts(&b)
	gridLoop(&b)
	fmt.Fprintf(&b, `		idx_t q = i / OW;
		const idx_t ow = i - q * OW;
		const idx_t oh = q %% OH;
		const idx_t nc = q / OH;
		const %[1]s* xp = x + nc * H * W;
		%[1]s* dxp = dx + nc * H * W;
		const idx_t h0 = oh * sh - ph, w0 = ow * sw - pw;
		%[2]s best = 0;
		bool found = false;
		idx_t at = -1;
		for (idx_t kh = 0; kh < KH; kh++) {
			const idx_t h = h0 + kh * dh;
			if (h < 0 || h >= H) continue;
			for (idx_t kw = 0; kw < KW; kw++) {
				const idx_t w = w0 + kw * dw;
				if (w < 0 || w >= W) continue;
				const %[2]s v = %[3]s;
				if %[4]s { best = v; found = true; at = h * W + w; }
			}
		}
		const %[5]s g = (%[5]s)0 + (%[5]s)%[6]s;
		for (idx_t kh = 0; kh < KH; kh++) {
			const idx_t h = h0 + kh * dh;
			if (h < 0 || h >= H) continue;
			for (idx_t kw = 0; kw < KW; kw++) {
				const idx_t w = w0 + kw * dw;
				if (w < 0 || w >= W) continue;
				dxp[h * W + w] = h * W + w == at ? %[7]s : (%[1]s)0;
			}
		}
	}
}
`, st, ct, cLoad(s.dt, "xp[h * W + w]"), maxBetter, acc, cLoad(s.dt, "dy[i]"), cStoreConv(s.dt, "g"))
	return b.String()
}

// Cross-entropy reductions.
const (
	ceNone = iota
	ceSum
	ceMean
)

// ceWarpsPerBlock: cross_entropy and its gradient give each row one warp.
const ceWarpsPerBlock = blockSize / 32

// ceSpec is cross_entropy (grad false) or cross_entropy_grad: one warp
// per row finds the row's maximum and the sum of exp(x - max) in double
// (lanes stride the row in order, then a butterfly: every lane holds the
// same bits). A target outside [0, C) sets *bad.
//
// cross_entropy with reduce none writes each loss to y; with sum or mean
// it writes them to part, which ceFinalSpec adds.
type ceSpec struct {
	dt     kernels.DType
	tgt64  bool
	reduce int
	grad   bool
}

func (s ceSpec) key() string { return fmt.Sprintf("ce|%v|%v|%d|%v", s.dt, s.tgt64, s.reduce, s.grad) }

// source: parameters (y, part, x, t, dy, bad, N, C); part is null but
// for the loss with sum or mean, dy null but for the gradient.
func (s ceSpec) source() string {
	var b strings.Builder
	st := cStore(s.dt)
	nnHead(&b, true, []string{st + "* __restrict__ y", "double* __restrict__ part", "const " + st + "* __restrict__ x",
		"const " + cIndex(s.tgt64) + "* __restrict__ t", "const " + st + "* __restrict__ dy", "u32* bad", "i64 N", "i64 C"})
	ld := func(v string) string { return "(double)" + cLoad(s.dt, v) }
	inf := infOf("double", false)
	fmt.Fprintf(&b, `	const int lane = threadIdx.x & 31;
	const double inf = %[1]s;
	for (i64 row = (i64)blockIdx.x * %[2]d + (threadIdx.x >> 5); row < N; row += (i64)gridDim.x * %[2]d) {
		const %[3]s* xr = x + row * C;
		double m = -inf;
		for (i64 j = lane; j < C; j += 32) {
			const double v = %[4]s;
			if (v > m || v != v) m = m != m ? m : v;
		}
		for (int k = 16; k > 0; k >>= 1) {
			const double o = __shfl_xor_sync(0xffffffffu, m, k);
			m = m != m ? m : (o != o ? o : fmax(m, o));
		}
		double s = 0;
		if (m == m && m != inf && m != -inf) {
			for (i64 j = lane; j < C; j += 32) s += exp(%[4]s - m);
		}
		for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
		const i64 tv = (i64)t[row];
		const bool ok = tv >= 0 && tv < C;
		if (!ok && lane == 0) *bad = 1u;
`, inf, ceWarpsPerBlock, st, ld("xr[j]"))
	if !s.grad {
		fmt.Fprintf(&b, `		if (lane == 0) {
			const double lse = (m != m || m == inf || m == -inf) ? m : m + log(s);
			const double loss = ok ? lse - %s : __longlong_as_double(0x7ff8000000000000ll);
`, ld("xr[tv]"))
		if s.reduce == ceNone {
			fmt.Fprintf(&b, "\t\t\ty[row] = %s;\n", cStoreConv(s.dt, cFromDouble(s.dt, "loss")))
		} else {
			b.WriteString("\t\t\tpart[row] = loss;\n")
		}
		b.WriteString("\t\t}\n\t}\n}\n")
		return b.String()
	}
	switch s.reduce {
	case ceNone:
		fmt.Fprintf(&b, "\t\tconst double g = %s;\n", ld("dy[row]"))
	case ceSum:
		fmt.Fprintf(&b, "\t\tconst double g = %s;\n", ld("dy[0]"))
	default:
		fmt.Fprintf(&b, "\t\tconst double g = %s / (double)N;\n", ld("dy[0]"))
	}
	fmt.Fprintf(&b, `		for (i64 j = lane; j < C; j += 32) {
			double p;
			if (m != m || m == inf) p = m != m ? m : (%[1]s == inf ? __longlong_as_double(0x7ff8000000000000ll) : 0.0);
			else if (m == -inf) p = __longlong_as_double(0x7ff8000000000000ll);
			else p = exp(%[1]s - m) / s;
			if (j == tv) p -= 1.0;
			y[row * C + j] = %[2]s;
		}
	}
}
`, ld("xr[j]"), cStoreConv(s.dt, cFromDouble(s.dt, "p * g")))
	return b.String()
}

// ceFinalSpec adds the N losses in part in one block, in a fixed order,
// and writes the sum (or the mean) to y[0].
type ceFinalSpec struct {
	dt   kernels.DType
	mean bool
}

func (s ceFinalSpec) key() string { return fmt.Sprintf("cefinal|%v|%v", s.dt, s.mean) }

// source: parameters (y, part, N).
func (s ceFinalSpec) source() string {
	var b strings.Builder
	nnHead(&b, true, []string{cStore(s.dt) + "* __restrict__ y", "const double* __restrict__ part", "i64 N"})
	div := ""
	if s.mean {
		div = " / (double)N"
	}
	fmt.Fprintf(&b, `	__shared__ double sh[%[1]d];
	double a = 0;
	for (i64 j = threadIdx.x; j < N; j += %[1]d) a += part[j];
	sh[threadIdx.x] = a;
	__syncthreads();
	for (int h = %[1]d / 2; h > 0; h >>= 1) {
		if (threadIdx.x < h) sh[threadIdx.x] += sh[threadIdx.x + h];
		__syncthreads();
	}
	if (threadIdx.x == 0) y[0] = %[2]s;
}
`, blockSize, cStoreConv(s.dt, cFromDouble(s.dt, "sh[0]"+div)))
	return b.String()
}
