package cpu

import (
	"runtime"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestSetThreads: the bound holds below GOMAXPROCS, lifts at 0 or less,
// and an op split over fewer goroutines gives the same bits.
func TestSetThreads(t *testing.T) {
	defer SetThreads(0)
	n := runtime.GOMAXPROCS(0)
	SetThreads(1)
	if got := threads(); got != 1 {
		t.Errorf("SetThreads(1): threads() = %d", got)
	}
	for _, bound := range []int{n + 5, 0, -3} {
		SetThreads(bound)
		if got := threads(); got != n {
			t.Errorf("SetThreads(%d): threads() = %d, want GOMAXPROCS %d", bound, got, n)
		}
	}
	b := New()
	const m = 256
	v := make([]float64, m*m)
	for i := range v {
		v[i] = float64(i%17) * 0.25
	}
	x := progTensor(t, b, kernels.Float32, []int{m, m}, v)
	run := func() []float64 {
		out := progTensor(t, b, kernels.Float32, []int{m, m}, nil)
		if err := b.Exec(&kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x, x}, []*kernels.Tensor{out}); err != nil {
			t.Fatal(err)
		}
		return progValues(t, out)
	}
	SetThreads(0)
	all := run()
	SetThreads(1)
	if !slices.Equal(run(), all) {
		t.Error("a matmul on one goroutine differs from one over GOMAXPROCS")
	}
}
