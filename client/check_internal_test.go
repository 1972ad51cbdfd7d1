package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestCheckAfterPurge: a read's frame that a checkpoint purged before the
// client looked for its answer is no longer in the stream, so the check
// finds it missing; but the answer, sent before the purge, has already
// reached the connection, and call finds it there before calling the frame
// lost.
func TestCheckAfterPurge(t *testing.T) {
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
	frame, size := s.queueLocked(codec.Op{Op: "read", In: []uint64{x.id}, Tag: tag}, true)
	s.mu.Unlock()
	if frame == 0 {
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
	state, why := s.check(ctx, frame, size)
	if state != frameMissing || why == nil || !strings.Contains(why.Error(), "does not hold frame") {
		t.Fatalf("check of a purged frame: state %v, %v", state, why)
	}
	r := s.drain(ch)
	if r == nil || r.Tag != tag || r.Tensor == nil || len(r.Errors) > 0 {
		t.Fatalf("answer to the purged frame: %+v", r)
	}
}
