package codec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/fxamacker/cbor/v2"
)

// Encoding selects CBOR or JSON.
type Encoding uint8

const (
	CBOR Encoding = iota // canonical
	JSON
)

// String returns the content type of e.
func (e Encoding) String() string {
	if e == JSON {
		return "application/json"
	}
	return "application/cbor"
}

// Limits bound decoding.
const (
	// MaxOpsPerFrame is the most ops one frame may carry.
	MaxOpsPerFrame = 1 << 16
	maxNested      = 16
	maxArray       = 1 << 24
	maxMapPairs    = 64
)

var (
	encMode cbor.EncMode
	decMode cbor.DecMode
)

func init() {
	var err error
	encMode, err = cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		panic(err)
	}
	decMode, err = cbor.DecOptions{
		MaxNestedLevels:  maxNested,
		MaxArrayElements: maxArray,
		MaxMapPairs:      maxMapPairs,
		IndefLength:      cbor.IndefLengthForbidden,
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
	}.DecMode()
	if err != nil {
		panic(err)
	}
}

// Marshal encodes v (a Frame, Result, Device or any schema value).
func Marshal(enc Encoding, v any) ([]byte, error) {
	if enc == JSON {
		return json.Marshal(v)
	}
	if f, ok := v.(*Frame); ok && f != nil && frameCodec != nil {
		size := 16
		for i := range f.Ops {
			size += 48 + len(f.Ops[i].Data) + 9*len(f.Ops[i].Values)
		}
		return frameCodec.appendStruct(make([]byte, 0, size), unsafe.Pointer(f)), nil
	}
	if r, ok := v.(*Result); ok && r != nil && resultCodec != nil {
		size := 64
		if r.Tensor != nil {
			size += len(r.Tensor.Data) + 9*len(r.Tensor.Values)
		}
		return resultCodec.appendStruct(make([]byte, 0, size), unsafe.Pointer(r)), nil
	}
	return encMode.Marshal(v)
}

// Unmarshal decodes data into v with the decode limits. Errors wrap ErrMalformed.
func Unmarshal(enc Encoding, data []byte, v any) error {
	var err error
	if enc == JSON {
		d := json.NewDecoder(bytes.NewReader(data))
		err = d.Decode(v)
		if err == nil && d.More() {
			err = fmt.Errorf("trailing data after JSON value")
		}
	} else if r, ok := v.(*Result); ok && r != nil && isZeroResult(r) && decodeResult(data, r) {
		return nil
	} else {
		err = decMode.Unmarshal(data, v)
	}
	if err != nil {
		return fmt.Errorf("%w (%v): %v", ErrMalformed, enc, err)
	}
	return nil
}

func isZeroResult(r *Result) bool { return reflect.ValueOf(r).Elem().IsZero() }

// DecodeFrame decodes and checks a frame: version and op count.
func DecodeFrame(enc Encoding, data []byte) (*Frame, error) {
	f := new(Frame)
	if err := DecodeFrameInto(enc, data, f); err != nil {
		return nil, err
	}
	return f, nil
}

// DecodeFrameInto is DecodeFrame into f, whose Ops array is reused when
// it has room (an Op is several hundred bytes; a frame thousands of ops):
// the ops of the last frame decoded into f are overwritten, so a caller
// that reuses f keeps nothing of them. On an error f holds no frame.
func DecodeFrameInto(enc Encoding, data []byte, f *Frame) error {
	*f = Frame{Ops: f.Ops[:0]}
	if enc != CBOR || !decodeFrameInto(data, f) {
		*f = Frame{}
		if err := Unmarshal(enc, data, f); err != nil {
			return err
		}
	}
	if f.V != Version {
		return fmt.Errorf("%w: frame version %d, this worker speaks %d", ErrVersion, f.V, Version)
	}
	if len(f.Ops) > MaxOpsPerFrame {
		return fmt.Errorf("%w: %d ops, at most %d", ErrTooManyOps, len(f.Ops), MaxOpsPerFrame)
	}
	return nil
}

// EncodingOf returns the encoding named by a Content-Type header value.
func EncodingOf(contentType string) (Encoding, error) {
	switch contentType {
	case "", "application/cbor":
		return CBOR, nil
	case "application/json":
		return JSON, nil
	}
	return CBOR, fmt.Errorf("%w: content type %q (want application/cbor or application/json)", ErrMalformed, contentType)
}
