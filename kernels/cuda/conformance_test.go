//go:build cgo && linux

package cuda

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels/kernelstest"
)

func TestConformance(t *testing.T) {
	b := newBackend(t)
	t.Logf("%s, compute capability %d.%d, %d SMs, NVRTC %d.%d, driver %d", b.Name(), b.major, b.minor, b.sms, nvrtcMajor, nvrtcMinor, driverVersion())
	kernelstest.RunAll(t, b)
}
