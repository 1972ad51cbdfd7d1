package safetensors

import (
	"fmt"
	"math"
)

// DType is an element type, named as in the file's "dtype" field.
type DType string

// The dtypes this package reads and writes.
const (
	F64  DType = "F64"
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	I64  DType = "I64"
	I32  DType = "I32"
	I16  DType = "I16"
	I8   DType = "I8"
	U8   DType = "U8"
	BOOL DType = "BOOL" // one byte per element, 0 or 1
)

// dtypeInfo holds each dtype's element size and its rank in the reference
// implementation's dtype order, which Encode follows (highest rank first).
var dtypeInfo = map[DType]struct{ size, rank int }{
	BOOL: {1, 0}, U8: {1, 1}, I8: {1, 2}, I16: {2, 3}, F16: {2, 4},
	BF16: {2, 5}, I32: {4, 6}, F32: {4, 7}, F64: {8, 8}, I64: {8, 9},
}

// Size returns the byte size of one element, or 0 for an unknown dtype.
func (d DType) Size() int { return dtypeInfo[d].size }

// Valid reports whether d is one of the dtypes this package handles.
func (d DType) Valid() bool { _, ok := dtypeInfo[d]; return ok }

// MetadataKey is the reserved header key of the free-form string metadata.
const MetadataKey = "__metadata__"

// Tensor is one named tensor: little-endian, row-major, contiguous data.
type Tensor struct {
	Name  string
	DType DType
	Shape []int // nil or empty for a scalar
	Data  []byte
}

// File is a decoded safetensors file.
type File struct {
	// Tensors in the order of their data in the file.
	Tensors []Tensor
	// Metadata is the header's "__metadata__", nil when the file has none.
	Metadata map[string]string
}

// Lookup returns the tensor named name.
func (f *File) Lookup(name string) (Tensor, bool) {
	for _, t := range f.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// byteSize returns the bytes a tensor of dtype d and this shape holds,
// checking for negative dimensions and overflow past limit. It returns an
// error wrapping ErrDType or ErrShape.
func byteSize(d DType, shape []int64, limit uint64) (uint64, error) {
	size := uint64(d.Size())
	if size == 0 {
		return 0, fmt.Errorf("%w %q (want F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL)", ErrDType, string(d))
	}
	n := uint64(1)
	for _, dim := range shape {
		if dim < 0 {
			return 0, fmt.Errorf("%w: negative dimension in %v", ErrShape, shape)
		}
		if dim != 0 && n > limit/uint64(dim) {
			return 0, fmt.Errorf("%w: %v holds more than %d elements", ErrShape, shape, limit)
		}
		n *= uint64(dim)
	}
	if n > limit/size {
		return 0, fmt.Errorf("%w: %v of %s holds more than %d bytes", ErrShape, shape, d, limit)
	}
	return n * size, nil
}

// maxBytes bounds any size computed here, so that it fits an int and an
// int64 on every platform.
const maxBytes = uint64(math.MaxInt)
