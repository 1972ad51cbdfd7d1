package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
)

func checkUntil(t *testing.T, total time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", total, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// opaque hides the host memory of the backend's buffers, as a GPU's is
// hidden: a checkpoint downloads what it stores.
type opaque struct {
	kernels.Backend
	large *atomic.Int64 // downloads of 1 MiB or more
}

type opaqueBuf struct{ b kernels.Buffer }

func (o opaqueBuf) Bytes() int { return o.b.Bytes() }

func inner(b kernels.Buffer) kernels.Buffer {
	if o, ok := b.(opaqueBuf); ok {
		return o.b
	}
	return b
}

func (o opaque) Alloc(n int) (kernels.Buffer, error) {
	b, err := o.Backend.Alloc(n)
	if err != nil {
		return nil, err
	}
	return opaqueBuf{b}, nil
}

func (o opaque) Free(b kernels.Buffer) { o.Backend.Free(inner(b)) }
func (o opaque) Upload(dst kernels.Buffer, src []byte) error {
	return o.Backend.Upload(inner(dst), src)
}
func (o opaque) Download(dst []byte, src kernels.Buffer) error {
	if len(dst) >= 1<<20 {
		o.large.Add(1)
	}
	return o.Backend.Download(dst, inner(src))
}

func (o opaque) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	unwrap := func(ts []*kernels.Tensor) []*kernels.Tensor {
		l := make([]*kernels.Tensor, len(ts))
		for i, t := range ts {
			if t != nil {
				l[i] = &kernels.Tensor{Meta: t.Meta, Buf: inner(t.Buf)}
			}
		}
		return l
	}
	return o.Backend.Exec(op, unwrap(in), unwrap(out))
}

// TestCheckpointWhileRunning: while a checkpoint is being written (held
// here before it writes anything), the device runs frames and answers
// reads; a large tensor the checkpoint reads and that a frame frees keeps
// its memory until the checkpoint is done with it, then gives it back.
// On a backend whose memory the host cannot read, the writer downloads
// the tensor beside the loop, and the object it stores holds its bytes.
func TestCheckpointWhileRunning(t *testing.T) {
	for _, c := range []struct {
		name    string
		backend kernels.Backend
	}{
		{"host", cpu.New(cpu.WithCache(0))},
		{"device", opaque{cpu.New(cpu.WithCache(0)), new(atomic.Int64)}},
	} {
		t.Run(c.name, func(t *testing.T) { checkpointWhileRunning(t, c.backend) })
	}
}

func checkpointWhileRunning(t *testing.T, backend kernels.Backend) {
	entered, release := make(chan struct{}, 4), make(chan struct{})
	testHookCheckpointWrite = func(string) {
		entered <- struct{}{}
		<-release
	}
	defer func() { testHookCheckpointWrite = nil }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()

	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultConfig()
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: backend}}
	cfg.CheckpointInterval = 0
	cfg.Heartbeat = 100 * time.Millisecond
	cfg.LeaseTTL = 300 * time.Millisecond
	cfg.Logf = t.Logf
	w, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !released {
			close(release)
			released = true
		}
		if err := w.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	d := w.devices[0]

	js, _ := jetstream.New(nc)
	inbox, _ := nc.SubscribeSync(nats.NewInbox())
	send := func(body string) codec.Result {
		t.Helper()
		m := nats.NewMsg("fabric.ops.cpu-0.run")
		m.Data = []byte(body)
		m.Header.Set(subjects.HeaderReply, inbox.Subject)
		m.Header.Set(subjects.HeaderContentType, "application/json")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		msg, err := inbox.NextMsg(20 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		var r codec.Result
		if err := json.Unmarshal(msg.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	const n = 1 << 18 // f32: 1 MiB
	send(fmt.Sprintf(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[%d],"value":2},{"op":"checkpoint"},{"op":"sync","tag":1}]}`, n))
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no checkpoint started")
	}
	held := d.mem.held.Load()
	// The snapshot downloaded nothing: the writer does.
	if o, ok := backend.(opaque); ok && o.large.Load() != 0 {
		t.Fatalf("%d large downloads before the checkpoint's writer ran: the loop downloaded", o.large.Load())
	}
	// The checkpoint is stuck; the device is not.
	for i := range 3 {
		r := send(fmt.Sprintf(`{"v":1,"ops":[{"op":"full","out":[%d],"shape":[4],"value":%d},{"op":"read","in":[%d],"tag":2}]}`, 10+i, i, 10+i))
		if len(r.Errors) > 0 || r.Tensor == nil || r.Tensor.Values[0] != float64(i) {
			t.Fatalf("frame %d during the checkpoint: %+v", i, r)
		}
	}
	// Registry heartbeats and lease renewals go on: the entry's beat moves
	// on by more than a lease TTL, and the lease is still this worker's.
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	beat := func() time.Time {
		e, err := kv.Get(ctx, subjects.DeviceKey("cpu-0"))
		if err != nil {
			return time.Time{}
		}
		var dev codec.Device
		_ = json.Unmarshal(e.Value(), &dev)
		return dev.Beat
	}
	b0 := beat()
	checkUntil(t, 20*time.Second, func() error {
		if b := beat(); b.Sub(b0) < 2*cfg.LeaseTTL {
			return fmt.Errorf("registry beat %v, %v at the checkpoint's start", b, b0)
		}
		return nil
	})
	if !d.serving() {
		t.Fatal("the lease was lost while a checkpoint was written")
	}
	// Freeing the tensor the checkpoint reads defers its memory.
	send(`{"v":1,"ops":[{"op":"free","in":[1]},{"op":"sync","tag":3}]}`)
	if got := d.mem.held.Load(); got < held {
		t.Fatalf("held %d after the free, %d before: the buffer went back under the checkpoint", got, held)
	}
	close(release)
	released = true
	checkUntil(t, 20*time.Second, func() error {
		if got := d.mem.held.Load(); got > held-4*n+64 {
			return fmt.Errorf("held %d bytes, %d before the free of %d", got, held, 4*n)
		}
		return nil
	})
	// The tensor's object holds its bytes: n float32 twos.
	want := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(2))
	}
	sum := sha256.Sum256(want)
	name := tensorObject("cpu-0", hex.EncodeToString(sum[:]))
	checkUntil(t, 20*time.Second, func() error {
		got, _, err := d.w.ckpt.Get(ctx, name)
		if err != nil {
			return fmt.Errorf("checkpoint tensor %s: %w", name, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("checkpoint tensor %s holds other bytes", name)
		}
		return nil
	})
}
