package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/objectstore"
)

func TestPieceRange(t *testing.T) {
	for _, c := range []struct{ n, k int }{{10, 3}, {9, 3}, {2, 2}, {64 << 20, 4}, {100, 64}, {7, 7}} {
		next := 0
		for i := range c.k {
			lo, hi := objectstore.PieceRange(c.n, c.k, i)
			if lo != next || hi <= lo {
				t.Fatalf("%d bytes in %d: piece %d is [%d, %d), want it from %d and not empty", c.n, c.k, i, lo, hi, next)
			}
			next = hi
		}
		if next != c.n {
			t.Fatalf("%d bytes in %d pieces cover %d", c.n, c.k, next)
		}
	}
}

func TestPieces(t *testing.T) {
	lanes := func(e *env, n int) objectstore.Lanes {
		l := make(objectstore.Lanes, n)
		for i := range l {
			l[i] = e.store(t)
		}
		return l
	}
	mem := lanes(newEnv(t, func(c *broker.Config) { c.Provision.XferStorage = jetstream.MemoryStorage }), 4)
	for _, c := range []struct{ n, limit, want int }{
		{64 << 20, 4, 4}, {64 << 20, 2, 2}, {64 << 20, 0, 1}, {2*objectstore.MinPiece - 1, 4, 1}, {3 * objectstore.MinPiece, 64, 3}, {1 << 30, 64, 4},
	} {
		if got := mem.Pieces(c.n, c.limit); got != c.want {
			t.Errorf("Pieces(%d, %d) on 4 lanes: %d, want %d", c.n, c.limit, got, c.want)
		}
	}
	if got := mem[:1].Pieces(1<<30, 64); got != 1 {
		t.Errorf("one lane cuts %d pieces", got)
	}
	if got := lanes(newEnv(t), 4).Pieces(1<<30, 64); got != 1 {
		t.Errorf("a bucket on file is cut in %d pieces, want 1 (whole)", got)
	}
	if _, err := objectstore.NewLanes(nil, bucket); !errors.Is(err, objectstore.ErrInvalidOption) {
		t.Errorf("lanes of no connection: %v", err)
	}
}

// TestLanes writes an object as pieces, each on a connection of its own,
// while a reader follows them on lanes of its own; the bytes, the pieces'
// names and every bad argument are checked.
func TestLanes(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lanes := func(n int) objectstore.Lanes {
		l := make(objectstore.Lanes, n)
		for i := range l {
			l[i] = e.second(t).store(t, objectstore.WithChunkSize(64<<10))
		}
		return l
	}
	w, r := lanes(3), lanes(2)
	data := randomBytes(1<<20+3, 7)
	for _, k := range []int{2, 3, 5} {
		nuid := objectstore.NewNUID()
		dst := make([]byte, len(data))
		done := make(chan error, 1)
		go func() { done <- r.Follow(ctx, "obj", nuid, k, dst) }()
		if err := w.Put(ctx, "obj", nuid, k, data, map[string]string{"k": "v"}); err != nil {
			t.Fatalf("%d pieces: %v", k, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("follow %d pieces: %v", k, err)
		}
		if !bytes.Equal(dst, data) {
			t.Fatalf("%d pieces: the bytes read differ", k)
		}
		for i := range k {
			lo, hi := objectstore.PieceRange(len(data), k, i)
			info, err := w[0].Stat(ctx, objectstore.PieceName("obj", i))
			if err != nil || info.Size != int64(hi-lo) || info.Meta["k"] != "v" || e.chunkCount(t, objectstore.PieceNUID(nuid, i)) == 0 {
				t.Fatalf("piece %d of %d: %+v, %v (or no chunks on %s)", i, k, info, err, objectstore.PieceNUID(nuid, i))
			}
		}
		if err := r.Discard(ctx, "obj", nuid, k); err != nil {
			t.Fatal(err)
		}
		if _, err := w[1].Stat(ctx, objectstore.PieceName("obj", k-1)); !errors.Is(err, objectstore.ErrNotFound) {
			t.Fatalf("piece %d after Discard: %v", k-1, err)
		}
		if n := e.chunkCount(t, objectstore.PieceNUID(nuid, 0)); n != 0 {
			t.Fatalf("piece 0's chunks after Discard: %d, want none", n)
		}
	}

	// A piece aborted ends the reader with its reason, and no piece
	// holds it longer.
	nuid := objectstore.NewNUID()
	done := make(chan error, 1)
	go func() { done <- r.Follow(ctx, "gone", nuid, 3, make([]byte, 300)) }()
	lo, hi := objectstore.PieceRange(300, 3, 0)
	if _, err := w[0].Put(ctx, objectstore.PieceName("gone", 0), data[lo:hi], nil, objectstore.WithNUID(objectstore.PieceNUID(nuid, 0))); err != nil {
		t.Fatal(err)
	}
	w.Abort(ctx, "gone", nuid, 3, "the writer gave up")
	if err := <-done; !errors.Is(err, objectstore.ErrNotFound) || !strings.Contains(err.Error(), "the writer gave up") {
		t.Fatalf("follow of aborted pieces: %v", err)
	}

	for name, err := range map[string]error{
		"one piece":    w.Put(ctx, "x", nuid, 1, data, nil),
		"65 pieces":    w.Put(ctx, "x", nuid, 65, data, nil),
		"over bytes":   w.Put(ctx, "x", nuid, 4, data[:3], nil),
		"bad token":    w.Put(ctx, "x", "no.dots", 2, data, nil),
		"long token":   r.Follow(ctx, "x", strings.Repeat("n", 63), 12, make([]byte, 100)),
		"follow 0":     r.Follow(ctx, "x", nuid, 0, make([]byte, 100)),
		"follow empty": r.Follow(ctx, "x", nuid, 2, nil),
	} {
		if !errors.Is(err, objectstore.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}
