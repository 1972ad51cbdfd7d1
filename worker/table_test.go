package worker

import (
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/codec"
)

// TestTable runs random sets, deletes and gets against a map: ids in
// order (a window), far apart, below the window, and the window emptied
// and moved.
func TestTable(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var tb table
	ref := map[uint64]entry{}
	next := uint64(1)
	for step := range 200000 {
		var id uint64
		switch k := r.IntN(10); {
		case k < 5:
			id, next = next, next+1+uint64(r.IntN(3))
		case k < 6:
			id = r.Uint64N(1 << 40)
		case k < 8 && len(ref) > 0:
			for id = range ref {
				break
			}
		default:
			id = next - uint64(r.IntN(int(min(next, 5000))))
		}
		switch r.IntN(3) {
		case 0, 1:
			e := entry{fail: &codec.Error{Index: step}}
			tb.set(id, e)
			ref[id] = e
		default:
			tb.del(id)
			delete(ref, id)
		}
		if got, ok := tb.get(id); ok != (ref[id].fail != nil) || got != ref[id] {
			t.Fatalf("step %d: get(%d) = %v, %v; want %v", step, id, got, ok, ref[id])
		}
		if tb.len() != len(ref) {
			t.Fatalf("step %d: len %d, want %d", step, tb.len(), len(ref))
		}
	}
	seen := 0
	for id, e := range tb.all() {
		if ref[id] != e {
			t.Fatalf("all: %d has %v, want %v", id, e, ref[id])
		}
		tb.del(id) // deleting while iterating
		seen++
	}
	if seen != len(ref) || tb.len() != 0 {
		t.Fatalf("all yielded %d of %d; %d left", seen, len(ref), tb.len())
	}
	if tb.has(next - 1) {
		t.Fatal("an entry after deleting them all")
	}
}

// TestTableDeleteAll: deleting every entry while iterating, as closing a
// session does, with a window large enough to be dropped once empty and
// its last entry not at its end.
func TestTableDeleteAll(t *testing.T) {
	var tb table
	const n = 1<<16 + 100
	for id := uint64(1); id <= n; id++ {
		tb.set(id, entry{fail: &codec.Error{Index: int(id)}})
	}
	for id := uint64(n - 50); id <= n; id++ {
		tb.del(id)
	}
	seen := 0
	for id := range tb.all() {
		tb.del(id)
		seen++
	}
	if seen != n-51 || tb.len() != 0 {
		t.Errorf("iterated %d entries, want %d; %d left", seen, n-51, tb.len())
	}
}
