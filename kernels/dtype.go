package kernels

import "fmt"

// DType is an element type. The wire names are the String values.
type DType uint8

// The dtypes. Tensors are stored contiguous, row-major, little-endian.
const (
	Invalid DType = iota
	Float32
	Float64
	Float16
	BFloat16
	Int32
	Int64
	Uint8
	Bool // one byte per element, 0 or 1
)

var dtypeNames = [...]string{Invalid: "invalid", Float32: "f32", Float64: "f64", Float16: "f16",
	BFloat16: "bf16", Int32: "i32", Int64: "i64", Uint8: "u8", Bool: "bool"}

var dtypeSizes = [...]int{Float32: 4, Float64: 8, Float16: 2, BFloat16: 2, Int32: 4, Int64: 8, Uint8: 1, Bool: 1}

// String returns the wire name: f32, f64, f16, bf16, i32, i64, u8, bool.
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Size is the element size in bytes (0 for Invalid).
func (d DType) Size() int {
	if int(d) < len(dtypeSizes) {
		return dtypeSizes[d]
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == Float32 || d == Float64 || d == Float16 || d == BFloat16 }

// IsInt reports whether d is an integer type (Bool excluded).
func (d DType) IsInt() bool { return d == Int32 || d == Int64 || d == Uint8 }

// Valid reports whether d is one of the defined dtypes.
func (d DType) Valid() bool { return d > Invalid && d <= Bool }

// ParseDType parses a wire name. The empty string is Float32.
func ParseDType(s string) (DType, error) {
	switch s {
	case "", "f32", "float32":
		return Float32, nil
	case "f64", "float64":
		return Float64, nil
	case "f16", "float16":
		return Float16, nil
	case "bf16", "bfloat16":
		return BFloat16, nil
	case "i32", "int32":
		return Int32, nil
	case "i64", "int64":
		return Int64, nil
	case "u8", "uint8":
		return Uint8, nil
	case "bool":
		return Bool, nil
	}
	return Invalid, fmt.Errorf("%w %q (want f32, f64, f16, bf16, i32, i64, u8 or bool)", ErrDType, s)
}
