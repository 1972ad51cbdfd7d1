//go:build !(cgo && linux)

package all

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// GPUSupport reports whether this build carries the CUDA backend.
const GPUSupport = false

// GPUCount returns ErrNoGPU: this build has no GPU support.
func GPUCount() (int, error) {
	return 0, fmt.Errorf("%w: this build has no GPU support (built without cgo)", ErrNoGPU)
}

// OpenGPU returns ErrNoGPU: this build has no GPU support.
func OpenGPU(ordinal int, opts ...GPUOption) (kernels.Backend, error) {
	_, err := GPUCount()
	return nil, err
}
