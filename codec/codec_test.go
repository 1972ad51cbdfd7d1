package codec

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

func sampleFrame() *Frame {
	return &Frame{V: Version, Ops: []Op{
		{Op: "upload", Out: []uint64{1}, DType: "f32", Shape: []int{2}, Data: []byte{0, 0, 128, 63, 0, 0, 0, 64}},
		{Op: "add", Out: []uint64{2}, In: []uint64{1, 1}},
		{Op: "sum", Out: []uint64{3}, In: []uint64{2}, Axes: []int{-1}, Keepdims: true},
		{Op: "read", In: []uint64{3}, Tag: 7},
	}}
}

func TestRoundTrip(t *testing.T) {
	for _, enc := range []Encoding{CBOR, JSON} {
		b, err := Marshal(enc, sampleFrame())
		if err != nil {
			t.Fatal(err)
		}
		f, err := DecodeFrame(enc, b)
		if err != nil {
			t.Fatalf("%v: %v", enc, err)
		}
		if !reflect.DeepEqual(f, sampleFrame()) {
			t.Errorf("%v: round trip\n got %+v\nwant %+v", enc, f, sampleFrame())
		}
	}
	r := &Result{V: 1, Tag: 7, Seq: 9, Index: 3, Errors: []Error{{Seq: 9, Index: 1, Op: "add", Code: CodeShape, Message: "x"}},
		Tensor: &Tensor{DType: "f32", Shape: []int{}, Data: []byte{1, 2, 3, 4}}}
	for _, enc := range []Encoding{CBOR, JSON} {
		b, _ := Marshal(enc, r)
		var got Result
		if err := Unmarshal(enc, b, &got); err != nil || !reflect.DeepEqual(&got, r) {
			t.Errorf("%v result round trip: %+v %v", enc, got, err)
		}
	}
}

func TestJSONIsReadable(t *testing.T) {
	in := `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[2],"values":[1,2]},{"op":"read","in":[1],"tag":1}]}`
	f, err := DecodeFrame(JSON, []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if f.Ops[0].Values[1] != 2 || f.Ops[1].Tag != 1 {
		t.Errorf("decoded %+v", f)
	}
}

func TestBadFrames(t *testing.T) {
	deep := bytes.Repeat([]byte{0x81}, 40) // 40 nested arrays
	many, _ := cbor.Marshal(map[string]any{"v": 1, "ops": make([]Op, MaxOpsPerFrame+1)})
	v2, _ := Marshal(CBOR, &Frame{V: 2})
	for _, c := range []struct {
		name string
		enc  Encoding
		data []byte
		want error
	}{
		{"empty cbor", CBOR, nil, ErrMalformed},
		{"garbage cbor", CBOR, []byte("not cbor at all"), ErrMalformed},
		{"garbage json", JSON, []byte("{not json"), ErrMalformed},
		{"json trailing", JSON, []byte(`{"v":1} {}`), ErrMalformed},
		{"json wrong type", JSON, []byte(`{"v":1,"ops":[{"op":3}]}`), ErrMalformed},
		{"deep nesting", CBOR, deep, ErrMalformed},
		{"version 2", CBOR, v2, ErrVersion},
		{"version 0", JSON, []byte(`{"ops":[]}`), ErrVersion},
		{"too many ops", CBOR, many, ErrTooManyOps},
		{"negative id", JSON, []byte(`{"v":1,"ops":[{"op":"x","in":[-1]}]}`), ErrMalformed},
	} {
		if _, err := DecodeFrame(c.enc, c.data); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := EncodingOf("text/plain"); !errors.Is(err, ErrMalformed) {
		t.Errorf("content type text/plain: %v", err)
	}
}

func FuzzDecodeFrame(f *testing.F) {
	good, _ := Marshal(CBOR, sampleFrame())
	goodJSON, _ := Marshal(JSON, sampleFrame())
	f.Add(good, false)
	f.Add(goodJSON, true)
	f.Add([]byte{0xa2, 0x61, 0x76, 0x01}, false)
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		enc := CBOR
		if isJSON {
			enc = JSON
		}
		fr, err := DecodeFrame(enc, data)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes and decodes to the same frame.
		b, err := Marshal(enc, fr)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		if _, err := DecodeFrame(enc, b); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

func BenchmarkFrame(b *testing.B) {
	ops := make([]Op, 1000)
	for i := range ops {
		ops[i] = Op{Op: "add", Out: []uint64{uint64(i + 3)}, In: []uint64{uint64(i + 1), uint64(i + 2)}}
	}
	fr := &Frame{V: Version, Ops: ops}
	data, _ := Marshal(CBOR, fr)
	b.Run("encode-1000-ops", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Marshal(CBOR, fr); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(ops))/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("decode-1000-ops", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := DecodeFrame(CBOR, data); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(ops))/b.Elapsed().Seconds(), "ops/s")
	})
}
