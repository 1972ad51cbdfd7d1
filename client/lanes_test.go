package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestLanes: with three lanes on both ends and the transfer bucket in
// memory, a large upload goes as three
// pieces, each an object named by its digest, and a large result comes
// back as three pieces, which the client deletes once read. A client
// with one lane (as one that knows nothing of pieces) gets the result
// whole from the same worker. The bytes are the same either way.
func TestLanes(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.Provision.XferStorage = jetstream.MemoryStorage })
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Lanes = 3 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Connect(b.ClientURL(), client.WithLanes(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := open(t, c, "cpu-0")
	n := 3*objectstore.MinPiece/4 + 1 // f32 elements: 3 pieces' worth
	data := make([]byte, 4*n)
	want := make([]byte, 4*n)
	for i := range n {
		v := float32(i%1000) + float32(i/1000)
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
		binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(v+0.5))
	}
	x, err := s.Upload(ctx, "f32", []int{n}, data)
	if err != nil {
		t.Fatal(err)
	}
	y := x.Add(s.Full(nil, 0.5))
	got, err := y.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes, want) {
		t.Fatal("the result read in pieces differs from x + 0.5")
	}

	js, _ := jetstream.New(c.Conn())
	objects, err := js.ObjectStore(ctx, "FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		lo, hi := objectstore.PieceRange(len(data), 3, i)
		sum := sha256.Sum256(data[lo:hi])
		if info, err := objects.GetInfo(ctx, "upload-"+hex.EncodeToString(sum[:])); err != nil || info.Size != uint64(hi-lo) {
			t.Fatalf("piece %d of the upload is not an object named by its digest: %v", i, err)
		}
	}
	names := resultObjects(t, js, "FABRIC_RESULTS")
	if len(names) != 3 {
		t.Fatalf("result objects %v, want three pieces", names)
	}
	results, err := js.ObjectStore(ctx, "FABRIC_RESULTS")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		info, err := results.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted())
		if err != nil || !info.Deleted || !strings.HasSuffix(name, ".0") && !strings.HasSuffix(name, ".1") && !strings.HasSuffix(name, ".2") {
			t.Fatalf("result piece %s: %+v, %v; want a deleted piece", name, info, err)
		}
	}

	whole, err := client.Connect(b.ClientURL(), client.WithLanes(1))
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	s1 := open(t, whole, "cpu-0")
	z, err := s1.Upload(ctx, "f32", []int{n}, data)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = z.Add(s1.Full(nil, 0.5)).Read(ctx); err != nil || !bytes.Equal(got.Bytes, want) {
		t.Fatalf("whole result: %v (or other bytes)", err)
	}
	if names := resultObjects(t, js, "FABRIC_RESULTS"); len(names) != 4 {
		t.Fatalf("result objects %v, want the three pieces and one whole", names)
	}
}

// resultObjects lists the names of the result objects in bucket, deleted
// ones included.
func resultObjects(t *testing.T, js jetstream.JetStream, bucket string) []string {
	t.Helper()
	st, err := js.Stream(context.Background(), "OBJ_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	prefix := "$O." + bucket + ".M."
	si, err := st.Info(context.Background(), jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for subj := range si.State.Subjects {
		name, err := base64.URLEncoding.DecodeString(strings.TrimPrefix(subj, prefix))
		if err != nil {
			t.Fatalf("meta subject %s: %v", subj, err)
		}
		if strings.HasPrefix(string(name), "result-") {
			names = append(names, string(name))
		}
	}
	return names
}

// TestResultsBucket: a large result goes through FABRIC_RESULTS, which
// the broker keeps in memory, and is deleted once read; one over an
// eighth of that bucket goes through FABRIC_XFER instead. The bytes are
// right either way.
func TestResultsBucket(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.Provision.ResultsMaxBytes = 8 << 20 })
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Limits.InlineBytes = 64 << 10 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(b.ClientURL(), client.WithLanes(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := open(t, c, "cpu-0")
	js, _ := jetstream.New(c.Conn())
	for _, n := range []int{128 << 10, 512 << 10} { // f32 elements: 512 KiB, then 2 MiB
		got := read(t, s.Arange(0, float64(n), 1))
		if len(got) != n || got[n-1] != float32(n-1) || got[12345] != 12345 {
			t.Fatalf("%d elements read back: %d, [12345]=%v", n, len(got), got[12345])
		}
	}
	if names := resultObjects(t, js, "FABRIC_RESULTS"); len(names) != 1 {
		t.Fatalf("results in FABRIC_RESULTS: %v, want the 512 KiB one", names)
	}
	if names := resultObjects(t, js, "FABRIC_XFER"); len(names) != 1 {
		t.Fatalf("results in FABRIC_XFER: %v, want the 2 MiB one (over an eighth of 8 MiB)", names)
	}
	for _, bucket := range []string{"FABRIC_RESULTS", "FABRIC_XFER"} {
		os, err := js.ObjectStore(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		name := resultObjects(t, js, bucket)[0]
		if info, err := os.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted()); err != nil || !info.Deleted {
			t.Fatalf("%s in %s after it was read: %+v, %v; want it deleted", name, bucket, info, err)
		}
	}

	// With the results bucket nearly full (results nobody read), a 512 KiB
	// result goes to FABRIC_XFER too, instead of failing there.
	results, err := js.ObjectStore(ctx, "FABRIC_RESULTS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := results.PutBytes(ctx, "result-unread", make([]byte, 15<<19)); err != nil { // 7.5 MiB
		t.Fatal(err)
	}
	if got := read(t, s.Arange(0, 128<<10, 1)); len(got) != 128<<10 || got[777] != 777 {
		t.Fatalf("a result beside a full results bucket: %d elements, [777]=%v", len(got), got[777])
	}
	if names := resultObjects(t, js, "FABRIC_XFER"); len(names) != 2 {
		t.Fatalf("results in FABRIC_XFER: %v, want the 512 KiB one too, the results bucket being full", names)
	}
}
