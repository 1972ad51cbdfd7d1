//go:build cgo && linux

package cuda

import (
	"fmt"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// deviceTime runs body reps times per b.Loop iteration between two timing
// events on the stream and returns the device milliseconds per run. body
// only queues work.
func deviceTime(tb *testing.B, be *Backend, reps int, body func() error) float64 {
	tb.Helper()
	var start, end cuEvent
	if err := be.do(func() error {
		var err error
		if start, err = eventCreate(true); err != nil {
			return err
		}
		end, err = eventCreate(true)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		_ = be.do(func() error {
			_ = eventDestroy(start)
			return eventDestroy(end)
		})
	}()
	// Warm up: compile, load, pick cuBLAS algorithms.
	for range 2 {
		if err := body(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := be.Sync(); err != nil {
		tb.Fatal(err)
	}
	n := 0
	if err := be.do(func() error { return eventRecord(start, be.stream) }); err != nil {
		tb.Fatal(err)
	}
	for tb.Loop() {
		for range reps {
			if err := body(); err != nil {
				tb.Fatal(err)
			}
			n++
		}
	}
	var ms float32
	if err := be.do(func() error {
		if err := eventRecord(end, be.stream); err != nil {
			return err
		}
		if err := eventSync(end); err != nil {
			return err
		}
		var err error
		ms, err = eventElapsed(start, end)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return float64(ms) / float64(n)
}

// fill writes normal random numbers into x on the device.
func fill(tb testing.TB, be *Backend, x *kernels.Tensor, key uint64) {
	tb.Helper()
	op := &kernels.Op{Name: kernels.OpNormal, Shape: x.Shape, DType: x.DType, Seed: 42, Key: key, Std: 1}
	if err := be.Exec(op, nil, []*kernels.Tensor{x}); err != nil {
		tb.Fatal(err)
	}
}

// elementwiseReps: runs per timed iteration, so that a few iterations
// take long enough to time.
const elementwiseReps = 10

// BenchmarkElementwise: a chain of 8 elementwise ops over 256 MiB of
// float32 (x and a scalar in, one tensor out), fused into one kernel and
// run op by op, and a device-to-device copy of the same 256 MiB in the
// same run. GB/s counts the bytes that must move: x read once and the
// result written once (for the copy: read and written once).
func BenchmarkElementwise(b *testing.B) {
	be := newBackend(b)
	const n = 64 << 20 // 256 MiB of float32
	bytes := float64(2 * 4 * n)
	x := empty(b, be, kernels.Float32, n)
	s := empty(b, be, kernels.Float32)
	fill(b, be, x, 1)
	fill(b, be, s, 2)
	g := benchChain(false)
	y := empty(b, be, kernels.Float32, n)
	report := func(b *testing.B, ms float64) {
		b.ReportMetric(bytes/(ms*1e-3)/1e9, "GB/s")
		b.ReportMetric(ms, "ms/op")
	}
	b.Run("copy", func(b *testing.B) {
		op := &kernels.Op{Name: kernels.OpReshape, Shape: []int{n}}
		ms := deviceTime(b, be, elementwiseReps, func() error { return be.Exec(op, []*kernels.Tensor{x}, []*kernels.Tensor{y}) })
		report(b, ms)
	})
	b.Run("fused8", func(b *testing.B) {
		in, out := []*kernels.Tensor{x, s}, []*kernels.Tensor{y}
		ms := deviceTime(b, be, elementwiseReps, func() error { return be.ExecFused(g, in, out) })
		report(b, ms)
	})
	b.Run("unfused8", func(b *testing.B) {
		vals := []*kernels.Tensor{x, s}
		for range g.Ops {
			vals = append(vals, empty(b, be, kernels.Float32, n))
		}
		ms := deviceTime(b, be, elementwiseReps, func() error {
			for i, op := range g.Ops {
				args := make([]*kernels.Tensor, len(op.Args))
				for k, a := range op.Args {
					args[k] = vals[a]
				}
				if err := be.Exec(&op.Op, args, []*kernels.Tensor{vals[g.Inputs+i]}); err != nil {
					return err
				}
			}
			return nil
		})
		report(b, ms)
	})
	// The same chain with a row vector broadcast (strided kernel) and
	// with a sum over rows fused at the end.
	rows := []int{n / 1024, 1024}
	xr := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: rows}, Buf: x.Buf}
	yr := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: rows}, Buf: y.Buf}
	row := empty(b, be, kernels.Float32, 1024)
	fill(b, be, row, 3)
	b.Run("fused8-rowbcast", func(b *testing.B) {
		in, out := []*kernels.Tensor{xr, row}, []*kernels.Tensor{yr}
		ms := deviceTime(b, be, elementwiseReps, func() error { return be.ExecFused(g, in, out) })
		report(b, ms)
	})
	b.Run("fused8-rowsum", func(b *testing.B) {
		gs := benchChain(true)
		gs.Results = gs.Results[:1]
		sum := empty(b, be, kernels.Float32, rows[0])
		in, out := []*kernels.Tensor{xr, row}, []*kernels.Tensor{sum}
		ms := deviceTime(b, be, elementwiseReps, func() error { return be.ExecFused(gs, in, out) })
		b.ReportMetric(float64(4*n)/(ms*1e-3)/1e9, "GB/s")
		b.ReportMetric(ms, "ms/op")
	})
}

// BenchmarkMatmul: 8192x8192x8192 products on random data; TFLOP/s
// counts 2*m*n*k.
func BenchmarkMatmul(b *testing.B) {
	const size = 8192
	plain := newBackend(b)
	tf32 := newBackend(b, WithTF32(true))
	for _, c := range []struct {
		name string
		be   *Backend
		dt   kernels.DType
	}{
		{"f32", plain, kernels.Float32},
		{"tf32", tf32, kernels.Float32},
		{"bf16", plain, kernels.BFloat16},
		{"f16", plain, kernels.Float16},
	} {
		b.Run(c.name, func(b *testing.B) {
			x := empty(b, c.be, c.dt, size, size)
			y := empty(b, c.be, c.dt, size, size)
			z := empty(b, c.be, c.dt, size, size)
			fill(b, c.be, x, 4)
			fill(b, c.be, y, 5)
			op := &kernels.Op{Name: kernels.OpMatmul}
			ms := deviceTime(b, c.be, 1, func() error { return c.be.Exec(op, []*kernels.Tensor{x, y}, []*kernels.Tensor{z}) })
			b.ReportMetric(2*size*size*size/(ms*1e-3)/1e12, "TFLOP/s")
			b.ReportMetric(ms, "ms/op")
		})
	}
}

// BenchmarkExecOverhead: a tiny op, queued and not waited for; the cost
// to the caller of one Exec.
func BenchmarkExecOverhead(b *testing.B) {
	be := newBackend(b)
	x := empty(b, be, kernels.Float32, 16)
	y := empty(b, be, kernels.Float32, 16)
	op := &kernels.Op{Name: kernels.OpNeg}
	in, out := []*kernels.Tensor{x}, []*kernels.Tensor{y}
	if err := be.Exec(op, in, out); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := be.Exec(op, in, out); err != nil {
			b.Fatal(err)
		}
	}
	if err := be.Sync(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOpChain: a chain of tiny dependent adds as a worker runs them
// (alloc the output, exec, free the input), waited for at the end: the
// sustained rate of the caller, the device thread and the GPU together,
// with and without chains of ops launched as one kernel.
func BenchmarkOpChain(b *testing.B) {
	for _, chains := range []bool{true, false} {
		b.Run(fmt.Sprintf("chains=%v", chains), func(b *testing.B) {
			be := newBackend(b, WithChains(chains))
			one := empty(b, be, kernels.Float32, 1)
			op := &kernels.Op{Name: kernels.OpAdd}
			in, out := []*kernels.Tensor{{Meta: one.Meta}, one}, []*kernels.Tensor{{Meta: one.Meta}}
			buf, err := be.Alloc(4)
			if err != nil {
				b.Fatal(err)
			}
			in[0].Buf = buf
			for b.Loop() {
				y, err := be.Alloc(4)
				if err != nil {
					b.Fatal(err)
				}
				out[0].Buf = y
				if err := be.Exec(op, in, out); err != nil {
					b.Fatal(err)
				}
				be.Free(in[0].Buf)
				in[0].Buf = y
			}
			if err := be.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			b.ReportMetric(float64(be.fusedChains), "fused-chains")
			be.Free(in[0].Buf)
		})
	}
}

// BenchmarkPermute: 256 MiB of float32 transposed (tiled), and a permute
// that keeps the generic gather; GB/s counts one read and one write.
func BenchmarkPermute(b *testing.B) {
	be := newBackend(b)
	const side = 8192
	x := empty(b, be, kernels.Float32, side, side)
	y := empty(b, be, kernels.Float32, side, side)
	fill(b, be, x, 6)
	for _, c := range []struct {
		name  string
		shape []int
		perm  []int
	}{
		{"transpose", []int{side, side}, []int{1, 0}},
		{"batched-transpose", []int{64, 1024, 1024}, []int{0, 2, 1}},
		{"gather", []int{64, 32, 32, 1024}, []int{3, 1, 0, 2}},
	} {
		b.Run(c.name, func(b *testing.B) {
			xs := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: c.shape}, Buf: x.Buf}
			outShape := make([]int, len(c.perm))
			for i, q := range c.perm {
				outShape[i] = c.shape[q]
			}
			ys := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: outShape}, Buf: y.Buf}
			op := &kernels.Op{Name: kernels.OpPermute, Perm: c.perm}
			ms := deviceTime(b, be, elementwiseReps, func() error { return be.Exec(op, []*kernels.Tensor{xs}, []*kernels.Tensor{ys}) })
			b.ReportMetric(2*4*side*side/(ms*1e-3)/1e9, "GB/s")
			b.ReportMetric(ms, "ms/op")
		})
	}
}

