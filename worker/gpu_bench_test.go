//go:build cgo && linux

package worker_test

import (
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/kernels/cuda"
	"github.com/jetfabric/jetfabric/worker"
)

func init() { benchGPU = gpuOpener }

// gpuOpener returns a function that opens CUDA device 0 for one worker,
// every backend it opens sharing one kernel cache for b (kernels compile
// once), or false without a driver. The worker closes the backend when it
// stops; so does the test's cleanup, should it fail before.
func gpuOpener(b *testing.B) (func(testing.TB) worker.Device, bool) {
	dir := b.TempDir()
	g, err := cuda.New(0, cuda.WithCacheDir(dir))
	if errors.Is(err, cuda.ErrNoGPU) || errors.Is(err, cuda.ErrNoCompiler) {
		return nil, false
	}
	if err != nil {
		b.Fatal(err)
	}
	_ = g.Close()
	return func(tb testing.TB) worker.Device {
		g, err := cuda.New(0, cuda.WithCacheDir(dir))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = g.Close() })
		return worker.Device{Name: "gpu-0", Kind: "gpu", Backend: g}
	}, true
}
