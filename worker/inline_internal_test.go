package worker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
)

// TestInline: a transfer's bytes inline in its announcement decode as the
// JSON decoder would, from the form encodeInline writes and from another
// writer's escapes, for every length's padding; a wrong length or bad
// base64 fails without writing past the destination.
func TestInline(t *testing.T) {
	for n := range 10 {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(251 * (i + 1))
		}
		raw := encodeInline(data)
		std, _ := json.Marshal(data)
		if !bytes.Equal(raw, std) {
			t.Fatalf("%d bytes: encoded %s, the JSON encoder %s", n, raw, std)
		}
		if got, ok := inlineSize(raw); !ok || got != n {
			t.Errorf("%d bytes: inlineSize %d %v", n, got, ok)
		}
		dst := make([]byte, n, n+8)
		if err := decodeInline(raw, dst); err != nil || !bytes.Equal(dst, data) {
			t.Errorf("%d bytes: decoded %v (%v), want %v", n, dst, err, data)
		}
		if tail := dst[n : n+8]; !bytes.Equal(tail, make([]byte, 8)) {
			t.Errorf("%d bytes: written past the destination: %v", n, tail)
		}
		if n == 0 {
			continue
		}
		// Escapes a JSON encoder may write: \/ and the first character as \u00XX.
		escaped := bytes.ReplaceAll(raw, []byte("/"), []byte(`\/`))
		escaped = append([]byte(fmt.Sprintf(`"\u%04x`, raw[1])), escaped[2:]...)
		dst = make([]byte, n)
		if err := decodeInline(escaped, dst); err != nil || !bytes.Equal(dst, data) {
			t.Errorf("%d bytes, escaped %s: decoded %v (%v)", n, escaped, dst, err)
		}
	}
	for _, c := range []struct {
		raw string
		n   int
	}{
		{`"QUFB"`, 1},     // 3 bytes for a destination of 1
		{`"QQ=="`, 2},     // 1 byte for 2
		{`"QUFB"`, 4},     // too short
		{`"QU*B"`, 3},     // not base64
		{`"QUFBQUFB"`, 3}, // too long
		{`QUFB`, 3},       // not a string
		{``, 0},
		{`"\u0051UFB"`, 1}, // escaped, 3 bytes for 1
	} {
		dst := make([]byte, c.n, c.n+8)
		if err := decodeInline(json.RawMessage(c.raw), dst); err == nil {
			t.Errorf("%s into %d bytes: no error", c.raw, c.n)
		}
		if tail := dst[c.n : c.n+8]; !bytes.Equal(tail, make([]byte, 8)) {
			t.Errorf("%s into %d bytes: written past the destination: %v", c.raw, c.n, tail)
		}
	}
	for raw, want := range map[string]bool{"": false, "null": false, `""`: true, `"QQ=="`: true} {
		if got := (&readCount{Data: json.RawMessage(raw)}).inline(); got != want {
			t.Errorf("data %q: inline %v, want %v", raw, got, want)
		}
	}
}

// TestAnnouncementEncode: an announcement encodes as the JSON encoder
// writes it, with and without inline data.
func TestAnnouncementEncode(t *testing.T) {
	for _, rc := range []readCount{
		{Max: 3, Writer: "cpu-2/977/14", DType: "f32", Shape: "4", Data: encodeInline([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64})},
		{Max: 1, Writer: "cpu-0/1842/3", NUID: "ABC", DType: "f32", Shape: "1024,1024"},
		{Max: 1, Writer: "w\"<>&\u2028", Data: json.RawMessage(`"AA=="`)},
	} {
		want, _ := json.Marshal(rc)
		if got := rc.encode(); !bytes.Equal(got, want) {
			t.Errorf("encoded %s, the JSON encoder %s", got, want)
		}
	}
}
