package safetensors

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Encode writes tensors and metadata (nil or empty for none) to w as a
// safetensors file laid out as the reference implementation lays it out:
// widest dtype first and by name within a dtype, the compact JSON header with
// "__metadata__" first and its keys sorted, padded with spaces to a multiple
// of 8 bytes. tensors itself is not reordered.
//
// Encode returns an error wrapping ErrName (a repeated or reserved name, or
// one that is not UTF-8), ErrDType, ErrShape or ErrSize (Data not exactly the
// bytes that DType and Shape need) before writing anything, or the writer's
// error.
func Encode(w io.Writer, tensors []Tensor, metadata map[string]string) error {
	order := make([]int, len(tensors))
	seen := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		order[i] = i
		switch {
		case t.Name == MetadataKey:
			return fmt.Errorf("%w: %q is reserved", ErrName, t.Name)
		case seen[t.Name]:
			return fmt.Errorf("%w: %q appears twice", ErrName, t.Name)
		case !utf8.ValidString(t.Name):
			return fmt.Errorf("%w: %q is not UTF-8", ErrName, t.Name)
		}
		seen[t.Name] = true
		shape := make([]int64, len(t.Shape))
		for j, d := range t.Shape {
			shape[j] = int64(d)
		}
		n, err := byteSize(t.DType, shape, maxBytes)
		if err != nil {
			return fmt.Errorf("%w (tensor %q)", err, t.Name)
		}
		if uint64(len(t.Data)) != n {
			return fmt.Errorf("%w: tensor %q of %s %v needs %d bytes, has %d", ErrSize, t.Name, t.DType, t.Shape, n, len(t.Data))
		}
	}
	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%w: metadata %q is not UTF-8", ErrHeader, k)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := tensors[a], tensors[b]
		if c := cmp.Compare(dtypeInfo[tb.DType].rank, dtypeInfo[ta.DType].rank); c != 0 {
			return c
		}
		return cmp.Compare(ta.Name, tb.Name)
	})

	h := []byte{'{'}
	if len(metadata) > 0 {
		h = appendString(h, MetadataKey)
		h = append(h, ':', '{')
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				h = append(h, ',')
			}
			h = appendString(h, k)
			h = append(h, ':')
			h = appendString(h, metadata[k])
		}
		h = append(h, '}')
	}
	offset := 0
	for i, idx := range order {
		t := tensors[idx]
		if i > 0 || len(metadata) > 0 {
			h = append(h, ',')
		}
		h = appendString(h, t.Name)
		h = append(h, `:{"dtype":`...)
		h = appendString(h, string(t.DType))
		h = append(h, `,"shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				h = append(h, ',')
			}
			h = strconv.AppendInt(h, int64(d), 10)
		}
		h = append(h, `],"data_offsets":[`...)
		h = strconv.AppendInt(h, int64(offset), 10)
		h = append(h, ',')
		offset += len(t.Data)
		h = strconv.AppendInt(h, int64(offset), 10)
		h = append(h, ']', '}')
	}
	h = append(h, '}')
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}

	prefix := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(h)), uint64(len(h)))
	if _, err := w.Write(append(prefix, h...)); err != nil {
		return fmt.Errorf("safetensors: write header: %w", err)
	}
	for _, idx := range order {
		if len(tensors[idx].Data) == 0 {
			continue
		}
		if _, err := w.Write(tensors[idx].Data); err != nil {
			return fmt.Errorf("safetensors: write tensor %q: %w", tensors[idx].Name, err)
		}
	}
	return nil
}

// appendString appends s as a JSON string escaped as serde_json escapes it
// (the reference writer): quote, backslash and control characters only.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
