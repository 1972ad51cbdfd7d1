//go:build !(cgo && linux)

package worker

import "fmt"

// OpenNVML returns ErrNoGPU: this build has no GPU support.
func OpenNVML() (*NVML, error) {
	return nil, fmt.Errorf("%w: this build has no GPU support (built without cgo)", ErrNoGPU)
}
