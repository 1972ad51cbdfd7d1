package worker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

// sendNumbered publishes a JSON frame with its number in Fabric-Frame.
func (r *rawSession) sendNumbered(n int, body string) {
	r.t.Helper()
	m := nats.NewMsg(r.subject)
	m.Data = []byte(body)
	m.Header.Set(subjects.HeaderReply, r.inbox.Subject)
	m.Header.Set(subjects.HeaderContentType, "application/json")
	m.Header.Set(subjects.HeaderFrame, strconv.Itoa(n))
	if _, err := r.js.PublishMsg(context.Background(), m); err != nil {
		r.t.Fatal(err)
	}
}

// TestFramesRunInNumberOrder: the stream stores a session's frames out of
// their order (a frame published again after its first publish was lost
// lands after later ones) and once more (published again past the
// duplicate window): the worker runs them in the order of their numbers,
// each once, and a worker taking the device over replays the same.
func TestFramesRunInNumberOrder(t *testing.T) {
	b := brokertest.Run(t)
	fast := func(c *worker.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.LeaseTTL = 300 * time.Millisecond
		c.CheckpointInterval = 0
	}
	w := startWorker(t, b, fast, func(c *worker.Config) { c.ID = "first" })
	r := newRaw(t, b, "fabric.ops.cpu-0.ordered")
	// x = 1; x = x*10; x = x+2; read: 12 in order, 30 with 3 before 2.
	f1 := `{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":1},{"op":"full","out":[2],"shape":[1],"value":10},{"op":"full","out":[3],"shape":[1],"value":2}]}`
	f2 := `{"v":1,"ops":[{"op":"mul","in":[1,2],"out":[4]}]}`
	f3 := `{"v":1,"ops":[{"op":"add","in":[4,3],"out":[5]},{"op":"read","in":[5],"tag":1}]}`
	r.sendNumbered(1, f1)
	r.sendNumbered(3, f3) // ahead of 2: held
	if m, err := r.inbox.NextMsg(300 * time.Millisecond); err == nil {
		t.Fatalf("frame 3 ran before frame 2: %s", m.Data)
	}
	r.sendNumbered(2, f2)
	r.expectOnly(1, 12, 5*time.Second)
	r.sendNumbered(2, f2) // again: dropped
	r.sendNumbered(3, f3)
	r.sendNumbered(4, `{"v":1,"ops":[{"op":"add","in":[5,3],"out":[6]},{"op":"read","in":[6],"tag":2}]}`)
	r.expectOnly(2, 14, 5*time.Second)

	// A standby takes over from the checkpoint of the clean stop, which
	// records the session's last frame number.
	startWorker(t, b, fast, func(c *worker.Config) { c.ID = "standby" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	r.sendNumbered(4, `{"v":1,"ops":[{"op":"add","in":[5,3],"out":[6]},{"op":"read","in":[6],"tag":2}]}`) // again: dropped
	r.sendNumbered(5, `{"v":1,"ops":[{"op":"add","in":[6,3],"out":[7]},{"op":"read","in":[7],"tag":3}]}`)
	r.expectOnly(3, 16, 10*time.Second)
}

// TestHeldFramesWaitForCheckpoint: while a session holds frames stored
// ahead of a missing one, the device takes no checkpoint (it would lose
// them); a worker taking over after the missing frame came replays them.
func TestHeldFramesWaitForCheckpoint(t *testing.T) {
	b := brokertest.Run(t)
	fast := func(c *worker.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.LeaseTTL = 300 * time.Millisecond
		c.CheckpointInterval = 50 * time.Millisecond
	}
	w := startWorker(t, b, fast, func(c *worker.Config) { c.ID = "first" })
	r := newRaw(t, b, "fabric.ops.cpu-0.held")
	r.sendNumbered(1, `{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":5}]}`)
	r.sendNumbered(3, `{"v":1,"ops":[{"op":"checkpoint"},{"op":"read","in":[2],"tag":1}]}`)
	if m, err := r.inbox.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("frame 3 ran before frame 2: %s", m.Data)
	}
	startWorker(t, b, fast, func(c *worker.Config) { c.ID = "standby" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	r.sendNumbered(2, `{"v":1,"ops":[{"op":"add","in":[1,1],"out":[2]}]}`)
	r.expectOnly(1, 10, 10*time.Second)
}
