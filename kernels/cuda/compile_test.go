//go:build cgo && linux

package cuda

import (
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
		for _, name := range append(append([]string{}, kernels.Unary...), kernels.Binary...) {
			for _, shapes := range [][2][]int{{{1000}, {1000}}, {{3, 1000}, {1000}}, {{3, 1000}, {}}, {{7, 1, 5}, {1, 6, 1}}, {{1000, 8}, {1000, 1}}} {
				in := []kernels.Meta{{DType: dt, Shape: shapes[0]}}
				if slices := shapes[1]; slices != nil && isBinary(name) {
					in = append(in, kernels.Meta{DType: dt, Shape: shapes[1]})
				}
				p, err := planOne(&kernels.Op{Name: name}, in)
				if err != nil {
					continue // dtype not accepted by the op
				}
				src, err := p.spec.source()
				add(p.spec.key(), src, err)
			}
		}
		for _, name := range kernels.Reductions {
			for _, c := range []struct {
				shape []int
				axes  []int
			}{{[]int{64, 1000}, []int{1}}, {[]int{1000, 64}, []int{0}}, {[]int{4, 5, 6}, []int{0, 2}}, {[]int{100000}, nil}, {[]int{100000, 64}, []int{1}}} {
				p, err := planOne(&kernels.Op{Name: name, Axes: c.axes}, []kernels.Meta{{DType: dt, Shape: c.shape}})
				if err != nil {
					t.Fatal(err)
				}
				src, err := p.spec.source()
				add(p.spec.key(), src, err)
				add(finalKey(name, dt, false), finalSource(name, dt, false), nil)
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
		p := planPermute(kernels.Meta{DType: dt, Shape: []int{3, 4, 5}}, []int{2, 0, 1}, kernels.Meta{DType: dt, Shape: []int{5, 3, 4}})
		src, err := p.spec.source()
		add(p.spec.key(), src, err)
		add(mmSpec{dt}.key(), mmSpec{dt}.source(), nil)
		for _, op := range []string{kernels.OpFull, kernels.OpArange, kernels.OpUniform, kernels.OpNormal} {
			g := genSpec{op: op, dt: dt}
			add(g.key(), g.source(), nil)
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
	t.Logf("%d kernels", len(srcs))
	for key, src := range srcs {
		if _, err := compileCUBIN(src, opts); err != nil {
			t.Errorf("%s: %v\n%s", key, err, src)
			return
		}
	}
}
