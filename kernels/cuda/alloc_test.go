//go:build cgo && linux

package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// fakeDriver hands out addresses from a counter, with a byte budget.
type fakeDriver struct {
	next, budget, used int
	live               map[uint64]int
	allocs             int
}

func (f *fakeDriver) alloc(n int) (uint64, error) {
	if f.used+n > f.budget {
		return 0, &Error{Library: "cuda", Call: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	}
	f.allocs++
	p := uint64(f.next)
	f.next += n + 4096
	f.used += n
	f.live[p] = n
	return p, nil
}

func (f *fakeDriver) release(p uint64) error {
	n, ok := f.live[p]
	if !ok {
		return fmt.Errorf("free of %#x, not allocated", p)
	}
	delete(f.live, p)
	f.used -= n
	return nil
}

func newFakeAllocator(budget int) (*allocator, *fakeDriver) {
	f := &fakeDriver{next: 1 << 20, budget: budget, live: map[uint64]int{}}
	a := &allocator{memAlloc: f.alloc, memFree: f.release}
	a.init()
	return a, f
}

// get is Backend.alloc without a device thread.
func (a *allocator) get(n int) (uint64, int, error) {
	c := sizeClass(n)
	if p, ok := a.take(c); ok {
		return p, c, nil
	}
	p, err := a.grow(c, func() error { return nil })
	return p, c, err
}

func TestAllocatorSlabs(t *testing.T) {
	a, f := newFakeAllocator(1 << 30)
	per := slabBytes / 512
	seen := map[uint64]bool{}
	var ptrs []uint64
	for range 2*per + 1 {
		p, c, err := a.get(4)
		if err != nil {
			t.Fatal(err)
		}
		if c != 512 || seen[p] {
			t.Fatalf("block %#x of class %d: class 512 and distinct blocks wanted", p, c)
		}
		seen[p] = true
		ptrs = append(ptrs, p)
	}
	if f.allocs != 3 {
		t.Fatalf("%d driver allocations for %d small blocks, want 3 slabs", f.allocs, 2*per+1)
	}
	if ptrs[1] != ptrs[0]+512 {
		t.Errorf("blocks of a slab are handed out at %#x then %#x, want in address order", ptrs[0], ptrs[1])
	}
	// A large block is its own allocation.
	if _, c, err := a.get(1 << 20); err != nil || c != 1<<20 || f.allocs != 4 {
		t.Fatalf("large block: class %d, %d driver allocations, %v", c, f.allocs, err)
	}
	// Trim frees only the slabs whose blocks are all cached.
	for _, p := range ptrs[:per] {
		a.put(p, 512)
	}
	a.put(ptrs[per], 512)
	if n := a.trim(); n != slabBytes {
		t.Fatalf("trim gave back %d bytes, want one slab's %d", n, slabBytes)
	}
	if len(a.slabs) != 2 || f.used != 2*slabBytes+1<<20 {
		t.Fatalf("after trim: %d slabs, %d bytes with the driver; want 2 slabs and the large block", len(a.slabs), f.used)
	}
	// Left cached: one block of the second slab, the rest of the third.
	if want := per * 512; a.cached != want || len(a.free[512]) != per {
		t.Fatalf("after trim: %d bytes and %d blocks cached, want %d and %d", a.cached, len(a.free[512]), want, per)
	}
	// Close returns every slab, blocks in use too; a large block in use
	// goes with the context.
	a.close()
	if f.used != 1<<20 {
		t.Fatalf("after close: %d bytes with the driver, want the large block's", f.used)
	}
}

func TestAllocatorOutOfMemory(t *testing.T) {
	a, f := newFakeAllocator(3 << 20)
	big, _, err := a.get(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	a.put(big, 2<<20)
	// A slab does not fit beside the cached block: it is released, and
	// the slab allocated.
	if _, _, err := a.get(8); err != nil {
		t.Fatal(err)
	}
	if len(a.free[2<<20]) != 0 || f.used != slabBytes {
		t.Fatalf("cached block kept (%d bytes with the driver)", f.used)
	}
	if _, _, err := a.get(4 << 20); !errors.Is(err, kernels.ErrOutOfMemory) {
		t.Fatalf("allocation over the budget: %v, want ErrOutOfMemory", err)
	}
}
