package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
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

// TestCheckpointWhileRunning: while a checkpoint is being written (held
// here before it writes anything), the device runs frames and answers
// reads; a large tensor the checkpoint reads and that a frame frees keeps
// its memory until the checkpoint is done with it, then gives it back.
func TestCheckpointWhileRunning(t *testing.T) {
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
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New(cpu.WithCache(0))}}
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
}
