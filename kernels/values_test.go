package kernels

import (
	"math"
	"testing"
)

func TestHalfRoundTrip(t *testing.T) {
	// Every f16 value converts to f32 and back unchanged.
	for h := range 1 << 16 {
		f := Float16ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := Float32ToFloat16(f); got != uint16(h) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, got)
		}
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {1e6, 0x7c00}, {5.960464477539063e-08, 0x0001}, {1e-10, 0}} {
		if got := Float32ToFloat16(c.f); got != c.want {
			t.Errorf("f16(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	for _, c := range []struct {
		f    float32
		want uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {1.00390625, 0x3f80}, {1.01171875, 0x3f82}} {
		if got := Float32ToBFloat16(c.f); got != c.want {
			t.Errorf("bf16(%v) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
}

func TestEncodeValues(t *testing.T) {
	for _, dt := range []DType{Float32, Float64, Float16, BFloat16, Int32, Int64, Uint8, Bool} {
		b, err := EncodeValues(dt, []float64{0, 1, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		v, err := DecodeValues(dt, b)
		if err != nil {
			t.Fatal(err)
		}
		want := []float64{0, 1, 2, 3}
		if dt == Bool {
			want = []float64{0, 1, 1, 1}
		}
		for i := range want {
			if v[i] != want[i] {
				t.Errorf("%v: %v, want %v", dt, v, want)
				break
			}
		}
	}
	if _, err := DecodeValues(Float32, []byte{1, 2, 3}); err == nil {
		t.Error("3 bytes decoded as f32")
	}
	if _, err := EncodeValues(Invalid, []float64{1}); err == nil {
		t.Error("encoded to an invalid dtype")
	}
	b, _ := EncodeValues(Int32, []float64{1e20, -1e20, math.NaN(), -2.7})
	v, _ := DecodeValues(Int32, b)
	if v[0] != math.MaxInt32 || v[1] != math.MinInt32 || v[2] != 0 || v[3] != -2 {
		t.Errorf("int32 saturation: %v", v)
	}
}
