package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// Decode parses a whole safetensors file held in b. The returned tensors'
// Data alias b (capacity clipped, so appending copies); copy them if b is
// reused.
//
// Decode returns an error wrapping ErrInvalidOption, ErrHeaderTooLarge,
// ErrTruncated, ErrHeader, ErrName, ErrDType, ErrShape, ErrOffsets or ErrSize;
// see the package doc for what is checked.
func Decode(b []byte, opts ...Option) (*File, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	n, err := headerLen(b, o)
	if err != nil {
		return nil, err
	}
	if uint64(len(b)-8) < n {
		return nil, fmt.Errorf("%w: header of %d bytes, file holds %d after the length", ErrTruncated, n, len(b)-8)
	}
	h, end, err := parseHeader(b[8:8+n], o)
	if err != nil {
		return nil, err
	}
	data := b[8+n:]
	if err := checkDataLen(uint64(len(data)), end); err != nil {
		return nil, err
	}
	return h.file(data), nil
}

// Read reads and parses a safetensors file from r, reading the header
// first and then exactly the data it describes; memory grows with the bytes
// actually read, never with sizes the header merely claims. It returns the
// errors of Decode, and r's errors wrapped.
func Read(r io.Reader, opts ...Option) (*File, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	var prefix [8]byte
	if _, err := io.ReadFull(r, prefix[:]); err != nil {
		return nil, readErr(err, "length prefix")
	}
	n, err := headerLen(prefix[:], o)
	if err != nil {
		return nil, err
	}
	hb, err := readN(r, n)
	if err != nil {
		return nil, readErr(err, "header")
	}
	h, end, err := parseHeader(hb, o)
	if err != nil {
		return nil, err
	}
	data, err := readN(r, end)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: header describes %d data bytes, file holds %d", ErrTruncated, end, len(data))
		}
		return nil, readErr(err, "data")
	}
	var one [1]byte
	switch k, err := io.ReadFull(r, one[:]); {
	case k > 0:
		return nil, fmt.Errorf("%w: data continues past the %d bytes the header describes", ErrSize, end)
	case err != io.EOF:
		return nil, readErr(err, "data")
	}
	return h.file(data), nil
}

func readErr(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: file ends in the %s", ErrTruncated, what)
	}
	return fmt.Errorf("safetensors: read %s: %w", what, err)
}

// readN reads exactly n bytes, allocating at most a chunk ahead of what has
// arrived, and reports io.ErrUnexpectedEOF (with what it read) if r ends
// first.
func readN(r io.Reader, n uint64) ([]byte, error) {
	const chunk = 16 << 20
	b := make([]byte, 0, min(n, chunk))
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, int(min(n-uint64(len(b)), uint64(len(b))+chunk)))
		}
		want := min(uint64(cap(b)), n)
		k, err := io.ReadFull(r, b[len(b):want])
		b = b[:len(b)+k]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return b, err
		}
	}
	return b, nil
}

