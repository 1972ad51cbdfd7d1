package cpu_test

import (
	"testing"
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels/cpu"
)

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestCacheReuse: a freed large buffer comes back for the next buffer of
// its size, cleared by Alloc and as it was by AllocUninit; small buffers
// and a zero budget are never cached.
func TestCacheReuse(t *testing.T) {
	b := cpu.New()
	const n = 4 << 20
	x, err := b.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	h := x.(*cpu.Buffer).Host()
	for i := range h {
		h[i] = 0xAB
	}
	p := addr(h)
	b.Free(x)
	if x.(*cpu.Buffer).Host() != nil {
		t.Fatal("a freed buffer still shows its memory")
	}
	y, _ := b.Alloc(n)
	hy := y.(*cpu.Buffer).Host()
	if addr(hy) != p {
		t.Fatal("a freed buffer of the same size was not reused")
	}
	for i, v := range hy {
		if v != 0 {
			t.Fatalf("reused buffer not cleared at byte %d: %#x", i, v)
		}
	}
	hy[7] = 0xCD
	b.Free(y)
	z, _ := b.AllocUninit(n)
	if hz := z.(*cpu.Buffer).Host(); addr(hz) != p || hz[7] != 0xCD {
		t.Fatal("AllocUninit did not reuse the buffer as it was")
	}
	// Another size is a fresh allocation.
	w, _ := b.Alloc(n + 8)
	if addr(w.(*cpu.Buffer).Host()) == p {
		t.Fatal("a buffer in use was handed out again")
	}

	none := cpu.New(cpu.WithCache(0))
	a, _ := none.Alloc(n)
	pa := addr(a.(*cpu.Buffer).Host())
	none.Free(a)
	if c, _ := none.Alloc(n); addr(c.(*cpu.Buffer).Host()) == pa {
		t.Error("a backend without a cache reused memory")
	}

	// The budget: two 4 MiB buffers in a 6 MiB cache keep one.
	small := cpu.New(cpu.WithCache(6 << 20))
	a1, _ := small.Alloc(n)
	a2, _ := small.Alloc(n)
	p1, p2 := addr(a1.(*cpu.Buffer).Host()), addr(a2.(*cpu.Buffer).Host())
	small.Free(a1)
	small.Free(a2)
	r1, _ := small.Alloc(n)
	r2, _ := small.Alloc(n)
	q1, q2 := addr(r1.(*cpu.Buffer).Host()), addr(r2.(*cpu.Buffer).Host())
	if (q1 == p1 || q1 == p2) == (q2 == p1 || q2 == p2) {
		t.Errorf("a 6 MiB cache reused %v and %v of two 4 MiB buffers; want exactly one", q1 == p1 || q1 == p2, q2 == p1 || q2 == p2)
	}
}

// TestCacheTrim: Trim gives back what the cache kept.
func TestCacheTrim(t *testing.T) {
	b := cpu.New()
	const n = 4 << 20
	x, err := b.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	b.Free(x)
	if got := b.Trim(); got != n {
		t.Fatalf("Trim = %d, want %d", got, n)
	}
	if got := b.Trim(); got != 0 {
		t.Fatalf("second Trim = %d, want 0", got)
	}
}
