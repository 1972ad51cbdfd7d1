// Package all gathers jetfabric's kernel backends behind two calls: the
// CPU backend always, the CUDA backend where the build has cgo on Linux.
// Commands import it instead of each backend, so a CGO_ENABLED=0 build
// carries no GPU code and a cgo build finds the driver at run time.
//
//	n, err := all.GPUCount() // errors.Is(err, all.ErrNoGPU) without driver or cgo
//	b, err := all.OpenGPU(0, all.WithTF32(true))
package all

import (
	"errors"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// ErrNoGPU: this build has no GPU support, or the machine no usable driver
// or device.
var ErrNoGPU = errors.New("kernels/all: no GPU")

// CPU returns the reference backend.
func CPU() kernels.Backend { return cpu.New() }

// GPUOption configures OpenGPU.
type GPUOption func(*gpuOptions)

type gpuOptions struct {
	tf32     bool
	noChains bool
}

// WithTF32 lets float32 matrix products use TF32 tensor cores (see the
// CUDA backend's WithTF32).
func WithTF32(on bool) GPUOption { return func(o *gpuOptions) { o.tf32 = on } }

// WithChains sets whether runs of elementwise ops of one shape launch as
// one kernel (see the CUDA backend's WithChains; on by default).
func WithChains(on bool) GPUOption { return func(o *gpuOptions) { o.noChains = !on } }
