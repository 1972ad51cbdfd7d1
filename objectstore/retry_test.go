package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/objectstore"
)

// runTightServer starts a bare nats-server whose per-stream ingest queue
// holds only a few messages, so a wide window of chunks is refused with
// 429 Too Many Requests. The broker package always configures a roomy
// queue; this is the refusal it protects against.
func runTightServer(t *testing.T, queued int) *nats.Conn {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host:                  "127.0.0.1",
		Port:                  -1,
		JetStream:             true,
		StoreDir:              t.TempDir(),
		NoLog:                 true,
		NoSigs:                true,
		StreamMaxBufferedMsgs: queued,
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10e9) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestRetriesRefusedChunks(t *testing.T) {
	nc := runTightServer(t, 4)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "TIGHT"})
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(4<<20, 42)

	// nats.go publishes up to 4000 chunks at once: refused.
	_, err = obs.Put(ctx, jetstream.ObjectMeta{Name: "theirs", Opts: &jetstream.ObjectMetaOptions{ChunkSize: 4 << 10}}, bytes.NewReader(data))
	if err == nil {
		t.Log("nats.go's Put was not refused this time")
	} else {
		t.Logf("nats.go's Put: %v", err)
	}

	// Ours backs off, halves its window and resumes from the refused chunk.
	s, err := objectstore.New(js, "TIGHT", objectstore.WithChunkSize(4<<10), objectstore.WithWindow(256), objectstore.WithRetries(50))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, "ours", data, nil); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx, "ours")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("different bytes")
	}
	theirs, err := obs.GetBytes(ctx, "ours")
	if err != nil || !bytes.Equal(theirs, data) {
		t.Fatalf("nats.go reads the retried object: %v", err)
	}
	oi, err := obs.GetInfo(ctx, "ours")
	if err != nil {
		t.Fatal(err)
	}
	str, err := js.Stream(ctx, "OBJ_TIGHT")
	if err != nil {
		t.Fatal(err)
	}
	subj := "$O.TIGHT.C." + oi.NUID
	si, err := str.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	if n := si.State.Subjects[subj]; n != uint64(oi.Chunks) {
		t.Errorf("chunk subject holds %d messages, want %d", n, oi.Chunks)
	}

	// With no retries allowed the same Put fails with ErrRefused and
	// leaves no chunks behind.
	s0, err := objectstore.New(js, "TIGHT", objectstore.WithChunkSize(4<<10), objectstore.WithWindow(256), objectstore.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	before, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s0.Put(ctx, "no-retries", data, nil); !errors.Is(err, objectstore.ErrRefused) {
		t.Logf("Put without retries: %v (the broker kept up this time)", err)
	} else {
		t.Logf("Put without retries: %v", err)
		after, err := str.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.State.Msgs != before.State.Msgs {
			t.Errorf("%d messages left behind by a refused Put", after.State.Msgs-before.State.Msgs)
		}
	}
}
