package kernels

import "testing"

func TestRandomStream(t *testing.T) {
	for _, c := range []struct{ seed, key uint64 }{{0, 0}, {1, 2}, {1 << 63, 12345}, {^uint64(0), ^uint64(0)}} {
		s := RandomStream(c.seed, c.key)
		for i := range uint64(100) {
			want := mix64(mix64(c.seed^0x6a09e667f3bcc909) ^ mix64(c.key+0x9e3779b97f4a7c15) ^ (i * 0xbf58476d1ce4e5b9))
			if got := RandomAt(s, i*977); got != Random(c.seed, c.key, i*977) {
				t.Fatalf("seed %d key %d i %d: RandomAt %x, Random %x", c.seed, c.key, i*977, got, Random(c.seed, c.key, i*977))
			}
			if got := Random(c.seed, c.key, i); got != want {
				t.Fatalf("seed %d key %d i %d: Random %x, want %x", c.seed, c.key, i, got, want)
			}
		}
	}
}