// BenchmarkTransfer: 64 MiB from Go memory to the device and back,
// through the pinned staging buffers, timed on the host.
func BenchmarkTransfer(b *testing.B) {
	be := newBackend(b)
	const n = 64 << 20
	host := make([]byte, n)
	for i := range host {
		host[i] = byte(i)
	}
	buf, err := be.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Free(buf)
	b.Run("upload", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			if err := be.Upload(buf, host); err != nil {
				b.Fatal(err)
			}
			if err := be.Sync(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("download", func(b *testing.B) {
		b.SetBytes(n)
		for b.Loop() {
			if err := be.Download(host, buf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkConv2D: the second convolution of the MNIST CNN at batch 128,
// x[128,32,26,26] * w[64,32,3,3] -> y[128,64,24,24], forward and both
// gradients, in float32 (with and without TF32) and float64, then its
// 2x2 max pool and the pool's gradient. TFLOP/s counts
// 2*N*O*OH*OW*C*KH*KW per convolution.
func BenchmarkConv2D(b *testing.B) {
	const n, c, h, o, k = 128, 32, 26, 64, 3
	const oh = h - k + 1
	flops := float64(2 * n * o * oh * oh * c * k * k)
	plain := newBackend(b)
	tf32 := newBackend(b, WithTF32(true))
	for _, v := range []struct {
		name string
		be   *Backend
		dt   kernels.DType
	}{
		{"f32", plain, kernels.Float32},
		{"tf32", tf32, kernels.Float32},
		{"f64", plain, kernels.Float64},
	} {
		x := empty(b, v.be, v.dt, n, c, h, h)
		w := empty(b, v.be, v.dt, o, c, k, k)
		bias := empty(b, v.be, v.dt, o)
		y := empty(b, v.be, v.dt, n, o, oh, oh)
		dy := empty(b, v.be, v.dt, n, o, oh, oh)
		dx := empty(b, v.be, v.dt, n, c, h, h)
		dw := empty(b, v.be, v.dt, o, c, k, k)
		for i, t := range []*kernels.Tensor{x, w, bias, dy} {
			fill(b, v.be, t, uint64(10+i))
		}
		for _, r := range []struct {
			name    string
			op      kernels.Op
			in, out []*kernels.Tensor
		}{
			{"fwd", kernels.Op{Name: kernels.OpConv2D}, []*kernels.Tensor{x, w}, []*kernels.Tensor{y}},
			{"fwd+bias", kernels.Op{Name: kernels.OpConv2D}, []*kernels.Tensor{x, w, bias}, []*kernels.Tensor{y}},
			{"dx", kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: x.Shape}, []*kernels.Tensor{dy, w}, []*kernels.Tensor{dx}},
			{"dw", kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: w.Shape}, []*kernels.Tensor{x, dy}, []*kernels.Tensor{dw}},
		} {
			b.Run(v.name+"/"+r.name, func(b *testing.B) {
				ms := deviceTime(b, v.be, elementwiseReps, func() error { return v.be.Exec(&r.op, r.in, r.out) })
				b.ReportMetric(flops/(ms*1e-3)/1e12, "TFLOP/s")
				b.ReportMetric(ms, "ms/op")
			})
			if v.name == "f64" || r.name == "fwd+bias" {
				continue
			}
			// Smaller chunks of images keep the im2col matrix in L2.
			for _, mib := range []int{32, 8} {
				b.Run(fmt.Sprintf("%s/%s-chunk%dMiB", v.name, r.name, mib), func(b *testing.B) {
					old := maxIm2col
					maxIm2col = mib << 20
					defer func() { maxIm2col = old }()
					ms := deviceTime(b, v.be, elementwiseReps, func() error { return v.be.Exec(&r.op, r.in, r.out) })
					b.ReportMetric(flops/(ms*1e-3)/1e12, "TFLOP/s")
					b.ReportMetric(ms, "ms/op")
				})
			}
		}
		if v.name == "f64" {
			continue
		}
		// The forward's parts: the im2col matrix, and the GEMMs on it.
		g, err := kernels.ConvWindow(&kernels.Op{Name: kernels.OpConv2D}, x.Shape, w.Shape)
		if err != nil {
			b.Fatal(err)
		}
		col := empty(b, v.be, v.dt, c*k*k, n, oh*oh)
		colB, xB, wB, yB := col.Buf.(*buffer), x.Buf.(*buffer), w.Buf.(*buffer), y.Buf.(*buffer)
		b.Run(v.name+"/fwd-im2col", func(b *testing.B) {
			ms := deviceTime(b, v.be, elementwiseReps, func() error {
				return v.be.do(func() error { return v.be.im2col(&g, 4, colB.ptr, xB.ptr, n) })
			})
			b.ReportMetric(float64(4*c*k*k*n*oh*oh)/(ms*1e-3)/1e9, "GB/s")
			b.ReportMetric(ms, "ms/op")
		})
		b.Run(v.name+"/fwd-gemm", func(b *testing.B) {
			ms := deviceTime(b, v.be, elementwiseReps, func() error {
				return v.be.do(func() error {
					h, data, compute, err := v.be.convBLAS(kernels.OpConv2D, kernels.Float32)
					if err != nil {
						return err
					}
					return gemm(h, &gemmArgs{m: oh * oh, n: o, k: c * k * k, a: colB.ptr, lda: n * oh * oh, sa: oh * oh,
						b: wB.ptr, ldb: c * k * k, c: yB.ptr, ldc: oh * oh, sc: o * oh * oh, count: n, dtype: data, compute: compute})
				})
			})
			b.ReportMetric(flops/(ms*1e-3)/1e12, "TFLOP/s")
			b.ReportMetric(ms, "ms/op")
		})
		if v.name != "f32" {
			continue
		}
		p := empty(b, v.be, v.dt, n, o, oh/2, oh/2)
		pool := kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}
		poolGrad := kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}
		b.Run("f32/maxpool", func(b *testing.B) {
			ms := deviceTime(b, v.be, elementwiseReps, func() error { return v.be.Exec(&pool, []*kernels.Tensor{y}, []*kernels.Tensor{p}) })
			b.ReportMetric(ms, "ms/op")
		})
		b.Run("f32/maxpool-grad", func(b *testing.B) {
			ms := deviceTime(b, v.be, elementwiseReps, func() error {
				return v.be.Exec(&poolGrad, []*kernels.Tensor{p, y}, []*kernels.Tensor{dy})
			})
			b.ReportMetric(ms, "ms/op")
		})
	}
}

// BenchmarkConv2DFirst: the first convolution of the MNIST CNN at batch
// 128, x[128,1,28,28] * w[32,1,3,3] -> y[128,32,26,26], forward and the
// weight gradient in float32.
func BenchmarkConv2DFirst(b *testing.B) {
	const n, h, o, k = 128, 28, 32, 3
	const oh = h - k + 1
	flops := float64(2 * n * o * oh * oh * k * k)
	be := newBackend(b)
	x := empty(b, be, kernels.Float32, n, 1, h, h)
	w := empty(b, be, kernels.Float32, o, 1, k, k)
	y := empty(b, be, kernels.Float32, n, o, oh, oh)
	dy := empty(b, be, kernels.Float32, n, o, oh, oh)
	dw := empty(b, be, kernels.Float32, o, 1, k, k)
	for i, t := range []*kernels.Tensor{x, w, dy} {
		fill(b, be, t, uint64(20+i))
	}
	for _, r := range []struct {
		name    string
		op      kernels.Op
		in, out []*kernels.Tensor
	}{
		{"fwd", kernels.Op{Name: kernels.OpConv2D}, []*kernels.Tensor{x, w}, []*kernels.Tensor{y}},
		{"dw", kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: w.Shape}, []*kernels.Tensor{x, dy}, []*kernels.Tensor{dw}},
	} {
		b.Run("f32/"+r.name, func(b *testing.B) {
			ms := deviceTime(b, be, elementwiseReps, func() error { return be.Exec(&r.op, r.in, r.out) })
			b.ReportMetric(flops/(ms*1e-3)/1e12, "TFLOP/s")
			b.ReportMetric(ms, "ms/op")
		})
	}
}

// BenchmarkTinyRoundTrip: what a worker does for a tiny op and its read
// (alloc, an add, a 4-byte download, a free), one at a time: the
// backend's part of the fabric's round trip.
func BenchmarkTinyRoundTrip(b *testing.B) {
	be := newBackend(b)
	one := tensor(b, be, kernels.Float32, []int{1}, []float64{1})
	op := &kernels.Op{Name: kernels.OpAdd}
	raw := make([]byte, 4)
	for b.Loop() {
		buf, err := be.Alloc(4)
		if err != nil {
			b.Fatal(err)
		}
		y := &kernels.Tensor{Meta: one.Meta, Buf: buf}
		if err := be.Exec(op, []*kernels.Tensor{one, one}, []*kernels.Tensor{y}); err != nil {
			b.Fatal(err)
		}
		if err := be.Download(raw, buf); err != nil {
			b.Fatal(err)
		}
		be.Free(buf)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/trip")
}
