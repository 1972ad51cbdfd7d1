//go:build cgo && linux

package worker_test

import (
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/kernels/cuda"
	"github.com/jetfabric/jetfabric/worker"
)

func init() { benchGPU = gpuDevice }

// gpuDevice is the worker device of CUDA device 0, closed with tb; false
// without a driver.
func gpuDevice(tb testing.TB) (worker.Device, bool) {
	g, err := cuda.New(0, cuda.WithCacheDir(tb.TempDir()))
	if errors.Is(err, cuda.ErrNoGPU) || errors.Is(err, cuda.ErrNoCompiler) {
		return worker.Device{}, false
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = g.Close() })
	return worker.Device{Name: "gpu-0", Kind: "gpu", Backend: g}, true
}
