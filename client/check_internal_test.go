package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
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
	stored := false
	if err := s.confirm(ctx, msg, &stored); err != nil || !stored {
		t.Fatalf("confirm of a purged frame: %v, stored %v", err, stored)
	}
	if m, err := stream.GetLastMsgForSubject(ctx, s.subject); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("the frame was stored again (%v, %v): its Nats-Msg-Id should make it a duplicate", m, err)
	}
	// Once stored, confirm asks the stream's leader, storing nothing.
	if err := s.confirm(ctx, msg, &stored); err != nil {
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
