package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestConfirmAfterPurge: a read's frame that a checkpoint purged before
// the client looked for its answer is published again to confirm it, with
// its Nats-Msg-Id: the stream takes it for the duplicate it is and stores
// nothing, and the answer, sent before the purge, is found on the
// connection.
func TestConfirmAfterPurge(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1))
	c, err := Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	// What call does, without waiting: full, checkpoint and read in one
	// frame, published without an acknowledgement.
	x := s.Full([]int{1}, 7)
	s.Checkpoint()
	ch := make(chan *codec.Result, 1)
	s.mu.Lock()
	s.nextTag++
	tag := s.nextTag
	s.waiters[tag] = ch
	msg, _ := s.queueLocked(codec.Op{Op: "read", In: []uint64{x.id}, Tag: tag}, true)
	s.mu.Unlock()
	if msg == nil {
		t.Fatal(s.collect(nil))
	}

	// The frame went out without an acknowledgement: it is stored once
	// the worker has answered it. Wait for the answer (left unread).
	for len(s.replies) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no answer to the frame")
		case <-time.After(time.Millisecond):
		}
	}
	stream, err := c.js.Stream(ctx, c.names.OpsStream())
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := stream.GetLastMsgForSubject(ctx, s.subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break // purged by the checkpoint
		} else if err != nil {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal("the checkpoint did not purge the frame")
		case <-time.After(10 * time.Millisecond):
		}
	}
	stored, seq := false, uint64(0)
	if err := s.confirm(ctx, msg, &stored, &seq); err != nil || !stored || seq == 0 {
		t.Fatalf("confirm of a purged frame: %v, stored %v at sequence %d", err, stored, seq)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, s.subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the frame was stored again (%v, %v): its Nats-Msg-Id should make it a duplicate", m, err)
	}
	// Once stored, confirm asks the stream's leader, storing nothing.
	if err := s.confirm(ctx, msg, &stored, &seq); err != nil {
		t.Fatalf("probe of the stream: %v", err)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, s.subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the probe stored a message (%v, %v)", m, err)
	}
	r := s.drain(ch)
	if r == nil || r.Tag != tag || r.Tensor == nil || len(r.Errors) > 0 {
		t.Fatalf("answer to the purged frame: %+v", r)
	}
}

// TestMsgIDNamesTheSubject: the stream de-duplicates frames by
// Nats-Msg-Id across all its subjects, so equal session tokens on two
// devices, or of two tenants, must not give equal ids: the second frame
// would be dropped as a duplicate of the first.
func TestMsgIDNamesTheSubject(t *testing.T) {
	ids := map[string]string{}
	for _, subject := range []string{"fabric.ops.cpu-0.s", "fabric.ops.cpu-1.s", "fabric.t.a.ops.cpu-0.s", "fabric.t.b.ops.cpu-0.s"} {
		id := msgID(subject, 1)
		if other, dup := ids[id]; dup {
			t.Fatalf("frame 1 of %s and of %s have one Nats-Msg-Id, %q", other, subject, id)
		}
		ids[id] = subject
	}
}

// TestAnswerLostOnTheWorkersSide: a read whose answer the worker sent but
// this connection never got, with no reconnect here to tell (the worker's
// node shut down with the answer in flight, say), is asked again once the
// device's registry entry says the worker has applied its frame; the
// second answer ends the call.
func TestAnswerLostOnTheWorkersSide(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond })
	c, err := Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	x := s.Full([]int{1}, 5)
	if v, err := x.Float32s(ctx); err != nil || len(v) != 1 || v[0] != 5 {
		t.Fatalf("first read: %v, %v", v, err)
	}

	// The answers to the next frame go nowhere: the inbox has no
	// subscriber, and this connection does not reconnect.
	if err := s.sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		v   []float32
		err error
	}
	done := make(chan answer, 1)
	go func() {
		v, err := x.Add(x).Float32s(ctx)
		done <- answer{v, err}
	}()
	// Once the worker has run the frame (its answer lost), the inbox is
	// subscribed again, into the session's channel.
	stream, err := c.js.Stream(ctx, c.names.OpsStream())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := c.js.KeyValue(ctx, c.names.CtrlBucket())
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, time.Minute, 10*time.Millisecond, func() error {
		m, err := stream.GetLastMsgForSubject(ctx, s.subject)
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, subjects.DeviceKey("cpu-0"))
		if err != nil {
			return err
		}
		var d Device
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			return err
		}
		if d.Applied < m.Sequence {
			return fmt.Errorf("the worker applied sequence %d, the frame is at %d", d.Applied, m.Sequence)
		}
		return nil
	})
	select {
	case a := <-done:
		t.Fatalf("the read ended before its answer could come: %v, %v", a.v, a.err)
	default:
	}
	// (Closed with the connection.)
	if _, err := c.nc.ChanSubscribe(s.inbox, s.replies); err != nil {
		t.Fatal(err)
	}
	t.Logf("subscribed again")
	select {
	case a := <-done:
		if a.err != nil || len(a.v) != 1 || a.v[0] != 10 {
			t.Fatalf("read after its answer was lost: %v, %v", a.v, a.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the read waits for an answer that was lost")
	}
}

// TestLeaderEntry: the leader's read of a registry key finds a key the
// bucket holds, and says not found for one never written or deleted.
func TestLeaderEntry(t *testing.T) {
	b := brokertest.Run(t)
	c, err := Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, c.names.CtrlBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "device.held", []byte(`{"name":"held"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "device.gone", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "device.gone"); err != nil {
		t.Fatal(err)
	}
	if v, err := c.leaderEntry(ctx, "device.held"); err != nil || string(v) != `{"name":"held"}` {
		t.Fatalf("held key: %q %v", v, err)
	}
	for _, key := range []string{"device.gone", "device.never"} {
		if v, err := c.leaderEntry(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("%s: %q %v, want not found", key, v, err)
		}
	}
	if _, err := c.Open(ctx, "gone"); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open of a deleted device: %v, want ErrNoDevice", err)
	}
}