func headerLen(b []byte, o options) (uint64, error) {
	if len(b) < 8 {
		return 0, fmt.Errorf("%w: %d bytes, want at least the 8-byte header length", ErrTruncated, len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(o.maxHeader) {
		return 0, fmt.Errorf("%w: %d bytes, cap %d", ErrHeaderTooLarge, n, o.maxHeader)
	}
	return n, nil
}

func checkDataLen(have, want uint64) error {
	switch {
	case have < want:
		return fmt.Errorf("%w: header describes %d data bytes, file holds %d", ErrTruncated, want, have)
	case have > want:
		return fmt.Errorf("%w: file holds %d data bytes, header describes %d", ErrSize, have, want)
	}
	return nil
}

// entry is one tensor of a parsed header.
type entry struct {
	name       string
	dtype      DType
	shape      []int
	begin, end uint64
}

type header struct {
	entries  []entry
	metadata map[string]string
}

func (h *header) file(data []byte) *File {
	f := &File{Tensors: make([]Tensor, len(h.entries)), Metadata: h.metadata}
	for i, e := range h.entries {
		f.Tensors[i] = Tensor{Name: e.name, DType: e.dtype, Shape: e.shape, Data: data[e.begin:e.end:e.end]}
	}
	return f
}

// parseHeader validates the JSON header hb and returns its entries sorted by
// offset and the data buffer's length they describe.
func parseHeader(hb []byte, o options) (*header, uint64, error) {
	if !utf8.Valid(hb) {
		return nil, 0, fmt.Errorf("%w: not UTF-8", ErrHeader)
	}
	dec := json.NewDecoder(bytes.NewReader(hb))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, 0, fmt.Errorf("%w: want a JSON object", ErrHeader)
	}
	h := &header{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %v", ErrHeader, err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, 0, fmt.Errorf("%w: key %v is not a string", ErrHeader, tok)
		}
		if seen[name] {
			return nil, 0, fmt.Errorf("%w: %q appears twice", ErrName, name)
		}
		seen[name] = true
		if name == MetadataKey {
			if err := dec.Decode(&h.metadata); err != nil {
				return nil, 0, fmt.Errorf("%w: %s must map names to strings: %v", ErrHeader, MetadataKey, err)
			}
			continue
		}
		e, err := parseEntry(dec, name, o)
		if err != nil {
			return nil, 0, err
		}
		h.entries = append(h.entries, e)
	}
	if _, err := dec.Token(); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrHeader, err)
	}
	rest := hb[dec.InputOffset():]
	if len(bytes.TrimLeft(rest, " \t\r\n")) != 0 {
		return nil, 0, fmt.Errorf("%w: %d bytes after the JSON object", ErrHeader, len(rest))
	}

	slices.SortFunc(h.entries, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end), cmp.Compare(a.name, b.name))
	})
	var at uint64
	for _, e := range h.entries {
		if e.begin != at {
			what := "a gap"
			if e.begin < at {
				what = "an overlap"
			}
			return nil, 0, fmt.Errorf("%w: tensor %q begins at %d, want %d (%s)", ErrOffsets, e.name, e.begin, at, what)
		}
		at = e.end
	}
	if at > uint64(o.maxData) {
		return nil, 0, fmt.Errorf("%w: header describes %d data bytes, cap %d", ErrSize, at, o.maxData)
	}
	return h, at, nil
}

func parseEntry(dec *json.Decoder, name string, o options) (entry, error) {
	e := entry{name: name}
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return e, fmt.Errorf("%w: tensor %q: want an object of dtype, shape and data_offsets", ErrHeader, name)
	}
	var (
		dtype   string
		shape   []int64
		offsets []uint64
	)
	for _, f := range []struct {
		key string
		dst any
	}{{"dtype", &dtype}, {"shape", &shape}, {"data_offsets", &offsets}} {
		v, ok := raw[f.key]
		if !ok {
			return e, fmt.Errorf("%w: tensor %q has no %s", ErrHeader, name, f.key)
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return e, fmt.Errorf("%w: tensor %q: %s %s: %v", ErrHeader, name, f.key, v, err)
		}
	}
	if shape == nil {
		return e, fmt.Errorf("%w: tensor %q: shape is null", ErrHeader, name)
	}
	if len(offsets) != 2 {
		return e, fmt.Errorf("%w: tensor %q: data_offsets %v, want [begin, end]", ErrOffsets, name, offsets)
	}
	e.dtype, e.begin, e.end = DType(dtype), offsets[0], offsets[1]
	size, err := byteSize(e.dtype, shape, maxBytes)
	if err != nil {
		return e, fmt.Errorf("%w (tensor %q)", err, name)
	}
	if e.end < e.begin || e.end-e.begin != size {
		return e, fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] for %s %v, which needs %d bytes", ErrOffsets, name, e.begin, e.end, e.dtype, shape, size)
	}
	if e.end > uint64(o.maxData) {
		return e, fmt.Errorf("%w: tensor %q ends at %d, past the data cap %d", ErrSize, name, e.end, o.maxData)
	}
	e.shape = make([]int, len(shape))
	for i, d := range shape {
		e.shape[i] = int(d)
	}
	return e, nil
}
