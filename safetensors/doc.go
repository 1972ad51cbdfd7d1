// Package safetensors reads and writes the safetensors file format, the
// format Hugging Face defined for storing named tensors safely (no code, no
// pickles), so that jetfabric's weights load in PyTorch, JAX or candle and
// theirs load here.
//
// # Format
//
// A file is three parts:
//
//	8 bytes    N, an unsigned 64-bit little-endian integer
//	N bytes    a UTF-8 JSON object, the header
//	rest       the data buffer
//
// The header maps each tensor name to
//
//	{"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]}
//
// where begin and end are byte offsets relative to the start of the data
// buffer. The optional key "__metadata__" maps to an object of string values.
// Tensors are stored little-endian, row-major, contiguous, and together they
// cover the buffer exactly: sorted by offset, each begins where the previous
// one ends, the first at 0 and the last at the end of the file, and each holds
// exactly its shape's element count times its dtype's size. The dtypes read
// and written here are F64 F32 F16 BF16 I64 I32 I16 I8 U8 and BOOL.
//
// # Writing
//
// [Encode] writes a file in the byte layout of the reference implementation:
// tensors ordered widest dtype first (the reference's dtype order: I64, F64,
// F32, I32, BF16, F16, I16, I8, U8, BOOL) and by name within a dtype, so every
// tensor's data is aligned to its element size; the compact JSON header lists
// "__metadata__" first (keys sorted) and the tensors in data order, padded with
// spaces to a multiple of 8 bytes.
//
// # Reading
//
// [Decode] parses a file held in memory and [Read] one from an [io.Reader].
// Both check everything a hostile file could get wrong before trusting it: the
// header size against a cap ([WithMaxHeaderSize], 100,000,000 bytes by default
// as in the reference), UTF-8 and JSON syntax, duplicate names, dtypes, shapes
// (non-negative, element counts without overflow), offsets (no gap, no
// overlap, sizes that match dtype and shape) and the file's total length.
// Errors wrap the sentinels of errors.go, name the offending tensor, and
// never panic.
//
//	var buf bytes.Buffer
//	err := safetensors.Encode(&buf, []safetensors.Tensor{
//		{Name: "0.weight", DType: safetensors.F32, Shape: []int{2, 2}, Data: data},
//	}, map[string]string{"format": "pt"})
//	f, err := safetensors.Decode(buf.Bytes())
//	w, ok := f.Lookup("0.weight")
package safetensors
