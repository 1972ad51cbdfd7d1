package objectstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

var bucket = subjects.Default().XferBucket()

type env struct {
	b   *broker.Broker
	nc  *nats.Conn
	js  jetstream.JetStream
	obs jetstream.ObjectStore // nats.go's view of the same bucket
	str jetstream.Stream
}

func newEnv(t testing.TB, edit ...func(*broker.Config)) *env {
	t.Helper()
	e := (&env{b: brokertest.Run(t, edit...)}).second(t)
	ctx := context.Background()
	var err error
	if e.obs, err = e.js.ObjectStore(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if e.str, err = e.js.Stream(ctx, "OBJ_"+bucket); err != nil {
		t.Fatal(err)
	}
	return e
}

// second is another client of e's broker, on a connection of its own,
// sharing e's views of the bucket.
func (e *env) second(t testing.TB) *env {
	t.Helper()
	nc, err := nats.Connect(e.b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{b: e.b, nc: nc, js: js, obs: e.obs, str: e.str}
}

func (e *env) store(t testing.TB, opts ...objectstore.Option) *objectstore.Store {
	t.Helper()
	s, err := objectstore.New(e.js, bucket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// chunkCount is how many messages a chunk subject holds.
func (e *env) chunkCount(t testing.TB, nuid string) uint64 {
	t.Helper()
	subj := "$O." + bucket + ".C." + nuid
	si, err := e.str.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return si.State.Subjects[subj]
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 17))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n - n%8; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// checkFor polls fn every step until it returns nil or total passes.
var checkFor = poll.Until

func TestRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const chunk = objectstore.DefaultChunkSize
	stores := map[string]*objectstore.Store{
		"default": e.store(t),
		// Small chunks and a small read-ahead: many chunks, many batches.
		"4KiB-chunks": e.store(t, objectstore.WithChunkSize(4<<10), objectstore.WithReadAhead(64<<10), objectstore.WithWindow(7)),
	}
	for sname, s := range stores {
		cs := chunk
		if sname != "default" {
			cs = 4 << 10
		}
		for _, tc := range []struct {
			name string
			size int
		}{
			{"0B", 0},
			{"1B", 1},
			{"chunk-1", cs - 1},
			{"chunk", cs},
			{"chunk+1", cs + 1},
			{"10MiB", 10 << 20},
		} {
			t.Run(sname+"/"+tc.name, func(t *testing.T) {
				name := fmt.Sprintf("rt-%s-%s", sname, tc.name)
				data := randomBytes(tc.size, uint64(tc.size))
				meta := map[string]string{"dtype": "f32", "shape": "2,3"}
				in, err := s.Put(ctx, name, data, meta)
				if err != nil {
					t.Fatal(err)
				}
				want := objectstore.Info{Name: name, Size: int64(tc.size), SHA256: hexSum(data), Meta: meta}
				checkInfo(t, "Put", in, want)

				st, err := s.Stat(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				checkInfo(t, "Stat", st, want)
				if st.ModTime.IsZero() {
					t.Error("Stat: no ModTime")
				}

				got, gin, err := s.Get(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				checkInfo(t, "Get", gin, want)
				if !bytes.Equal(got, data) {
					t.Fatalf("Get returned different bytes (%d, want %d)", len(got), len(data))
				}

				dst := make([]byte, tc.size)
				if _, err := s.GetInto(ctx, name, dst); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(dst, data) {
					t.Fatal("GetInto returned different bytes")
				}

				// nats.go reads our object.
				theirs, err := e.obs.GetBytes(ctx, name)
				if err != nil {
					t.Fatalf("nats.go GetBytes: %v", err)
				}
				if !bytes.Equal(theirs, data) {
					t.Fatal("nats.go read different bytes")
				}
				oi, err := e.obs.GetInfo(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if oi.Size != uint64(tc.size) || oi.Metadata["dtype"] != "f32" || oi.Chunks != uint32((tc.size+cs-1)/cs) || oi.Opts.ChunkSize != uint32(cs) {
					t.Errorf("nats.go sees size %d chunks %d chunk size %d meta %v", oi.Size, oi.Chunks, oi.Opts.ChunkSize, oi.Metadata)
				}
			})
		}
	}
}

func checkInfo(t *testing.T, what string, got, want objectstore.Info) {
	t.Helper()
	if got.Name != want.Name || got.Size != want.Size || got.SHA256 != want.SHA256 {
		t.Errorf("%s: info %s %d %s, want %s %d %s", what, got.Name, got.Size, got.SHA256, want.Name, want.Size, want.SHA256)
	}
	if len(got.Meta) != len(want.Meta) {
		t.Errorf("%s: meta %v, want %v", what, got.Meta, want.Meta)
	}
	for k, v := range want.Meta {
		if got.Meta[k] != v {
			t.Errorf("%s: meta %v, want %v", what, got.Meta, want.Meta)
		}
	}
}

// nats.go writes, we read.
func TestReadsNatsGoObjects(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t)
	for _, tc := range []struct {
		name  string
		size  int
		chunk uint32 // 0: nats.go's default, 128 KiB
	}{
		{"empty", 0, 0},
		{"1B", 1, 0},
		{"default-chunks", 3<<20 + 5, 0},
		{"1MiB-chunks", 10 << 20, 1 << 20},
		{"odd-chunks", 100_003, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := randomBytes(tc.size, 99)
			meta := jetstream.ObjectMeta{Name: "theirs-" + tc.name, Metadata: map[string]string{"dtype": "bf16"}}
			if tc.chunk != 0 {
				meta.Opts = &jetstream.ObjectMetaOptions{ChunkSize: tc.chunk}
			}
			if _, err := e.obs.Put(ctx, meta, bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			got, in, err := s.Get(ctx, meta.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("different bytes")
			}
			checkInfo(t, "Get", in, objectstore.Info{Name: meta.Name, Size: int64(tc.size), SHA256: hexSum(data), Meta: meta.Metadata})
			w, err := s.Wait(ctx, meta.Name)
			if err != nil {
				t.Fatal(err)
			}
			checkInfo(t, "Wait", w, in)
		})
	}
	// A link to an object in the same bucket is followed, as nats.go does.
	target, err := e.obs.GetInfo(ctx, "theirs-1B")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.obs.AddLink(ctx, "link", target); err != nil {
		t.Fatal(err)
	}
	if got, _, err := s.Get(ctx, "link"); err != nil || len(got) != 1 {
		t.Fatalf("Get of a link: %v, %d bytes", err, len(got))
	}
}

func TestReplace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	first := randomBytes(1<<20, 1)
	if _, err := s.Put(ctx, "x", first, nil); err != nil {
		t.Fatal(err)
	}
	old, err := e.obs.GetInfo(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	second := randomBytes(300<<10, 2)
	if _, err := s.Put(ctx, "x", second, map[string]string{"v": "2"}); err != nil {
		t.Fatal(err)
	}
	got, in, err := s.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, second) || in.Meta["v"] != "2" {
		t.Fatal("Get after replace returned the old object")
	}
	if n := e.chunkCount(t, old.NUID); n != 0 {
		t.Errorf("%d chunks of the replaced object remain", n)
	}
	// Replacing an object that nats.go wrote works the same way.
	theirs, err := e.obs.PutBytes(ctx, "y", first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "y", second, nil); err != nil {
		t.Fatal(err)
	}
	if n := e.chunkCount(t, theirs.NUID); n != 0 {
		t.Errorf("%d chunks of nats.go's replaced object remain", n)
	}
}

// corrupt rewrites an object's chunks on a new subject with one byte
// flipped and points its meta at them, keeping the original digest.
func corrupt(t *testing.T, e *env, name string) {
	t.Helper()
	ctx := context.Background()
	oi, err := e.obs.GetInfo(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	data, err := e.obs.GetBytes(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x40
	oi.NUID = "tampered" + oi.NUID[:8]
	cs := int(oi.Opts.ChunkSize)
	for a := 0; a < len(data); a += cs {
		if _, err := e.js.Publish(ctx, "$O."+bucket+".C."+oi.NUID, data[a:min(a+cs, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	publishMeta(t, e, oi)
}

func publishMeta(t *testing.T, e *env, oi *jetstream.ObjectInfo) {
	t.Helper()
	m := nats.NewMsg("$O." + bucket + ".M." + encodeName(oi.Name))
	m.Header.Set("Nats-Rollup", "sub")
	m.Data = mustJSON(t, oi)
	if _, err := e.js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

func TestIntegrity(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithChunkSize(64<<10), objectstore.WithRetries(2))
	data := randomBytes(1<<20+3, 5)
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, name string)
		natsgo bool // nats.go's Get also reports the damage
	}{
		{"tampered chunk", func(t *testing.T, name string) { corrupt(t, e, name) }, true},
		{"meta digest", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256([]byte("something else"))
			oi.Digest = "SHA-256=" + b64(sum[:])
			oi.Headers.Del("Jetfabric-Crc32") // a meta as another tool writes it
			publishMeta(t, e, oi)
		}, true},
		{"meta CRC-32", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			oi.Headers.Set("Jetfabric-Crc32", "0badf00d")
			publishMeta(t, e, oi)
		}, false},
		{"meta size short", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			oi.Size--
			publishMeta(t, e, oi)
		}, false},
		{"meta size long", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			oi.Size++
			publishMeta(t, e, oi)
		}, false},
		{"extra chunk", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.js.Publish(ctx, "$O."+bucket+".C."+oi.NUID, []byte("more")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"missing chunk", func(t *testing.T, name string) {
			oi, err := e.obs.GetInfo(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			m, err := e.str.GetMsg(ctx, 0, jetstream.WithGetMsgSubject("$O."+bucket+".C."+oi.NUID))
			if err != nil {
				t.Fatal(err)
			}
			if err := e.str.DeleteMsg(ctx, m.Sequence+3); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "integrity-" + strings.ReplaceAll(tc.name, " ", "-")
			if _, err := s.Put(ctx, name, data, nil); err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, name)
			start := time.Now()
			if _, _, err := s.Get(ctx, name); !errors.Is(err, objectstore.ErrDigest) {
				t.Fatalf("Get: %v, want ErrDigest", err)
			} else if !strings.HasPrefix(err.Error(), "objectstore: ") {
				t.Errorf("error %q lacks the package prefix", err)
			} else {
				t.Logf("Get: %v (%v)", err, time.Since(start).Round(time.Millisecond))
			}
			if in, err := s.Stat(ctx, name); err == nil {
				if _, err := s.GetInto(ctx, name, make([]byte, in.Size)); !errors.Is(err, objectstore.ErrDigest) {
					t.Fatalf("GetInto: %v, want ErrDigest", err)
				}
			}
			if tc.natsgo {
				if _, err := e.obs.GetBytes(ctx, name); err == nil {
					t.Error("nats.go read the damaged object without error")
				}
			}
		})
	}
}

func TestNotFound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, objectstore.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", what, err)
		}
	}
	for _, name := range []string{"missing", ""} {
		_, _, err := s.Get(ctx, name)
		check("Get "+name, err)
		_, err = s.GetInto(ctx, name, nil)
		check("GetInto "+name, err)
		_, err = s.Stat(ctx, name)
		check("Stat "+name, err)
		check("Delete "+name, s.Delete(ctx, name))
	}
	if _, err := s.Put(ctx, "gone", []byte("abc"), nil); err != nil {
		t.Fatal(err)
	}
	oi, err := e.obs.GetInfo(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.Get(ctx, "gone")
	check("Get after Delete", err)
	_, err = s.Stat(ctx, "gone")
	check("Stat after Delete", err)
	if err := s.Delete(ctx, "gone"); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	if n := e.chunkCount(t, oi.NUID); n != 0 {
		t.Errorf("%d chunks remain after Delete", n)
	}
	// nats.go agrees the object is deleted.
	if _, err := e.obs.GetInfo(ctx, "gone"); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("nats.go GetInfo after Delete: %v", err)
	}
	// And we see nats.go's deletes.
	if _, err := e.obs.PutString(ctx, "theirs", "x"); err != nil {
		t.Fatal(err)
	}
	if err := e.obs.Delete(ctx, "theirs"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Stat(ctx, "theirs")
	check("Stat of nats.go-deleted", err)
}

func TestGetIntoWrongSize(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t)
	if _, err := s.Put(ctx, "sized", make([]byte, 1000), nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 999, 1001} {
		in, err := s.GetInto(ctx, "sized", make([]byte, n))
		if !errors.Is(err, objectstore.ErrSize) {
			t.Errorf("GetInto with %d bytes: %v, want ErrSize", n, err)
		}
		if in.Size != 1000 {
			t.Errorf("GetInto with %d bytes: info size %d, want 1000", n, in.Size)
		}
	}
}

func TestWait(t *testing.T) {
	e := newEnv(t)
	s := e.store(t)

	t.Run("times out", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := s.Wait(ctx, "never")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait: %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("Wait took %v after a 100ms deadline", d)
		}
	})

	t.Run("returns when a Put finishes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		data := randomBytes(3<<20, 3)
		type result struct {
			in  objectstore.Info
			err error
		}
		got := make(chan result, 1)
		go func() {
			in, err := s.Wait(ctx, "later")
			got <- result{in, err}
		}()
		// Put once the watch is in place, so that Wait is truly waiting.
		checkFor(t, time.Minute, 5*time.Millisecond, func() error {
			si, err := e.str.Info(ctx)
			if err != nil {
				return err
			}
			if si.State.Consumers == 0 {
				return errors.New("Wait has no consumer yet")
			}
			return nil
		})
		put, err := s.Put(ctx, "later", data, map[string]string{"k": "v"})
		if err != nil {
			t.Fatal(err)
		}
		r := <-got
		if r.err != nil {
			t.Fatal(r.err)
		}
		checkInfo(t, "Wait", r.in, put)
		if b, _, err := s.Get(ctx, "later"); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("Get after Wait: %v", err)
		}
	})

	t.Run("existing object", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.Wait(ctx, "later"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("deleted then written again", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Delete(ctx, "later"); err != nil {
			t.Fatal(err)
		}
		short, c2 := context.WithTimeout(ctx, 100*time.Millisecond)
		defer c2()
		if _, err := s.Wait(short, "later"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on a deleted object: %v", err)
		}
		done := make(chan error, 1)
		go func() { _, err := s.Wait(ctx, "later"); done <- err }()
		if _, err := s.Put(ctx, "later", []byte("again"), nil); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

func TestOptions(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name string
		opt  objectstore.Option
	}{
		{"chunk 0", objectstore.WithChunkSize(0)},
		{"chunk -1", objectstore.WithChunkSize(-1)},
		{"chunk over max_payload", objectstore.WithChunkSize(8<<20 + 1)},
		{"window 0", objectstore.WithWindow(0)},
		{"window huge", objectstore.WithWindow(1 << 20)},
		{"parts 0", objectstore.WithParts(0)},
		{"parts 65", objectstore.WithParts(65)},
		{"retries -1", objectstore.WithRetries(-1)},
		{"read-ahead tiny", objectstore.WithReadAhead(1)},
		{"read-ahead huge", objectstore.WithReadAhead(1 << 30)},
		{"follow-ahead tiny", objectstore.WithFollowAhead(1)},
		{"follow-ahead huge", objectstore.WithFollowAhead(1 << 30)},
		{"timeout 0", objectstore.WithTimeout(0)},
		{"part threshold 0", objectstore.WithPartThreshold(0)},
		{"part threshold under chunk", objectstore.WithPartThreshold(1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := objectstore.New(e.js, bucket, tc.opt)
			if !errors.Is(err, objectstore.ErrInvalidOption) {
				t.Fatalf("New: %v, want ErrInvalidOption", err)
			}
			if !strings.HasPrefix(err.Error(), "objectstore: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	if _, err := objectstore.New(e.js, "NO_SUCH_BUCKET"); !errors.Is(err, objectstore.ErrBucketNotFound) {
		t.Errorf("missing bucket: %v, want ErrBucketNotFound", err)
	} else if !strings.Contains(err.Error(), "NO_SUCH_BUCKET") {
		t.Errorf("error %q does not name the bucket", err)
	}
	if _, err := objectstore.New(e.js, "FABRIC_OPS"); err == nil {
		t.Error("a bucket name without an object stream was accepted")
	}
	if _, err := objectstore.New(e.js, "a.b"); !errors.Is(err, objectstore.ErrInvalidOption) {
		t.Errorf("bad bucket name: %v, want ErrInvalidOption", err)
	}
	s := e.store(t)
	if _, err := s.Put(context.Background(), "", []byte("x"), nil); !errors.Is(err, objectstore.ErrInvalidOption) {
		t.Errorf("Put with no name: %v, want ErrInvalidOption", err)
	}
}

func TestParts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithParts(4), objectstore.WithPartThreshold(1<<20), objectstore.WithChunkSize(128<<10))
	for _, size := range []int{1 << 20, 1<<20 + 1, 5<<20 + 7} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			name := fmt.Sprint("parted-", size)
			data := randomBytes(size, uint64(size))
			in, err := s.Put(ctx, name, data, map[string]string{"dtype": "u8"})
			if err != nil {
				t.Fatal(err)
			}
			want := objectstore.Info{Name: name, Size: int64(size), SHA256: hexSum(data), Meta: map[string]string{"dtype": "u8"}}
			checkInfo(t, "Put", in, want)
			// Parts are whole chunks: 1 MiB + 1 of 128 KiB chunks makes 3.
			wantParts := map[int]int{1 << 20: 0, 1<<20 + 1: 3, 5<<20 + 7: 4}[size]
			if in.Parts != wantParts {
				t.Errorf("%d parts, want %d", in.Parts, wantParts)
			}
			st, err := s.Stat(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			checkInfo(t, "Stat", st, want)
			got, gin, err := s.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			checkInfo(t, "Get", gin, want)
			if !bytes.Equal(got, data) {
				t.Fatal("different bytes")
			}
			if w, err := s.Wait(ctx, name); err != nil || w.Size != int64(size) {
				t.Fatalf("Wait: %v, size %d", err, w.Size)
			}
			// Every part and the manifest are ordinary objects to nats.go.
			objs, err := e.obs.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var partNames []string
			var total uint64
			for _, o := range objs {
				if strings.HasPrefix(o.Name, name+".part") {
					partNames = append(partNames, o.Name)
					b, err := e.obs.GetBytes(ctx, o.Name)
					if err != nil {
						t.Fatal(err)
					}
					total += uint64(len(b))
				}
			}
			if len(partNames) != wantParts || (wantParts > 0 && total != uint64(size)) {
				t.Errorf("nats.go sees parts %v holding %d bytes", partNames, total)
			}
			if err := s.Delete(ctx, name); err != nil {
				t.Fatal(err)
			}
			for _, p := range partNames {
				if _, err := e.obs.GetInfo(ctx, p); !errors.Is(err, jetstream.ErrObjectNotFound) {
					t.Errorf("part %s after Delete: %v", p, err)
				}
			}
		})
	}
	// A damaged part is caught.
	data := randomBytes(3<<20, 8)
	if _, err := s.Put(ctx, "parted-bad", data, nil); err != nil {
		t.Fatal(err)
	}
	objs, _ := e.obs.List(ctx)
	for _, o := range objs {
		if strings.HasPrefix(o.Name, "parted-bad.part1.") {
			corrupt(t, e, o.Name)
		}
	}
	if _, _, err := s.Get(ctx, "parted-bad"); !errors.Is(err, objectstore.ErrDigest) {
		t.Fatalf("Get with a damaged part: %v, want ErrDigest", err)
	}
	// Replacing a parted object by a small one removes its parts.
	if _, err := s.Put(ctx, "parted-bad", []byte("small"), nil); err != nil {
		t.Fatal(err)
	}
	objs, _ = e.obs.List(ctx)
	for _, o := range objs {
		if strings.HasPrefix(o.Name, "parted-bad.part") {
			t.Errorf("part %s outlived the object it belonged to", o.Name)
		}
	}
}

// The bucket refuses the write for good (full): the Put fails with
// ErrRefused and leaves nothing behind.
func TestRollbackWhenRefused(t *testing.T) {
	e := newEnv(t, func(c *broker.Config) { c.Provision.XferMaxBytes = 1 << 20 })
	ctx := context.Background()
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	_, err := s.Put(ctx, "too-big", randomBytes(2<<20, 1), nil)
	if !errors.Is(err, objectstore.ErrRefused) {
		t.Fatalf("Put into a full bucket: %v, want ErrRefused", err)
	}
	t.Log(err)
	checkFor(t, time.Minute, 20*time.Millisecond, func() error {
		si, err := e.str.Info(ctx)
		if err != nil {
			return err
		}
		if si.State.Msgs != 0 {
			return fmt.Errorf("%d messages left in the bucket after a failed Put", si.State.Msgs)
		}
		return nil
	})
	if _, err := s.Stat(ctx, "too-big"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("Stat after failed Put: %v", err)
	}
}

func TestCancelledPutLeavesNothing(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(256<<10))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err := s.Put(ctx, "cancelled", randomBytes(64<<20, 2), nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Put: %v, want DeadlineExceeded", err)
	}
	checkFor(t, time.Minute, 20*time.Millisecond, func() error {
		si, err := e.str.Info(context.Background())
		if err != nil {
			return err
		}
		if si.State.Msgs != 0 {
			return fmt.Errorf("%d messages left after a cancelled Put", si.State.Msgs)
		}
		return nil
	})
}

