package codec

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"unsafe"
)

// The frame encoder must write the very bytes the generic encoder writes.

func TestFrameEncoderCoversFrame(t *testing.T) {
	if frameCodec == nil {
		t.Fatal("Frame or Op has a field of a type the frame encoder does not know (frame_cbor.go): frames fall back to the generic, slower encoder")
	}
}

func encodeBoth(t *testing.T, f *Frame) {
	t.Helper()
	want, err := encMode.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Marshal(CBOR, f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("frame of %d ops: %d bytes, want %d, first difference at byte %d: got %x, want %x",
			len(f.Ops), len(got), len(want), i, got[i:min(i+16, len(got))], want[i:min(i+16, len(want))])
	}
}

var edgeFloats = []float64{
	0, math.Copysign(0, -1), 1, -1, 0.5, 1.5, 1.0 / 3, 65504, 65505, 65520, -65504, 1e-8,
	5.960464477539063e-08, 6.103515625e-05, 6.097555160522461e-05, 3.0517578125e-05, 1e300, -1e-300,
	math.MaxFloat32, math.SmallestNonzeroFloat32, math.SmallestNonzeroFloat64, 16777216, 16777217,
	math.NaN(), math.Inf(1), math.Inf(-1), 0.1, float64(float32(0.1)), 1 << 40,
}

func randFloat(r *rand.Rand) float64 {
	switch r.IntN(4) {
	case 0:
		return edgeFloats[r.IntN(len(edgeFloats))]
	case 1:
		return float64(float32(r.NormFloat64() * 1000))
	case 2:
		return float64(r.IntN(5000)-2500) / 64
	}
	return math.Float64frombits(r.Uint64())
}

func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return int64(r.IntN(50) - 25)
	case 1:
		return []int64{23, 24, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, -24, -25, -256, -257, math.MinInt64, math.MaxInt64}[r.IntN(14)]
	}
	return int64(r.Uint64())
}

// fill sets each field of the struct v points at, or leaves it zero, at
// random.
func fill(r *rand.Rand, v reflect.Value) {
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanSet() || r.IntN(3) == 0 {
			continue
		}
		n := r.IntN(4)
		switch f.Interface().(type) {
		case string:
			f.SetString([]string{"", "add", "matmul", "f32", "héllo", string(make([]byte, 30))}[r.IntN(6)])
		case bool:
			f.SetBool(r.IntN(2) == 0)
		case int:
			f.SetInt(randInt(r))
		case uint64:
			f.SetUint(uint64(randInt(r)))
		case float64:
			f.SetFloat(randFloat(r))
		case []byte:
			if n > 0 {
				b := make([]byte, []int{0, 3, 30, 300}[n])
				f.SetBytes(b)
			} else if r.IntN(2) == 0 {
				f.SetBytes([]byte{})
			}
		case []int:
			s := make([]int, n)
			for j := range s {
				s[j] = int(randInt(r))
			}
			f.Set(reflect.ValueOf(s))
		case []uint64:
			s := make([]uint64, n)
			for j := range s {
				s[j] = uint64(randInt(r))
			}
			f.Set(reflect.ValueOf(s))
		case []float64:
			s := make([]float64, n)
			for j := range s {
				s[j] = randFloat(r)
			}
			f.Set(reflect.ValueOf(s))
		default:
			switch f.Kind() {
			case reflect.Slice:
				s := reflect.MakeSlice(f.Type(), n, n)
				for j := range n {
					fill(r, s.Index(j))
				}
				f.Set(s)
			case reflect.Pointer:
				p := reflect.New(f.Type().Elem())
				fill(r, p.Elem())
				f.Set(p)
			}
		}
	}
}

