package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestRefusedFrames: a frame the stream refuses fails the read waiting on
// it with ErrPublish saying why, instead of leaving it waiting; a refused
// frame that nobody waited on is reported by the next read; and the session
// goes on.
func TestRefusedFrames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(*broker.Config)
		opts    []client.Option
		mention string
	}{
		{"over the max message size", func(c *broker.Config) { c.Provision.OpsMaxMsgSize = 64 << 10 }, nil, "max message size"},
		{"stream full", func(c *broker.Config) { c.Provision.OpsMaxBytes = 64 << 10 }, []client.Option{client.WithFrameCheck(20 * time.Millisecond)}, "full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := brokertest.Run(t, tc.edit)
			workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
			c, err := client.Connect(b.ClientURL(), tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			s := open(t, c, "cpu-0")
			// A hang fails this test, not the whole run.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			expect(t, "before", read(t, s.Full([]int{2}, 1).Sum()), 2)

			big := make([]float32, 32<<10) // 128 KiB inline
			_, err = s.FromFloat32([]int{len(big)}, big).Sum().Float32s(ctx)
			if !errors.Is(err, client.ErrPublish) || !strings.Contains(err.Error(), tc.mention) {
				t.Fatalf("read in a refused frame: %v; want %v mentioning %q", err, client.ErrPublish, tc.mention)
			}
			expect(t, "after", read(t, s.Full([]int{2}, 3).Sum()), 6)

			// Refused without a call waiting on it: the next read says so.
			s.FromFloat32([]int{len(big)}, big)
			s.Flush()
			_, err = s.Full([]int{1}, 1).Float32s(ctx)
			if !errors.Is(err, client.ErrPublish) {
				t.Fatalf("read after a refused frame: %v; want %v", err, client.ErrPublish)
			}
			expect(t, "again", read(t, s.Full([]int{2}, 2).Sum()), 4)
		})
	}
}

// TestNoStream: with no stream capturing the op subjects, a read fails
// with ErrPublish saying so.
func TestNoStream(t *testing.T) {
	b, c := fabric(t, client.WithFrameCheck(20*time.Millisecond))
	s := open(t, c, "cpu-0")
	expect(t, "before", read(t, s.Full([]int{2}, 1).Sum()), 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, b.Names().OpsStream()); err != nil {
		t.Fatal(err)
	}
	_, err = s.Full([]int{2}, 1).Float32s(ctx)
	if !errors.Is(err, client.ErrPublish) || !strings.Contains(err.Error(), "no stream captures") {
		t.Fatalf("read with no stream: %v", err)
	}
}

// TestCheckpointedFrames: a frame that a checkpoint purged from the stream
// before its answer was looked at is not taken for a refused one, with the
// client checking often. (Much more often, and a loaded machine may not
// have stored a frame yet when the fifth check comes: see WithFrameCheck.)
func TestCheckpointedFrames(t *testing.T) {
	_, c := fabric(t, client.WithFrameCheck(10*time.Millisecond))
	s := open(t, c, "cpu-0")
	for i := range 30 {
		x := s.Full([]int{1}, float64(i))
		s.Checkpoint()
		expect(t, "checkpointed read", read(t, x), float64(i))
	}
}

func TestFrameCheckOption(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, time.Hour} {
		if _, err := client.Connect("nats://127.0.0.1:1", client.WithFrameCheck(d)); !errors.Is(err, client.ErrInvalidOption) {
			t.Errorf("frame check %v: %v", d, err)
		}
	}
}

// TestReadFillsTheFrame: a read that fills the frame it joins is
// published with it, whatever the frame size.
func TestReadFillsTheFrame(t *testing.T) {
	for _, ops := range []int{1, 2, 3} {
		_, c := fabric(t, client.WithMaxFrame(ops, 4<<10))
		s := open(t, c, "cpu-0")
		x := s.Full([]int{2}, 1)
		for i := range 2 * ops {
			x = x.Add(s.Full([]int{2}, 1))
			expect(t, "read", read(t, x), float64(i+2), float64(i+2))
		}
	}
}

// TestOversizeFrame: a frame over the broker's max_payload is refused in
// the client with an error saying so (the server would close the
// connection); the session and the connection go on, and Upload sends such
// a tensor through the object store instead.
func TestOversizeFrame(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.MaxPayload, c.Provision.OpsMaxMsgSize = 512<<10, 512<<10 })
	workertest.Run(t, b, workertest.CPUs(1))
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := open(t, c, "cpu-0")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := make([]float32, 256<<10) // 1 MiB inline
	for i := range big {
		big[i] = 1
	}
	_, err = s.FromFloat32([]int{len(big)}, big).Sum().Float32s(ctx)
	if !errors.Is(err, client.ErrPublish) || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("read of an oversize frame: %v; want %v naming max_payload", err, client.ErrPublish)
	}
	expect(t, "after", read(t, s.Full([]int{2}, 3).Sum()), 6)
	if !c.Conn().IsConnected() {
		t.Fatal("the connection dropped")
	}
	raw := make([]byte, 4*len(big))
	for i := range big {
		raw[4*i+2], raw[4*i+3] = 0x80, 0x3f // 1.0
	}
	x, err := s.Upload(ctx, "f32", []int{len(big)}, raw)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "uploaded", read(t, x.Sum()), float64(len(big)))
}
