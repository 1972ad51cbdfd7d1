//go:build cgo && linux

package cuda

import (
	"errors"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestCompileGenerated compiles every kind of generated kernel with NVRTC
// for Hopper. It needs only libnvrtc, no driver or GPU.
func TestCompileGenerated(t *testing.T) {
	if err := loadNVRTC(); err != nil {
		t.Skip(err)
	}
	t.Logf("NVRTC %d.%d", nvrtcMajor, nvrtcMinor)
	opts := []string{"--gpu-architecture=sm_90", "--fmad=false"}
	srcs := map[string]string{}
	add := func(key, src string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		srcs[key] = src
	}
	dtypes := []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16, kernels.Int32, kernels.Int64, kernels.Uint8}
	for _, dt := range dtypes {
		for _, name := range append(append(append([]string{}, kernels.Unary...), kernels.Binary...), elementwiseOps[1:]...) {
			for _, shapes := range [][2][]int{{{1000}, {1000}}, {{3, 1000}, {1000}}, {{3, 1000}, {}}, {{7, 1, 5}, {1, 6, 1}}, {{1000, 8}, {1000, 1}}} {
				in := []kernels.Meta{{DType: dt, Shape: shapes[0]}, {DType: dt, Shape: shapes[1]}, {DType: dt, Shape: shapes[1]}}
				if name == "where" {
					in[0].DType = kernels.Bool
				}
				var p *ewPlan
				var err error
				for k := 1; k <= 3 && p == nil; k++ {
					p, err = planOne(&kernels.Op{Name: name}, in[:k])
				}
				if p == nil {
					if errors.Is(err, kernels.ErrNotImplemented) {
						t.Errorf("%s on %v: %v", name, dt, err)
					}
					continue // arity or dtype not accepted by the op
				}
				src, err := p.spec.source()
				if errors.Is(err, kernels.ErrNotImplemented) {
					t.Errorf("%s on %v: %v", name, dt, err)
					continue
				}
				add(p.spec.key(), src, err)
			}
		}
		for _, name := range reductionOps {
			for _, c := range []struct {
				shape []int
				axes  []int
			}{{[]int{64, 1000}, []int{1}}, {[]int{1000, 64}, []int{0}}, {[]int{4, 5, 6}, []int{0, 2}}, {[]int{100000}, nil}, {[]int{100000, 64}, []int{1}}} {
				p, err := planOne(&kernels.Op{Name: name, Axes: c.axes}, []kernels.Meta{{DType: dt, Shape: c.shape}})
				if errors.Is(err, kernels.ErrUnknownOp) || errors.Is(err, kernels.ErrDType) {
					continue // not in this op set, or not for this dtype
				}
				if err != nil {
					t.Fatal(err)
				}
				src, err := p.spec.source()
				add(p.spec.key(), src, err)
				add(finalKey(p.spec.red, false), finalSource(p.spec.red, false), nil)
			}
		}
		for _, to := range append(dtypes, kernels.Bool) {
			p, err := planOne(&kernels.Op{Name: kernels.OpCast, DType: to}, []kernels.Meta{{DType: dt, Shape: []int{10, 10}}})
			if err != nil {
				t.Fatal(err)
			}
			src, err := p.spec.source()
			add(p.spec.key(), src, err)
		}
		if dt.IsFloat() {
			for _, name := range []string{"softmax", "log_softmax"} {
				for _, axis := range []int{0, 1} {
					rp, ap, _, err := planSoftmax(&kernels.Op{Name: name, Axis: axis}, kernels.Meta{DType: dt, Shape: []int{300, 200}}, 132)
					if err != nil {
						t.Fatal(err)
					}
					for _, q := range []*ewPlan{rp, ap} {
						src, err := q.spec.source()
						add(q.spec.key(), src, err)
					}
				}
			}
		}
		p := planPermute(kernels.Meta{DType: dt, Shape: []int{3, 4, 5}}, []int{2, 0, 1}, kernels.Meta{DType: dt, Shape: []int{5, 3, 4}})
		src, err := p.spec.source()
		add(p.spec.key(), src, err)
		add(mmSpec{dt}.key(), mmSpec{dt}.source(), nil)
		for outer := range 3 {
			ts := transposeSpec{dt: dt, outer: outer}
			add(ts.key(), ts.source(), nil)
		}
		for _, op := range []string{kernels.OpFull, kernels.OpArange, kernels.OpUniform, kernels.OpNormal, kernels.OpLinspace, kernels.OpEye, kernels.OpBernoulli} {
			g := genSpec{op: op, dt: dt}
			add(g.key(), g.source(), nil)
		}
	}
	g0 := genSpec{op: kernels.OpBernoulli, dt: kernels.Bool}
	add(g0.key(), g0.source(), nil)
	for _, size := range []int{1, 2, 4, 8} {
		for _, rank := range []int{0, 1, 2, 3, 8} {
			m := moveSpec{size: size, rank: rank}
			add(m.key(), m.source(), nil)
		}
		for _, upper := range []bool{false, true} {
			t := triSpec{size: size, upper: upper}
			add(t.key(), t.source(), nil)
		}
	}
	for _, i64 := range []bool{false, true} {
		for _, size := range []int{1, 2, 4, 8} {
			add(selectSpec{size, i64}.key(), selectSpec{size, i64}.source(), nil)
			for _, ra := range [][2]int{{1, 0}, {2, 0}, {2, 1}, {3, 1}} {
				gs := gatherSpec{size: size, idx64: i64, rank: ra[0], axis: ra[1]}
				add(gs.key(), gs.source(), nil)
			}
		}
		for _, dt := range append(dtypes, kernels.Bool) {
			add(oneHotSpec{dt, i64}.key(), oneHotSpec{dt, i64}.source(), nil)
			if dt == kernels.Bool {
				continue
			}
			for _, ra := range [][2]int{{1, 0}, {2, 0}, {2, 1}, {3, 2}} {
				ss := scatterSpec{dt: dt, idx64: i64, rank: ra[0], axis: ra[1]}
				add(ss.key(), ss.source(), nil)
			}
		}
	}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
		for _, rms := range []bool{false, true} {
			for _, wb := range [][2]bool{{false, false}, {true, false}, {true, true}} {
				ns := normSpec{dt: dt, rms: rms, rank: 3, hasW: wb[0], hasB: wb[1]}
				add(ns.key(), ns.source(), nil)
			}
		}
	}
	// A fused chain ending in a reduction, with an intermediate written.
	g := benchChain(true)
	in := []kernels.Meta{{DType: kernels.Float32, Shape: []int{64, 1024}}, {DType: kernels.Float32, Shape: []int{1024}}}
	vals, err := kernels.InferFused(g, in, noLimits)
	if err != nil {
		t.Fatal(err)
	}
	p, err := planGroup(g, vals, 132)
	if err != nil {
		t.Fatal(err)
	}
	src, err := p.spec.source()
	add(p.spec.key(), src, err)
	// Compiling them all takes minutes on a small machine: by default a
	// spread of them, all with JETFABRIC_COMPILE_ALL=1.
	keys := slices.Sorted(maps.Keys(srcs))
	step := 1
	if os.Getenv("JETFABRIC_COMPILE_ALL") == "" && len(keys) > 60 {
		step = len(keys) / 60
	}
	t.Logf("%d kernels, compiling every %d", len(keys), step)
	for i := 0; i < len(keys); i += step {
		if _, err := compileCUBIN(srcs[keys[i]], opts); err != nil {
			t.Errorf("%s: %v\n%s", keys[i], err, srcs[keys[i]])
			return
		}
	}
}

