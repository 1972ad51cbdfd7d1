package objectstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/objectstore"
)

// handWriter writes an object in the store's format by hand, so a test
// decides which chunks are stored before a reader subscribes and how the
// live ones are named.
type handWriter struct {
	t     *testing.T
	e     *env
	name  string
	nuid  string
	data  []byte
	chunk int
	crc   bool // the meta carries the data's CRC-32, as Put writes it
}

func (w *handWriter) subject() string { return "$O." + bucket + ".C." + w.nuid }

func (w *handWriter) piece(i int) []byte {
	return w.data[i*w.chunk : min((i+1)*w.chunk, len(w.data))]
}

func (w *handWriter) chunks() int { return (len(w.data) + w.chunk - 1) / w.chunk }

// stored publishes chunks [from, to) and waits for the stream to store them.
func (w *handWriter) stored(from, to int) {
	w.t.Helper()
	for i := from; i < to; i++ {
		if _, err := w.e.js.Publish(context.Background(), w.subject(), w.piece(i)); err != nil {
			w.t.Fatal(err)
		}
	}
}

// live publishes chunk i with reply token tok, as Put does (its ack goes
// to <inbox>.<index>).
func (w *handWriter) live(i int, tok string) {
	w.t.Helper()
	if err := w.e.nc.PublishRequest(w.subject(), "_INBOX.hand."+tok, w.piece(i)); err != nil {
		w.t.Fatal(err)
	}
}

// meta stores the object's meta, which ends it.
func (w *handWriter) meta() {
	w.t.Helper()
	sum := sha256.Sum256(w.data)
	oi := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: w.name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(w.chunk)}},
		Bucket:     bucket,
		NUID:       w.nuid,
		Size:       uint64(len(w.data)),
		Chunks:     uint32(w.chunks()),
		Digest:     "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:]),
	}
	if w.crc {
		oi.Headers = nats.Header{}
		oi.Headers.Set("Jetfabric-Crc32", fmt.Sprintf("%08x", crc32.ChecksumIEEE(w.data)))
	}
	m := nats.NewMsg("$O." + bucket + ".M." + encodeName(w.name))
	m.Header.Set("Nats-Rollup", "sub")
	m.Data = mustJSON(w.t, oi)
	if _, err := w.e.js.PublishMsg(context.Background(), m); err != nil {
		w.t.Fatal(err)
	}
}

// follow starts Follow and returns once it listens on the chunk subject.
func (w *handWriter) follow(s *objectstore.Store, dst []byte) <-chan error {
	w.t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := s.Follow(context.Background(), w.name, w.nuid, dst)
		done <- err
	}()
	w.e.waitSubscribed(w.t, w.subject())
	return done
}

// waitSubscribed returns once a reader listens on subject itself.
func (e *env) waitSubscribed(t *testing.T, subject string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		// The stream's own subscription (to every chunk subject) matches
		// too: look for one to this subject alone.
		sz, err := e.b.Server().Subsz(&server.SubszOptions{Subscriptions: true, Test: subject})
		if err == nil && slices.ContainsFunc(sz.Subs, func(d server.SubDetail) bool { return d.Subject == subject }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reader subscribed to %s", subject)
		}
	}
}

// TestFollowLive: chunks the broker stored before the reader subscribed
// are read from the stream, the rest arrive live, and the meta ends the
// read, with no fallback; checked against the meta's CRC-32, or its
// digest where it has none.
func TestFollowLive(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc %v", crc), func(t *testing.T) { testFollowLive(t, crc) })
	}
}

func testFollowLive(t *testing.T, crc bool) {
	e := newEnv(t)
	s := e.store(t)
	w := &handWriter{t: t, e: e, name: "live", nuid: objectstore.NewNUID(), data: randomBytes(40<<10+77, 9), chunk: 4 << 10, crc: crc}
	w.stored(0, 3)
	fb0, back0, live0 := objectstore.LiveStats()
	dst := make([]byte, len(w.data))
	done := w.follow(s, dst)
	for i := 3; i < w.chunks(); i++ {
		w.live(i, strconv.Itoa(i))
	}
	w.meta()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, w.data) {
		t.Fatal("followed bytes differ")
	}
	fb, back, live := objectstore.LiveStats()
	if fb != fb0 || back-back0 != 3 || live-live0 != int64(w.chunks()-3) {
		t.Fatalf("fallbacks %d, backfilled %d, live %d; want 0, 3, %d", fb-fb0, back-back0, live-live0, w.chunks()-3)
	}
}

