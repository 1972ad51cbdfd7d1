package cuda

import (
	"errors"
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// Errors returned by the CUDA backend. Callers match them with errors.Is.
var (
	// ErrNoGPU: no usable NVIDIA driver or device (or a build without cgo).
	ErrNoGPU = errors.New("cuda: no GPU")
	// ErrNoCompiler: the NVRTC library could not be loaded.
	ErrNoCompiler = errors.New("cuda: NVRTC not found")
	// ErrClosed: the backend was closed.
	ErrClosed = errors.New("cuda: backend closed")
	// ErrInvalidOption: an option passed to New is out of range.
	ErrInvalidOption = errors.New("cuda: invalid option")
	// ErrBuffer: a buffer that this backend did not allocate, or one already freed.
	ErrBuffer = errors.New("cuda: foreign or freed buffer")
	// ErrCompile: NVRTC rejected a generated kernel; the error carries its log.
	ErrCompile = errors.New("cuda: kernel compilation failed")
)

// Error is a failed call into the driver, NVRTC or cuBLAS. Library is
// "cuda", "nvrtc" or "cublas"; Name is the status name the library gives.
// An out-of-memory status matches kernels.ErrOutOfMemory.
type Error struct {
	Library string
	Call    string
	Code    int
	Name    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%s %d)", e.Call, e.Name, e.Library, e.Code)
}

// Is matches kernels.ErrOutOfMemory for the libraries' out-of-memory statuses.
func (e *Error) Is(target error) bool {
	if target != kernels.ErrOutOfMemory {
		return false
	}
	switch e.Library {
	case "cuda":
		return e.Code == 2 // CUDA_ERROR_OUT_OF_MEMORY
	case "nvrtc":
		return e.Code == 1 // NVRTC_ERROR_OUT_OF_MEMORY
	case "cublas":
		return e.Code == 3 // CUBLAS_STATUS_ALLOC_FAILED
	}
	return false
}

// AsyncError is a failure of device work that Exec or ExecFused queued
// and returned from: the driver rejected a launch, a copy or a cuBLAS call
// when the device thread issued it. Exec checks everything that depends
// on the op and its inputs before it returns, so in practice this means a
// broken context, after which later work fails too. It is returned once,
// by the next call that waits for the device (Sync, Download, or an op
// that reads an index flag back); Op names the op that failed.
type AsyncError struct {
	Op  string
	Err error
}

func (e *AsyncError) Error() string {
	return fmt.Sprintf("cuda: %s (queued earlier) failed: %v", e.Op, e.Err)
}

// Unwrap returns the driver's error.
func (e *AsyncError) Unwrap() error { return e.Err }