// TestNVRTCHalfHeader reports whether this NVRTC compiles cuda_fp16.h and
// cuda_bf16.h from its built-in headers; the generated code needs neither.
func TestNVRTCHalfHeader(t *testing.T) {
	if err := loadNVRTC(); err != nil {
		t.Skip(err)
	}
	src := "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\nextern \"C\" __global__ void jf_k(__half* x, __nv_bfloat16* y) { x[0] = __float2half(1.5f); y[0] = __float2bfloat16(2.5f); }\n"
	_, err := compileCUBIN(src, []string{"--gpu-architecture=sm_90"})
	t.Logf("NVRTC %d.%d built-in cuda_fp16.h/cuda_bf16.h: %v", nvrtcMajor, nvrtcMinor, err == nil)
}

// TestCompileNN compiles every variant of the convolution, pooling and
// cross-entropy kernels with NVRTC for Hopper.
func TestCompileNN(t *testing.T) {
	if err := loadNVRTC(); err != nil {
		t.Skip(err)
	}
	opts := []string{"--gpu-architecture=sm_90", "--fmad=false"}
	srcs := map[string]string{}
	// The MNIST CNN's second convolution, and one with every attribute.
	gs := []geom{{32, 26, 26, 3, 3, 24, 24, 1, 1, 0, 0, 1, 1, 128}, {3, 9, 8, 3, 2, 5, 6, 2, 1, 1, 0, 1, 2, 4}}
	for k, wide := range []bool{false, true} {
		g := gs[k]
		for _, size := range []int{2, 4, 8} {
			s := im2colSpec{size: size, idx64: wide, g: g}
			srcs[s.key()] = s.source()
			srcs[rowsSpec{size}.key()] = rowsSpec{size}.source()
		}
		for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
			for _, s := range []interface {
				key() string
				source() string
			}{
				col2imSpec{dt, wide, g}, biasSpec{dt, wide},
				poolSpec{dt, false, wide, g}, poolSpec{dt, true, wide, g},
				poolGradSpec{dt, false, wide, g}, poolGradSpec{dt, true, wide, g}, poolScatterSpec{dt, wide, g},
				ceFinalSpec{dt, wide},
			} {
				srcs[s.key()] = s.source()
			}
			for reduce := range 3 {
				for _, grad := range []bool{false, true} {
					s := ceSpec{dt: dt, tgt64: wide, reduce: reduce, grad: grad}
					srcs[s.key()] = s.source()
				}
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(srcs)) {
		if _, err := compileCUBIN(srcs[k], opts); err != nil {
			t.Errorf("%s: %v\n%s", k, err, srcs[k])
			return
		}
	}
	t.Logf("%d kernels compiled", len(srcs))
}
