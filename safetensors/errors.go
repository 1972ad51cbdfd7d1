package safetensors

import "errors"

// Errors returned by [Encode], [Decode] and [Read]; each is wrapped with the
// tensor and the values at fault, so match them with [errors.Is].
var (
	// ErrHeaderTooLarge: the header length exceeds the decoder's cap.
	ErrHeaderTooLarge = errors.New("safetensors: header too large")
	// ErrTruncated: the file ends before its header or data does.
	ErrTruncated = errors.New("safetensors: truncated file")
	// ErrHeader: the header is not valid UTF-8 JSON of the expected form.
	ErrHeader = errors.New("safetensors: malformed header")
	// ErrName: a tensor name that is repeated, the reserved "__metadata__", or
	// not valid UTF-8.
	ErrName = errors.New("safetensors: bad tensor name")
	// ErrDType: a dtype this package does not read or write.
	ErrDType = errors.New("safetensors: unsupported dtype")
	// ErrShape: a negative dimension, or an element count that overflows.
	ErrShape = errors.New("safetensors: bad shape")
	// ErrOffsets: data offsets that leave a gap, overlap, run backwards or
	// do not hold exactly the bytes that the dtype and shape need.
	ErrOffsets = errors.New("safetensors: bad data offsets")
	// ErrSize: the data buffer's length differs from what the header
	// describes, or a tensor's Data from what its dtype and shape need.
	ErrSize = errors.New("safetensors: size mismatch")
	// ErrInvalidOption: an option given to Decode or Read is out of range.
	ErrInvalidOption = errors.New("safetensors: invalid option")
)
