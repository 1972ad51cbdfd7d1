package safetensors_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/jetfabric/jetfabric/safetensors"
)

func f32s(v ...float32) []byte {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// file assembles a file from a raw header and data, as a hostile writer would.
func file(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func encode(t testing.TB, ts []safetensors.Tensor, meta map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, ts, meta); err != nil {
		t.Fatalf("Encode: %v", err)
	}
	return buf.Bytes()
}

// TestEncodeLayout checks the bytes against the reference implementation's
// serializer: its own test case first, then the dtype-then-name order with
// metadata first.
func TestEncodeLayout(t *testing.T) {
	tests := []struct {
		name    string
		tensors []safetensors.Tensor
		meta    map[string]string
		header  string
		data    []byte
	}{{
		name:    "reference test_serialization",
		tensors: []safetensors.Tensor{{Name: "attn.0", DType: safetensors.F32, Shape: []int{1, 2, 3}, Data: f32s(0, 1, 2, 3, 4, 5)}},
		header:  `{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`,
		data:    f32s(0, 1, 2, 3, 4, 5),
	}, {
		name: "widest dtype first, then by name, metadata first",
		tensors: []safetensors.Tensor{
			{Name: "u", DType: safetensors.U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
			{Name: "b", DType: safetensors.F32, Shape: []int{1}, Data: f32s(2)},
			{Name: "a", DType: safetensors.F32, Shape: []int{}, Data: f32s(1)},
			{Name: "i", DType: safetensors.I64, Shape: []int{1}, Data: []byte{7, 0, 0, 0, 0, 0, 0, 0}},
			{Name: "e", DType: safetensors.BF16, Shape: []int{0, 4}},
		},
		meta: map[string]string{"z": "last", "format": "pt", "q\"\n\x01": "<&>"},
		header: `{"__metadata__":{"format":"pt","q\"\n\u0001":"<&>","z":"last"},` +
			`"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},` +
			`"a":{"dtype":"F32","shape":[],"data_offsets":[8,12]},` +
			`"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]},` +
			`"e":{"dtype":"BF16","shape":[0,4],"data_offsets":[16,16]},` +
			`"u":{"dtype":"U8","shape":[3],"data_offsets":[16,19]}}`,
		data: append(append([]byte{7, 0, 0, 0, 0, 0, 0, 0}, f32s(1, 2)...), 1, 2, 3),
	}, {
		name:   "no tensors",
		header: `{}      `,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := encode(t, tt.tensors, tt.meta)
			h := tt.header
			for len(h)%8 != 0 {
				h += " "
			}
			if want := file(h, tt.data); !bytes.Equal(got, want) {
				t.Fatalf("Encode:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	all := []safetensors.Tensor{
		{Name: "0.weight", DType: safetensors.F32, Shape: []int{2, 3}, Data: f32s(1, 2, 3, 4, 5, 6)},
		{Name: "0.bias", DType: safetensors.F64, Shape: []int{1}, Data: make([]byte, 8)},
		{Name: "h", DType: safetensors.F16, Shape: []int{2}, Data: []byte{0, 0x3c, 0, 0xc0}},
		{Name: "bf", DType: safetensors.BF16, Shape: []int{1, 1}, Data: []byte{0x80, 0x3f}},
		{Name: "i64", DType: safetensors.I64, Shape: []int{}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{Name: "i32", DType: safetensors.I32, Shape: []int{1}, Data: []byte{9, 9, 9, 9}},
		{Name: "i16", DType: safetensors.I16, Shape: []int{1}, Data: []byte{1, 0}},
		{Name: "i8", DType: safetensors.I8, Shape: []int{2}, Data: []byte{0xff, 1}},
		{Name: "u8", DType: safetensors.U8, Shape: []int{3}, Data: []byte{1, 2, 3}},
		{Name: "mask", DType: safetensors.BOOL, Shape: []int{2}, Data: []byte{1, 0}},
		{Name: "empty", DType: safetensors.F32, Shape: []int{3, 0}},
		{Name: "日本", DType: safetensors.U8, Shape: []int{1}, Data: []byte{42}},
	}
	tests := []struct {
		name    string
		tensors []safetensors.Tensor
		meta    map[string]string
	}{
		{"one", all[:1], nil},
		{"every dtype", all, map[string]string{"format": "pt", "note": "ünïcode \u2028"}},
		{"none", nil, map[string]string{"k": "v"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encode(t, tt.tensors, tt.meta)
			if (len(b)-8-len(dataOf(tt.tensors)))%8 != 0 {
				t.Errorf("header length %d not a multiple of 8", binary.LittleEndian.Uint64(b))
			}
			fromBytes, err := safetensors.Decode(b)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			fromReader, err := safetensors.Read(iotest.OneByteReader(bytes.NewReader(b)))
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			for _, f := range []*safetensors.File{fromBytes, fromReader} {
				if !reflect.DeepEqual(f.Metadata, tt.meta) {
					t.Errorf("metadata %v, want %v", f.Metadata, tt.meta)
				}
				if len(f.Tensors) != len(tt.tensors) {
					t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tt.tensors))
				}
				for _, want := range tt.tensors {
					got, ok := f.Lookup(want.Name)
					if !ok {
						t.Fatalf("tensor %q missing", want.Name)
					}
					if got.DType != want.DType || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
						t.Errorf("tensor %q = %v %v %x, want %v %v %x", want.Name, got.DType, got.Shape, got.Data, want.DType, want.Shape, want.Data)
					}
					if f == fromBytes && len(got.Data) > 0 && offsetIn(got.Data, b)%uint64(want.DType.Size()) != 0 {
						t.Errorf("tensor %q not aligned to its element size", want.Name)
					}
				}
			}
			if again := encode(t, fromBytes.Tensors, fromBytes.Metadata); !bytes.Equal(again, b) {
				t.Errorf("re-encoding a decoded file changed its bytes")
			}
		})
	}
}

func dataOf(ts []safetensors.Tensor) []byte {
	var b []byte
	for _, t := range ts {
		b = append(b, t.Data...)
	}
	return b
}

// offsetIn returns the offset of d within the data buffer of file b.
func offsetIn(d []byte, b []byte) uint64 {
	start := 8 + binary.LittleEndian.Uint64(b)
	for i := range b[start:] {
		if &b[int(start)+i] == &d[0] {
			return uint64(i)
		}
	}
	return math.MaxUint64 // not aliased
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []safetensors.Tensor
		meta    map[string]string
		want    error
	}{
		{"reserved name", []safetensors.Tensor{{Name: "__metadata__", DType: safetensors.U8}}, nil, safetensors.ErrName},
		{"repeated name", []safetensors.Tensor{{Name: "a", DType: safetensors.U8, Data: []byte{1}}, {Name: "a", DType: safetensors.U8, Data: []byte{1}}}, nil, safetensors.ErrName},
		{"name not UTF-8", []safetensors.Tensor{{Name: "\xff", DType: safetensors.U8, Data: []byte{1}}}, nil, safetensors.ErrName},
		{"unknown dtype", []safetensors.Tensor{{Name: "a", DType: "F8_E4M3", Data: []byte{1}}}, nil, safetensors.ErrDType},
		{"lower-case dtype", []safetensors.Tensor{{Name: "a", DType: "f32", Data: []byte{1, 2, 3, 4}}}, nil, safetensors.ErrDType},
		{"negative dim", []safetensors.Tensor{{Name: "a", DType: safetensors.U8, Shape: []int{-1}}}, nil, safetensors.ErrShape},
		{"overflowing shape", []safetensors.Tensor{{Name: "a", DType: safetensors.F64, Shape: []int{1 << 31, 1 << 31, 4}}}, nil, safetensors.ErrShape},
		{"short data", []safetensors.Tensor{{Name: "a", DType: safetensors.F32, Shape: []int{2}, Data: f32s(1)}}, nil, safetensors.ErrSize},
		{"long data", []safetensors.Tensor{{Name: "a", DType: safetensors.F32, Data: f32s(1, 2)}}, nil, safetensors.ErrSize},
		{"metadata not UTF-8", nil, map[string]string{"a": "\xfe"}, safetensors.ErrHeader},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := safetensors.Encode(&buf, tt.tensors, tt.meta)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Encode error %v, want %v", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("Encode wrote %d bytes before failing", buf.Len())
			}
		})
	}
	errWrite := errors.New("disk full")
	err := safetensors.Encode(failWriter{errWrite}, []safetensors.Tensor{{Name: "a", DType: safetensors.U8, Shape: []int{1}, Data: []byte{1}}}, nil)
	if !errors.Is(err, errWrite) {
		t.Errorf("Encode to a failing writer: %v, want %v", err, errWrite)
	}
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestDecodeErrors(t *testing.T) {
	four := f32s(1)
	huge := binary.LittleEndian.AppendUint64(nil, math.MaxUint64)
	tests := []struct {
		name string
		file []byte
		opts []safetensors.Option
		want error
		msg  string // a fragment the error must contain
	}{
		{"empty file", nil, nil, safetensors.ErrTruncated, ""},
		{"short length", []byte{1, 0, 0}, nil, safetensors.ErrTruncated, ""},
		{"header length 2^64-1", huge, nil, safetensors.ErrHeaderTooLarge, ""},
		{"header over the cap", file(strings.Repeat(" ", 64), nil), []safetensors.Option{safetensors.WithMaxHeaderSize(63)}, safetensors.ErrHeaderTooLarge, "cap 63"},
		{"header past the end", file("{}", nil)[:9], nil, safetensors.ErrTruncated, ""},
		{"zero-length header", file("", nil), nil, safetensors.ErrHeader, ""},
		{"not JSON", file("hello", nil), nil, safetensors.ErrHeader, ""},
		{"JSON array", file("[]", nil), nil, safetensors.ErrHeader, ""},
		{"unclosed object", file(`{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}`, []byte{1}), nil, safetensors.ErrHeader, ""},
		{"trailing garbage", file(`{} x`, nil), nil, safetensors.ErrHeader, "after the JSON"},
		{"two objects", file(`{}{}`, nil), nil, safetensors.ErrHeader, ""},
		{"invalid UTF-8", file("{\"\xff\":1}", nil), nil, safetensors.ErrHeader, "UTF-8"},
		{"tensor not an object", file(`{"a":[1]}`, nil), nil, safetensors.ErrHeader, `"a"`},
		{"tensor null", file(`{"a":null}`, nil), nil, safetensors.ErrHeader, `"a"`},
		{"no dtype", file(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, "no dtype"},
		{"no shape", file(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, "no shape"},
		{"null shape", file(`{"a":{"dtype":"F32","shape":null,"data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, "null"},
		{"no offsets", file(`{"a":{"dtype":"F32","shape":[1]}}`, four), nil, safetensors.ErrHeader, "no data_offsets"},
		{"dtype a number", file(`{"a":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, ""},
		{"unknown dtype", file(`{"a":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), nil, safetensors.ErrDType, "F8_E5M2"},
		{"lower-case dtype", file(`{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrDType, ""},
		{"negative dim", file(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrShape, ""},
		{"fractional dim", file(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, ""},
		{"dim too large for int64", file(`{"a":{"dtype":"F32","shape":[1e30],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrHeader, ""},
		{"shape product overflows", file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrShape, `"a"`},
		{"bytes overflow", file(`{"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrShape, ""},
		{"negative offset", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, four), nil, safetensors.ErrHeader, ""},
		{"one offset", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}}`, four), nil, safetensors.ErrOffsets, ""},
		{"three offsets", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, four), nil, safetensors.ErrOffsets, ""},
		{"offsets backwards", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, four), nil, safetensors.ErrOffsets, ""},
		{"size not dtype times shape", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrOffsets, "needs 8 bytes"},
		{"gap at start", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32s(1, 2)), nil, safetensors.ErrOffsets, "gap"},
		{"gap between", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, f32s(1, 2, 3)), nil, safetensors.ErrOffsets, `"b" begins at 8, want 4 (a gap)`},
		{"overlap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32s(1, 2)), nil, safetensors.ErrOffsets, "overlap"},
		{"same range twice", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, four), nil, safetensors.ErrOffsets, "overlap"},
		{"repeated name", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, []byte{1, 2}), nil, safetensors.ErrName, "twice"},
		{"metadata repeated", file(`{"__metadata__":{},"__metadata__":{}}`, nil), nil, safetensors.ErrName, ""},
		{"metadata not strings", file(`{"__metadata__":{"a":1}}`, nil), nil, safetensors.ErrHeader, "__metadata__"},
		{"metadata an array", file(`{"__metadata__":["a"]}`, nil), nil, safetensors.ErrHeader, "__metadata__"},
		{"data too short", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, four), nil, safetensors.ErrTruncated, "describes 8"},
		{"data too long", file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32s(1, 2)), nil, safetensors.ErrSize, ""},
		{"data with no tensors", file(`{}`, []byte{0}), nil, safetensors.ErrSize, ""},
		{"data over the cap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32s(1, 2)), []safetensors.Option{safetensors.WithMaxDataSize(4)}, safetensors.ErrSize, "cap 4"},
		{"huge claimed data", file(`{"a":{"dtype":"F32","shape":[1000000000000],"data_offsets":[0,4000000000000]}}`, four), nil, safetensors.ErrTruncated, ""},
		{"bad option", file(`{}`, nil), []safetensors.Option{safetensors.WithMaxHeaderSize(0)}, safetensors.ErrInvalidOption, ""},
		{"bad data option", file(`{}`, nil), []safetensors.Option{safetensors.WithMaxDataSize(-1)}, safetensors.ErrInvalidOption, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := safetensors.Decode(tt.file, tt.opts...)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode error %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Decode error %q does not say %q", err, tt.msg)
			}
			_, err = safetensors.Read(bytes.NewReader(tt.file), tt.opts...)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Read error %v, want %v", err, tt.want)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	tests := []struct {
		name  string
		file  []byte
		names []string // in data order
	}{
		{"whitespace around", file(" \n{ \"a\" : {\"data_offsets\":[0,1],\"shape\":[1],\"dtype\":\"U8\"} }\t  ", []byte{1}), []string{"a"}},
		{"unknown fields ignored", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{}}}`, []byte{1}), []string{"a"}},
		{"out of order keys", file(`{"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1, 2}), []string{"a", "b"}},
		{"empty tensors share an offset", file(`{"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[0,3],"data_offsets":[0,0]}}`, nil), []string{"a", "b"}},
		{"null metadata", file(`{"__metadata__":null}`, nil), nil},
		{"escaped names", file(`{"\u00e9\n":{"dtype":"BOOL","shape":[],"data_offsets":[0,1]}}`, []byte{1}), []string{"é\n"}},
		{"empty name", file(`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}), []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := safetensors.Decode(tt.file)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			var names []string
			for _, x := range f.Tensors {
				names = append(names, x.Name)
			}
			if !reflect.DeepEqual(names, tt.names) {
				t.Errorf("tensors %q, want %q", names, tt.names)
			}
		})
	}
}

// TestReadHostileLengths checks that a reader whose header claims far more
// than it holds fails without allocating what it claims.
func TestReadHostileLengths(t *testing.T) {
	hdr := `{"a":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}}`
	b := file(hdr, []byte{1, 2, 3})
	var err error
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = safetensors.Read(bytes.NewReader(b))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, safetensors.ErrTruncated) {
		t.Fatalf("Read: %v, want ErrTruncated", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Errorf("Read allocated %d bytes for a 3-byte data buffer", got)
	}
	big := binary.LittleEndian.AppendUint64(nil, safetensors.DefaultMaxHeaderSize)
	_, err = safetensors.Read(io.MultiReader(bytes.NewReader(big), strings.NewReader("{")))
	if !errors.Is(err, safetensors.ErrTruncated) {
		t.Fatalf("Read of a 100 MB header that is 1 byte: %v, want ErrTruncated", err)
	}
	errRead := errors.New("disk gone")
	_, err = safetensors.Read(io.MultiReader(bytes.NewReader(file(hdr, nil)), iotest.ErrReader(errRead)))
	if !errors.Is(err, errRead) {
		t.Fatalf("Read with a failing reader: %v, want %v", err, errRead)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(f, []safetensors.Tensor{
		{Name: "0.weight", DType: safetensors.F32, Shape: []int{2, 2}, Data: f32s(1, 2, 3, 4)},
		{Name: "0.bias", DType: safetensors.BF16, Shape: []int{2}, Data: []byte{1, 2, 3, 4}},
		{Name: "m", DType: safetensors.BOOL, Shape: []int{}, Data: []byte{1}},
	}, map[string]string{"format": "pt"}))
	f.Add(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I64","shape":[0],"data_offsets":[4,4]}}`, f32s(1)))
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32s(1)))
	f.Add(file(`{"__metadata__":{"a":"b"}}`, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		opt := safetensors.WithMaxDataSize(1 << 20)
		got, err := safetensors.Decode(b, opt)
		_, rerr := safetensors.Read(bytes.NewReader(b), opt)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("Decode error %v but Read error %v", err, rerr)
		}
		if err != nil {
			return
		}
		var end int
		for _, x := range got.Tensors {
			end += len(x.Data)
		}
		if 8+int(binary.LittleEndian.Uint64(b))+end != len(b) {
			t.Fatalf("decoded tensors do not cover the data buffer")
		}
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, got.Tensors, got.Metadata); err != nil {
			t.Fatalf("re-encode of a decoded file: %v", err)
		}
		again, err := safetensors.Decode(buf.Bytes())
		if err != nil {
			t.Fatalf("decode of the re-encoded file: %v", err)
		}
		if len(again.Tensors) != len(got.Tensors) {
			t.Fatalf("re-encoded %d tensors, decoded %d", len(got.Tensors), len(again.Tensors))
		}
		for _, x := range got.Tensors {
			y, ok := again.Lookup(x.Name)
			if !ok || y.DType != x.DType || !reflect.DeepEqual(y.Shape, x.Shape) || !bytes.Equal(y.Data, x.Data) {
				t.Fatalf("tensor %q changed through a re-encode", x.Name)
			}
		}
	})
}
