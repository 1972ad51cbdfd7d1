package objectstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/objectstore"
)

// TestFollowWhileWriting starts the reader before the writer: it must
// read every byte as the chunks are stored and end at the meta.
func TestFollowWhileWriting(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := randomBytes(5<<20+123, 3)
	nuid := objectstore.NewNUID()
	dst := make([]byte, len(data))
	type res struct {
		in  objectstore.Info
		err error
	}
	done := make(chan res, 1)
	fb0, _, live0 := objectstore.LiveStats()
	go func() {
		in, err := s.Follow(ctx, "live", nuid, dst)
		done <- res{in, err}
	}()
	e.waitSubscribed(t, "$O."+bucket+".C."+nuid) // the reader first (either order must work)
	put, err := s.Put(ctx, "live", data, map[string]string{"k": "v"}, objectstore.WithNUID(nuid))
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !bytes.Equal(dst, data) {
		t.Fatal("followed bytes differ from the written ones")
	}
	if r.in.SHA256 != put.SHA256 || r.in.Size != int64(len(data)) || r.in.Meta["k"] != "v" {
		t.Fatalf("info %+v, put %+v", r.in, put)
	}
	// Put names its chunks for a live reader: none fell back.
	if fb, _, live := objectstore.LiveStats(); fb != fb0 || live == live0 {
		t.Fatalf("live read: %d fallbacks, %d chunks live", fb-fb0, live-live0)
	}
	// The object is complete now: following it again reads it from the start.
	clear(dst)
	if _, err := s.Follow(ctx, "live", nuid, dst); err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("follow of a complete object: %v", err)
	}
}

// TestFollowFallsBack: a writer that did not use the announced subject
// (or wrote other bytes) is read again from its meta.
func TestFollowFallsBack(t *testing.T) {
	e := newEnv(t)
	s := e.store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := randomBytes(1<<20, 4)
	if _, err := s.Put(ctx, "other-subject", data, nil); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, len(data))
	if _, err := s.Follow(ctx, "other-subject", objectstore.NewNUID(), dst); err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("follow of an object on another subject: %v", err)
	}
	// Wrong size: the fallback reports it.
	if _, err := s.Follow(ctx, "other-subject", objectstore.NewNUID(), make([]byte, 10)); !errors.Is(err, objectstore.ErrSize) {
		t.Fatalf("follow into a short buffer: %v, want ErrSize", err)
	}
}

func TestFollowAbortAndBadInput(t *testing.T) {
	e := newEnv(t)
	s := e.store(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nuid := objectstore.NewNUID()
	done := make(chan error, 1)
	go func() {
		_, err := s.Follow(ctx, "doomed", nuid, make([]byte, 100))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := s.Abort(ctx, "doomed", nuid, "device out of memory"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, objectstore.ErrNotFound) || !strings.Contains(err.Error(), "device out of memory") {
		t.Fatalf("follow of an aborted object: %v", err)
	}
	if _, _, err := s.Get(ctx, "doomed"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("get of an aborted object: %v", err)
	}

	for _, bad := range []string{"", "a.b", "a*", ">", "with space", strings.Repeat("x", 65)} {
		if _, err := s.Follow(ctx, "x", bad, nil); !errors.Is(err, objectstore.ErrInvalidOption) {
			t.Errorf("follow with chunk token %q: %v, want ErrInvalidOption", bad, err)
		}
		if _, err := s.Put(ctx, "x", []byte("x"), nil, objectstore.WithNUID(bad)); bad != "" && !errors.Is(err, objectstore.ErrInvalidOption) {
			t.Errorf("put with chunk token %q: %v, want ErrInvalidOption", bad, err)
		}
	}

	// Nothing ever written: the context ends the wait.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := s.Follow(short, "never", objectstore.NewNUID(), make([]byte, 8)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("follow of an object never written: %v, want a deadline error", err)
	}
}

// TestPutWithSHA256 skips hashing; a wrong digest is caught by readers.
func TestPutWithSHA256(t *testing.T) {
	e := newEnv(t)
	s := e.store(t)
	ctx := context.Background()
	data := randomBytes(700<<10, 5)
	in, err := s.Put(ctx, "given", data, nil, objectstore.WithSHA256(sha256.Sum256(data)))
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "given"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %v", err)
	}
	if in.SHA256 == "" {
		t.Fatal("no digest in the info")
	}
	if _, err := s.Put(ctx, "lied", data, nil, objectstore.WithSHA256(sha256.Sum256([]byte("other")))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "lied"); !errors.Is(err, objectstore.ErrDigest) {
		t.Fatalf("get of an object put with a wrong digest: %v, want ErrDigest", err)
	}
	// nats.go reads our objects too.
	if got, err := e.obs.GetBytes(ctx, "given"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("nats.go get: %v", err)
	}
}

