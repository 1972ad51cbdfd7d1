//go:build !(cgo && linux)

package cuda

import "github.com/jetfabric/jetfabric/kernels"

var _ kernels.Backend = (*Backend)(nil)

// Backend is the GPU backend; without cgo on Linux it cannot be opened.
type Backend struct{}

// DeviceCount returns ErrNoGPU: this build has no GPU support.
func DeviceCount() (int, error) { return 0, ErrNoGPU }

// New returns ErrNoGPU: this build has no GPU support.
func New(ordinal int, opts ...Option) (*Backend, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	return nil, ErrNoGPU
}

// Name returns "cuda (unavailable)".
func (b *Backend) Name() string { return "cuda (unavailable)" }

// ComputeCapability returns 0, 0.
func (b *Backend) ComputeCapability() (major, minor int) { return 0, 0 }

// Alloc returns ErrNoGPU.
func (b *Backend) Alloc(n int) (kernels.Buffer, error) { return nil, ErrNoGPU }

// Free does nothing.
func (b *Backend) Free(kernels.Buffer) {}

// Upload returns ErrNoGPU.
func (b *Backend) Upload(dst kernels.Buffer, src []byte) error { return ErrNoGPU }

// HostBuffer returns ErrNoGPU.
func (b *Backend) HostBuffer(n int) ([]byte, func(), error) { return nil, nil, ErrNoGPU }

// Download returns ErrNoGPU.
func (b *Backend) Download(dst []byte, src kernels.Buffer) error { return ErrNoGPU }

// DownloadMany returns ErrNoGPU.
func (b *Backend) DownloadMany(dsts [][]byte, srcs []kernels.Buffer) error { return ErrNoGPU }

// Exec returns ErrNoGPU.
func (b *Backend) Exec(op *kernels.Op, in, out []*kernels.Tensor) error { return ErrNoGPU }

// ExecFused returns ErrNoGPU.
func (b *Backend) ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error { return ErrNoGPU }

// Sync returns ErrNoGPU.
func (b *Backend) Sync() error { return ErrNoGPU }

// Close does nothing.
func (b *Backend) Close() error { return nil }
