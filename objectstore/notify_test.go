package objectstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/objectstore"
)

// TestNotify: objects stored under the prefix are reported with their
// size as their metas are stored, once each; others, deletions, and
// objects stored after stop are not.
func TestNotify(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan string, 16)
	sizes := map[string]int64{}
	stop, err := s.Notify("ckpt-a-", func(name string, size int64) {
		sizes[name] = size // one goroutine calls it
		got <- name
	})
	if err != nil {
		t.Fatal(err)
	}
	// The subscription and the puts share the store's connection: the
	// server has the one before the others.
	for _, p := range []struct {
		name string
		n    int
	}{{"ckpt-b-1", 10}, {"ckpt-a-1", 200 << 10}, {"other", 5}, {"ckpt-a-2", 0}} {
		if _, err := s.Put(ctx, p.name, randomBytes(p.n, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, "ckpt-a-1"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ckpt-a-1", "ckpt-a-2"} {
		select {
		case name := <-got:
			if name != want {
				t.Fatalf("notified of %q, want %q", name, want)
			}
		case <-ctx.Done():
			t.Fatalf("no notice of %s", want)
		}
	}
	if sizes["ckpt-a-1"] != 200<<10 || sizes["ckpt-a-2"] != 0 {
		t.Fatalf("sizes notified: %v", sizes)
	}
	stop()
	// A second notice on the same connection: once it has ckpt-a-3, the
	// first would have had it too, were it still subscribed.
	marker := make(chan string, 1)
	stop2, err := s.Notify("ckpt-a-3", func(name string, _ int64) { marker <- name })
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if _, err := s.Put(ctx, "ckpt-a-3", randomBytes(3, 1), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-marker:
	case <-ctx.Done():
		t.Fatal("no notice of ckpt-a-3 on the second notice")
	}
	select {
	case name := <-got:
		t.Fatalf("notified of %q after stop (or of the deletion)", name)
	default:
	}
}