// TestFollowStalledWriter: a writer that announced a subject and stopped
// does not hold the reader until its context ends.
func TestFollowStalledWriter(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithTimeout(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := s.Follow(ctx, "stalled", objectstore.NewNUID(), make([]byte, 8))
	if !errors.Is(err, objectstore.ErrStalled) || ctx.Err() != nil || !strings.Contains(err.Error(), "writer stopped") {
		t.Fatalf("follow of a stalled writer: %v after %v", err, time.Since(start))
	}
}

// TestPutNamedFromDigest: the object gets its name from its digest, known
// before the write ends, and a reader that learns the name then follows
// the rest of the write. Bad input: a name or a digest beside the option,
// and an empty name from it, fail the Put and leave nothing stored.
func TestPutNamedFromDigest(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := randomBytes(3<<20+5, 7)
	sum := sha256.Sum256(data)
	nuid := objectstore.NewNUID()
	named := make(chan string, 1)
	nameOf := func(got [sha256.Size]byte) string {
		name := "by-digest-" + string(rune('a'+got[0]%26))
		named <- name
		return name
	}
	type res struct {
		in  objectstore.Info
		err error
	}
	put := make(chan res, 1)
	go func() {
		in, err := s.Put(ctx, "", data, nil, objectstore.WithNUID(nuid), objectstore.WithNameFromDigest(nameOf))
		put <- res{in, err}
	}()
	name := <-named
	if want := "by-digest-" + string(rune('a'+sum[0]%26)); name != want {
		t.Fatalf("named %q, want %q", name, want)
	}
	dst := make([]byte, len(data))
	in, err := s.Follow(ctx, name, nuid, dst)
	if err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("follow by the name from the digest: %v", err)
	}
	r := <-put
	if r.err != nil || r.in.Name != name || r.in.SHA256 != in.SHA256 {
		t.Fatalf("put: %+v, %v; followed %+v", r.in, r.err, in)
	}
	got, _, err := s.Get(ctx, name)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get: %v", err)
	}

	name2 := func([sha256.Size]byte) string { return "x" }
	for what, put := range map[string]func() error{
		"a name beside it": func() error {
			_, err := s.Put(ctx, "named", data, nil, objectstore.WithNameFromDigest(name2))
			return err
		},
		"a digest beside it": func() error {
			_, err := s.Put(ctx, "", data, nil, objectstore.WithNameFromDigest(name2), objectstore.WithSHA256(sum))
			return err
		},
		"no name at all": func() error {
			_, err := s.Put(ctx, "", data, nil)
			return err
		},
	} {
		if err := put(); !errors.Is(err, objectstore.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", what, err)
		}
	}
	empty := objectstore.NewNUID()
	_, err = s.Put(ctx, "", data, nil, objectstore.WithNUID(empty), objectstore.WithNameFromDigest(func([sha256.Size]byte) string { return "" }))
	if !errors.Is(err, objectstore.ErrInvalidOption) || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty name from the digest: %v", err)
	}
	if n := e.chunkCount(t, empty); n != 0 {
		t.Fatalf("a failed put left %d chunks", n)
	}
}

// TestPutSameContentKeepsObject: a write named by its content whose bytes
// are stored under that name already stops, purges its own chunks and
// returns the stored object, whose chunks a reader may be copying.
func TestPutSameContentKeepsObject(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := randomBytes(2<<20, 9)
	nameOf := func([sha256.Size]byte) string { return "same" }
	first, err := s.Put(ctx, "", data, nil, objectstore.WithNameFromDigest(nameOf))
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.Stat(ctx, "same")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		nuid := objectstore.NewNUID()
		in, err := s.Put(ctx, "", data, nil, objectstore.WithNUID(nuid), objectstore.WithNameFromDigest(nameOf))
		if err != nil || in.SHA256 != first.SHA256 || in.Name != "same" {
			t.Fatalf("put %d of the same bytes: %+v, %v", i, in, err)
		}
		if n := e.chunkCount(t, nuid); n != 0 {
			t.Fatalf("put %d left %d chunks of its own", i, n)
		}
	}
	got, in, err := s.Get(ctx, "same")
	if err != nil || !bytes.Equal(got, data) || !in.ModTime.Equal(stored.ModTime) {
		t.Fatalf("get after the same puts: %+v %v (first %+v)", in, err, stored)
	}
}