func TestConcurrent(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithChunkSize(32<<10))
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			name := fmt.Sprint("conc-", i)
			data := randomBytes(1<<20+i*1000, uint64(i))
			if _, err := s.Put(ctx, name, data, nil); err != nil {
				errs <- err
				return
			}
			got, _, err := s.Get(ctx, name)
			if err == nil && !bytes.Equal(got, data) {
				err = fmt.Errorf("%s: different bytes", name)
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithParts(2), objectstore.WithPartThreshold(1<<20))
	cycle := func(i int) {
		name := fmt.Sprint("leak-", i)
		if _, err := s.Put(ctx, name, randomBytes(3<<20, 1), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Wait(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Get(ctx, name); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		_, _ = s.Wait(short, "nothing")
		cancel()
		if err := s.Delete(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	cycle(0)
	base := runtime.NumGoroutine()
	for i := 1; i < 10; i++ {
		cycle(i)
	}
	checkFor(t, time.Minute, 50*time.Millisecond, func() error {
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Errorf("%d goroutines, %d before", n, base)
		}
		return nil
	})
}

// TestPutYields: a Put with WithYield calls it before each chunk it
// sends; an error from it fails the Put, which then leaves nothing.
func TestPutYields(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.store(t, objectstore.WithChunkSize(64<<10))
	data := randomBytes(10*64<<10+5, 3) // 11 chunks
	calls := 0
	if _, err := s.Put(ctx, "yielding", data, nil, objectstore.WithYield(func(context.Context) error {
		calls++
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	if calls != 11 {
		t.Fatalf("yield called %d times for 11 chunks", calls)
	}
	got, _, err := s.Get(ctx, "yielding")
	if err != nil || hexSum(got) != hexSum(data) {
		t.Fatalf("read back: %v", err)
	}

	stop := errors.New("the device needs the cores")
	calls = 0
	_, err = s.Put(ctx, "stopped", data, nil, objectstore.WithYield(func(context.Context) error {
		if calls++; calls == 4 {
			return stop
		}
		return nil
	}))
	if !errors.Is(err, stop) {
		t.Fatalf("Put whose yield failed: %v, want %v", err, stop)
	}
	if _, err := s.Stat(ctx, "stopped"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat after the failed Put: %v", err)
	}
}
