//go:build cgo && linux

package cuda

import (
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestQueuedReuse runs a chain of adds, each input freed as soon as the
// next op is queued: freed blocks are handed out again while the launches
// that read them have not been issued yet, and the result must still be
// the chain's.
func TestQueuedReuse(t *testing.T) {
	b := newBackend(t)
	one := tensor(t, b, kernels.Float32, []int{3}, []float64{1, 2, 3})
	alloc := func() *kernels.Tensor {
		buf, err := b.Alloc(12)
		if err != nil {
			t.Fatal(err)
		}
		return &kernels.Tensor{Meta: one.Meta, Buf: buf}
	}
	x := alloc()
	if err := b.Exec(&kernels.Op{Name: kernels.OpFull, Shape: []int{3}, DType: kernels.Float32}, nil, []*kernels.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	for range n {
		y := alloc()
		if err := b.Exec(&kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x, one}, []*kernels.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		b.Free(x.Buf)
		x = y
	}
	got := values(t, b, x)
	for i, v := range got {
		if want := float64(n * (i + 1)); v != want {
			t.Fatalf("element %d is %v, want %v", i, v, want)
		}
	}
	b.Free(x.Buf)
}

// TestAsyncError checks that a queued device call that fails is reported
// once, by the next call that waits, naming its op.
func TestAsyncError(t *testing.T) {
	b := newBackend(t)
	boom := errors.New("boom")
	fail := func(op string) {
		t.Helper()
		b.mu.Lock()
		err := b.queue(op, func() error {
			b.record(func() error { return boom })
			return nil
		})
		b.mu.Unlock()
		if err != nil {
			t.Fatalf("queueing %s: %v", op, err)
		}
	}
	x := tensor(t, b, kernels.Float32, []int{2}, []float64{1, 2})
	for _, c := range []struct {
		name string
		wait func() error
	}{
		{"sync", b.Sync},
		{"download", func() error { return b.Download(make([]byte, 8), x.Buf) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fail("exp")
			fail("log") // reported with the first
			err := c.wait()
			var ae *AsyncError
			if !errors.As(err, &ae) || ae.Op != "exp" || !errors.Is(err, boom) {
				t.Fatalf("%s after a failed launch: %v, want an AsyncError naming exp", c.name, err)
			}
			if err := c.wait(); err != nil {
				t.Fatalf("%s again: %v, want nil: the failure is reported once", c.name, err)
			}
		})
	}
	// A failed plan queues nothing.
	b.mu.Lock()
	err := b.queue("neg", func() error {
		b.record(func() error { return boom })
		return kernels.ErrShape
	})
	b.mu.Unlock()
	if !errors.Is(err, kernels.ErrShape) {
		t.Fatalf("failed plan: %v", err)
	}
	if err := b.Sync(); err != nil {
		t.Fatalf("sync after a failed plan: %v, want nil", err)
	}
}