// finite replaces NaN and infinities in the struct v points at.
func finite(v reflect.Value) {
	for j := range v.NumField() {
		f := v.Field(j)
		switch x := f.Interface().(type) {
		case float64:
			if math.IsNaN(x) || math.IsInf(x, 0) {
				f.SetFloat(1)
			}
		case []float64:
			for k := range x {
				if math.IsNaN(x[k]) || math.IsInf(x[k], 0) {
					x[k] = 2
				}
			}
		default:
			switch f.Kind() {
			case reflect.Slice:
				for k := range f.Len() {
					if f.Index(k).Kind() == reflect.Struct {
						finite(f.Index(k))
					}
				}
			case reflect.Pointer:
				if !f.IsNil() {
					finite(f.Elem())
				}
			}
		}
	}
}

func TestResultEncoderMatches(t *testing.T) {
	if resultCodec == nil {
		t.Fatal("Result has a field of a type the table does not know (frame_cbor.go): results fall back to the generic, slower encoder")
	}
	r := rand.New(rand.NewPCG(7, 8))
	fast := 0
	const n = 3000
	for range n {
		var res Result
		fill(r, reflect.ValueOf(&res).Elem())
		want, err := encMode.Marshal(&res)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := Marshal(CBOR, &res)
		if !bytes.Equal(got, want) {
			t.Fatalf("result %+v: got %x, want %x", res, got, want)
		}
		finite(reflect.ValueOf(&res).Elem())
		data, _ := encMode.Marshal(&res)
		if decodeResultBoth(t, data) {
			fast++
		}
	}
	if fast != n {
		t.Errorf("the table decoded %d of %d results", fast, n)
	}
}

func decodeResultBoth(t *testing.T, data []byte) (fast bool) {
	t.Helper()
	var got, want Result
	ok := decodeResult(data, &got)
	err := decMode.Unmarshal(data, &want)
	if !ok {
		if !reflect.ValueOf(got).IsZero() {
			t.Fatalf("%x: the table gave up and left %+v", data, got)
		}
		return false
	}
	if err != nil {
		t.Fatalf("the table accepted result %x, the generic decoder says: %v", data, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%x: the table gave %+v, the generic decoder %+v", data, got, want)
	}
	return true
}

func TestFrameEncoderMatches(t *testing.T) {
	encodeBoth(t, &Frame{V: Version})
	encodeBoth(t, &Frame{V: Version, Ops: []Op{}})
	encodeBoth(t, &Frame{V: -3, Ops: []Op{{}}})
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		f := &Frame{V: int(randInt(r)), Ops: make([]Op, r.IntN(5))}
		for i := range f.Ops {
			fill(r, reflect.ValueOf(&f.Ops[i]).Elem())
		}
		encodeBoth(t, f)
	}
}

// TestFrameEncoderHalves: every half-precision value, and the single
// precision values around each, take the same form as in the generic
// encoder.
func TestFrameEncoderHalves(t *testing.T) {
	f := &Frame{V: Version, Ops: []Op{{Op: "full"}}}
	for h := range 1 << 16 {
		v := halfToFloat32(uint16(h))
		for _, x := range []float32{v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1)))} {
			f.Ops[0].Value = float64(x)
			want, _ := encMode.Marshal(f)
			got := frameCodec.appendStruct(nil, unsafe.Pointer(f))
			if !bytes.Equal(got, want) {
				t.Fatalf("%v (half %#04x): got %x, want %x", x, h, got, want)
			}
		}
	}
}

func BenchmarkMarshalFrame(b *testing.B) {
	f := &Frame{V: Version, Ops: []Op{{Op: "free", In: []uint64{5}}, {Op: "add", Out: []uint64{6}, In: []uint64{1, 1}}, {Op: "read", In: []uint64{6}, Tag: 7}}}
	b.Run("frame-encoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Marshal(CBOR, f)
		}
	})
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = encMode.Marshal(f)
		}
	})
}

// The frame decoder must decode what it accepts to the value the generic
// decoder gives, and accept what clients write.

