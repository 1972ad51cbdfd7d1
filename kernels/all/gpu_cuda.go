//go:build cgo && linux

package all

import (
	"errors"
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cuda"
)

// GPUSupport reports whether this build carries the CUDA backend.
const GPUSupport = true

// GPUCount is the number of CUDA devices; errors wrap ErrNoGPU where no
// driver is found.
func GPUCount() (int, error) {
	n, err := cuda.DeviceCount()
	if err != nil {
		return 0, wrap(err)
	}
	return n, nil
}

// OpenGPU opens CUDA device ordinal. Errors wrap ErrNoGPU where there is no
// driver or no such device, and the CUDA backend's errors otherwise. The
// backend has Close and ExecFused.
func OpenGPU(ordinal int, opts ...GPUOption) (kernels.Backend, error) {
	var o gpuOptions
	for _, opt := range opts {
		opt(&o)
	}
	b, err := cuda.New(ordinal, cuda.WithTF32(o.tf32), cuda.WithChains(!o.noChains))
	if err != nil {
		return nil, wrap(err)
	}
	return b, nil
}

func wrap(err error) error {
	if errors.Is(err, cuda.ErrNoGPU) {
		return fmt.Errorf("%w: %w", ErrNoGPU, err)
	}
	return err
}
