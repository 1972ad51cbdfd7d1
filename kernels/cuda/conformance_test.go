//go:build cgo && linux

package cuda

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/kernelstest"
)

func TestConformance(t *testing.T) {
	b := newBackend(t)
	t.Logf("%s, compute capability %d.%d, %d SMs, NVRTC %d.%d, driver %d", b.Name(), b.major, b.minor, b.sms, nvrtcMajor, nvrtcMinor, driverVersion())
	// Every op of the movement, indexing, norm, creation, pooling and
	// loss lists runs here in every dtype it accepts: none may be
	// declined. Convolutions decline float16 and bfloat16.
	var ops []string
	for _, l := range [][]string{kernels.Movement, kernels.Indexing, kernels.Norms, kernels.Creation, kernels.Pools, kernels.Losses} {
		ops = append(ops, l...)
	}
	kernelstest.RunAll(t, b, kernelstest.Require(ops...))
}
