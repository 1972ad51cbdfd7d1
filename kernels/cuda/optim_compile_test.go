//go:build cgo && linux

package cuda

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestCompileOptim compiles every variant of the optimizer kernels with
// NVRTC for Hopper. It needs only libnvrtc, no driver or GPU.
func TestCompileOptim(t *testing.T) {
	if err := loadNVRTC(); err != nil {
		t.Skip(err)
	}
	opts := []string{"--gpu-architecture=sm_90", "--fmad=false"}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
		specs := []optimSpec{{dt: dt}, {dt: dt, sgd: true}, {dt: dt, sgd: true, bufOut: true},
			{dt: dt, sgd: true, bufIn: true, bufOut: true}, {dt: dt, sgd: true, bufIn: true, bufOut: true, nesterov: true}}
		for _, s := range specs {
			if _, err := compileCUBIN(s.source(), opts); err != nil {
				t.Errorf("%s: %v\n%s", s.key(), err, s.source())
			}
		}
	}
}
