package objectstore

import (
	"bytes"
	"testing"
)

// TestPrefault: faulting a destination's pages in leaves its bytes as they
// were, for destinations of every length and alignment around a page, and
// for none at all.
func TestPrefault(t *testing.T) {
	buf := make([]byte, 3*prefaultMin+3*int(pageSize))
	for i := range buf {
		buf[i] = byte(i*7 + i>>12)
	}
	want := bytes.Clone(buf)
	for _, c := range []struct{ from, to int }{
		{0, 0}, {0, 1}, {5, 5}, {0, prefaultMin - 1}, {0, prefaultMin}, {1, prefaultMin + 1},
		{int(pageSize) - 1, prefaultMin + int(pageSize) + 1}, {3, len(buf) - 3}, {0, len(buf)},
	} {
		prefault(buf[c.from:c.to])
		if !bytes.Equal(buf, want) {
			t.Fatalf("prefault of [%d:%d] changed the buffer", c.from, c.to)
		}
	}
	prefault(nil)
	fresh := make([]byte, 2*prefaultMin)
	prefault(fresh[1:])
	if !bytes.Equal(fresh, make([]byte, len(fresh))) {
		t.Fatal("prefault of a fresh buffer left bytes that are not zero")
	}
}
