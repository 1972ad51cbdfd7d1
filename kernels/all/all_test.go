package all_test

import (
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/kernels/all"
)

func TestCPU(t *testing.T) {
	if all.CPU().Name() == "" {
		t.Fatal("CPU backend has no name")
	}
}

// Without a driver (or without cgo) both GPU calls say ErrNoGPU; with one,
// device 0 opens and has a name.
func TestGPU(t *testing.T) {
	n, err := all.GPUCount()
	if err != nil {
		if !errors.Is(err, all.ErrNoGPU) {
			t.Fatalf("GPUCount: %v, want ErrNoGPU", err)
		}
		if _, err := all.OpenGPU(0); !errors.Is(err, all.ErrNoGPU) {
			t.Fatalf("OpenGPU: %v, want ErrNoGPU", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	if n == 0 {
		t.Skip("no GPU")
	}
	b, err := all.OpenGPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.(interface{ Close() error }).Close()
	t.Logf("gpu 0: %s", b.Name())
}
