package mnist

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// IDX element type codes (the third byte of the magic number).
const (
	typeU8 = 0x08
)

// MaxElements bounds the elements an IDX file may declare, so that a
// corrupt header cannot make the reader allocate without limit. MNIST's
// largest file holds 47,040,000.
const MaxElements = 1 << 28

// IDX is a parsed IDX file of unsigned bytes.
type IDX struct {
	Dims []int  // sizes, outermost first
	Data []byte // row-major, len = product of Dims
}

// ReadIDX parses an IDX file of unsigned bytes with ndims dimensions from
// r, gzipped or not (a gzip stream is recognised by its magic bytes). It
// fails with an error wrapping ErrFormat when the magic number, the element
// type, the number of dimensions or a size is wrong, when the data is
// shorter than the sizes say, or when anything follows it.
func ReadIDX(r io.Reader, ndims int) (*IDX, error) {
	br := bufio.NewReader(r)
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip: %v", ErrFormat, err)
		}
		defer z.Close()
		return readIDX(z, ndims)
	}
	return readIDX(br, ndims)
}

func readIDX(r io.Reader, ndims int) (*IDX, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, fmt.Errorf("%w: magic number: %v", ErrFormat, short(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("%w: magic number % x: want 00 00 08 %02x", ErrFormat, magic, ndims)
	}
	if magic[2] != typeU8 {
		return nil, fmt.Errorf("%w: element type 0x%02x: want 0x08 (unsigned byte)", ErrFormat, magic[2])
	}
	if int(magic[3]) != ndims {
		return nil, fmt.Errorf("%w: %d dimensions: want %d", ErrFormat, magic[3], ndims)
	}
	dims := make([]int, ndims)
	n := 1
	for i := range dims {
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf("%w: size of dimension %d: %v", ErrFormat, i, short(err))
		}
		d := binary.BigEndian.Uint32(b[:])
		if d == 0 || d > MaxElements || uint64(n)*uint64(d) > MaxElements {
			return nil, fmt.Errorf("%w: size %d of dimension %d: want 1 to %d elements in all", ErrFormat, d, i, MaxElements)
		}
		dims[i] = int(d)
		n *= int(d)
	}
	data := make([]byte, n)
	if got, err := io.ReadFull(r, data); err != nil {
		return nil, fmt.Errorf("%w: sizes %v declare %d bytes of data, the file holds %d: %v", ErrFormat, dims, n, got, short(err))
	}
	var extra [1]byte
	switch k, err := io.ReadFull(r, extra[:]); {
	case k > 0:
		return nil, fmt.Errorf("%w: data continues past the %d bytes that sizes %v declare", ErrFormat, n, dims)
	case err != nil && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: after the data: %v", ErrFormat, err)
	}
	return &IDX{Dims: dims, Data: data}, nil
}

// short names a truncation plainly.
func short(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("file too short")
	}
	return err
}

// EncodeIDX writes an IDX file of unsigned bytes (uncompressed), for
// tests and tools. It does not check that data matches dims.
func EncodeIDX(dims []int, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, typeU8, byte(len(dims))})
	for _, d := range dims {
		_ = binary.Write(&b, binary.BigEndian, uint32(d))
	}
	b.Write(data)
	return b.Bytes()
}