func decodeBoth(t *testing.T, data []byte) (fast bool) {
	t.Helper()
	got := new(Frame)
	ok := decodeFrameInto(data, got)
	var want Frame
	err := decMode.Unmarshal(data, &want)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("frame decoder accepted %x, the generic decoder says: %v", data, err)
	}
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("%x: frame decoder gave %+v, generic decoder %+v", data, got, &want)
	}
	// Decoded into the Frame of earlier frames, reusing their ops, it
	// gives the same (an absent ops is then empty rather than nil).
	*reused = Frame{Ops: reused.Ops[:0]}
	if !decodeFrameInto(data, reused) {
		t.Fatalf("%x: the frame decoder refused it into a reused frame", data)
	}
	if len(reused.Ops) == 0 && want.Ops == nil {
		reused.Ops = nil
	}
	if !reflect.DeepEqual(reused, &want) {
		t.Fatalf("%x: frame decoder into a reused frame gave %+v, generic decoder %+v", data, reused, &want)
	}
	if cap(reused.Ops) < 8 {
		reused.Ops = make([]Op, 0, 8) // room for the next frames
	}
	return true
}

// reused is the Frame every decodeBoth decodes into once more: it holds
// the ops of the frames before, which a decode must leave nothing of.
var reused = new(Frame)

func TestFrameDecoderMatches(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fast := 0
	const n = 3000
	for range n {
		f := &Frame{V: int(randInt(r)), Ops: make([]Op, r.IntN(5))}
		for i := range f.Ops {
			v := reflect.ValueOf(&f.Ops[i]).Elem()
			fill(r, v)
			// NaN != NaN, and the decoder leaves NaN and infinities to
			// decMode: keep them out here (the fuzz test has them).
			finite(v)
		}
		data, err := encMode.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if decodeBoth(t, data) {
			fast++
		}
	}
	// Frames without NaN or infinities take the fast path.
	if fast != n {
		t.Errorf("the frame decoder took %d of %d frames", fast, n)
	}
	for _, data := range [][]byte{
		{0xa2, 0x61, 0x76, 0x01, 0x63, 0x6f, 0x70, 0x73, 0x80},                   // {"v":1,"ops":[]}
		{0xa1, 0x61, 0x76, 0x01},                                                 // no ops
		{0xa2, 0x61, 0x76, 0x01, 0x63, 0x6f, 0x70, 0x73, 0xf6},                   // ops null
		{0xa2, 0x61, 0x76, 0x01, 0x61, 0x76, 0x02},                               // v twice
		{0xa2, 0x61, 0x56, 0x01, 0x63, 0x6f, 0x70, 0x73, 0x80},                   // "V"
		{0xa2, 0x61, 0x76, 0x18, 0x01, 0x63, 0x6f, 0x70, 0x73, 0x80},             // 1 in two bytes
		{0xa2, 0x61, 0x76, 0x01, 0x63, 0x6f, 0x70, 0x73, 0x80, 0x00},             // trailing byte
		{0xa1, 0x61, 0x76, 0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // below MinInt64
		{0xbf, 0x61, 0x76, 0x01, 0xff},                                           // indefinite map
	} {
		decodeBoth(t, data)
	}
}

func FuzzFrameDecoder(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		fr := &Frame{V: Version, Ops: make([]Op, r.IntN(3))}
		for i := range fr.Ops {
			fill(r, reflect.ValueOf(&fr.Ops[i]).Elem())
		}
		b, _ := encMode.Marshal(fr)
		f.Add(b)
	}
	for range 20 {
		var res Result
		fill(r, reflect.ValueOf(&res).Elem())
		b, _ := encMode.Marshal(&res)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		decodeBoth(t, data)
		decodeResultBoth(t, data)
	})
}

func BenchmarkDecodeFrame(b *testing.B) {
	f := &Frame{V: Version, Ops: []Op{{Op: "free", In: []uint64{5}}, {Op: "add", Out: []uint64{6}, In: []uint64{1, 1}}, {Op: "read", In: []uint64{6}, Tag: 7}}}
	data, _ := encMode.Marshal(f)
	b.Run("frame-decoder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeFrame(CBOR, data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("generic", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var f Frame
			if err := decMode.Unmarshal(data, &f); err != nil {
				b.Fatal(err)
			}
		}
	})
}