// TestFollowLiveFallsBack: live chunks that are not in order (a writer
// that rewound, a reader that dropped some) are given up on, and the
// object is read from the stream instead; chunks that do not match the
// meta fail with ErrDigest.
func TestFollowLiveFallsBack(t *testing.T) {
	e := newEnv(t)
	s := e.store(t)
	for _, tc := range []struct {
		name    string
		toks    func(i int) string
		corrupt bool
	}{
		{"out of order", func(i int) string { return strconv.Itoa(i ^ 1) }, false},
		{"not ours", func(i int) string { return "x" + strconv.Itoa(i) }, false},
		{"corrupt", strconv.Itoa, true},
		{"corrupt, CRC-32", strconv.Itoa, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &handWriter{t: t, e: e, name: "fallback-" + tc.name, nuid: objectstore.NewNUID(), data: randomBytes(32<<10, 5), chunk: 4 << 10,
				crc: strings.HasSuffix(tc.name, "CRC-32")}
			want := bytes.Clone(w.data)
			fb0, _, _ := objectstore.LiveStats()
			dst := make([]byte, len(w.data))
			done := w.follow(s, dst)
			for i := range w.chunks() {
				w.live(i, tc.toks(i))
			}
			if tc.corrupt {
				w.data[5] ^= 1 // the meta's digest (or CRC-32) no longer matches the chunks
			}
			w.meta()
			err := <-done
			fb, _, _ := objectstore.LiveStats()
			switch {
			case tc.corrupt:
				if !errors.Is(err, objectstore.ErrDigest) {
					t.Fatalf("corrupt chunks: %v, want ErrDigest", err)
				}
			case err != nil:
				t.Fatal(err)
			case !bytes.Equal(dst, want):
				t.Fatal("bytes differ after the fallback")
			case fb == fb0:
				t.Fatal("the live read did not fall back")
			}
		})
	}
}

// TestFollowAlias: the reader follows a name announced before the writer
// knew the object's own name; the writer names the object by its digest
// and then links the announced name to it. The live chunks are checked
// against the linked object, with no second read.
func TestFollowAlias(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(16<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := randomBytes(1<<20+3, 11)
	nuid := objectstore.NewNUID()
	fb0, _, live0 := objectstore.LiveStats()
	dst := make([]byte, len(data))
	done := make(chan error, 1)
	go func() {
		_, err := s.Follow(ctx, "alias", nuid, dst)
		done <- err
	}()
	e.waitSubscribed(t, "$O."+bucket+".C."+nuid) // either order must work; this one goes live
	in, err := s.Put(ctx, "", data, nil, objectstore.WithNUID(nuid), objectstore.WithNameFromDigest(func(sum [sha256.Size]byte) string {
		return "content-" + base64.RawURLEncoding.EncodeToString(sum[:8])
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Link(ctx, "alias", in.Name); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !bytes.Equal(dst, data) {
		t.Fatalf("follow of the alias: %v", err)
	}
	if fb, _, live := objectstore.LiveStats(); fb != fb0 || live == live0 {
		t.Fatalf("%d fallbacks, %d chunks live", fb-fb0, live-live0)
	}
	// The alias reads as the object, also through nats.go.
	got, _, err := s.Get(ctx, "alias")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get through the alias: %v", err)
	}
	nb, err := e.obs.GetBytes(ctx, "alias")
	if err != nil || !bytes.Equal(nb, data) {
		t.Fatalf("nats.go get through the alias: %v", err)
	}
	// A link to a link points at the object itself.
	if _, err := s.Link(ctx, "alias2", "alias"); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "alias2"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("get through a link to a link: %v", err)
	}
	// Bad input.
	for what, l := range map[string][2]string{
		"empty name":     {"", in.Name},
		"empty target":   {"x", ""},
		"itself":         {"x", "x"},
		"missing target": {"x", "no-such-object"},
	} {
		if _, err := s.Link(ctx, l[0], l[1]); err == nil {
			t.Errorf("link %s: no error", what)
		}
	}
	if _, err := s.Link(ctx, "x", "no-such-object"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("link to a missing object: %v, want ErrNotFound", err)
	}
}
