package cpu_test

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/kernels/kernelstest"
)

func TestConformance(t *testing.T) {
	kernelstest.RunAll(t, cpu.New(), kernelstest.RequireAll(), kernelstest.Parallel())
}

// TestWrap: a wrapped buffer is the caller's memory, which must be 8-byte
// aligned; freed, it is not handed out again by Alloc.
func TestWrap(t *testing.T) {
	b := cpu.New()
	words := make([]uint64, 4)
	data := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 32)
	buf, err := b.Wrap(data)
	if err != nil {
		t.Fatal(err)
	}
	if h := buf.(interface{ Host() []byte }).Host(); &h[0] != &data[0] || len(h) != 32 {
		t.Fatal("the wrapped buffer is not the caller's memory")
	}
	if _, err := b.Wrap(data[1:9]); !errors.Is(err, kernels.ErrShape) {
		t.Fatalf("wrap of unaligned memory: %v, want ErrShape", err)
	}
	b.Free(buf)
	for range 4 {
		again, err := b.AllocUninit(32)
		if err != nil {
			t.Fatal(err)
		}
		if h := again.(interface{ Host() []byte }).Host(); &h[0] == &data[0] {
			t.Fatal("a freed wrapped buffer was handed out again")
		}
	}
}
