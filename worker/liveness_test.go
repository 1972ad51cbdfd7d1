package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

// TestHeartbeatKeepsSession: of two sessions that send no frames, the one
// whose client beats on fabric.alive.<device>.<session> stays while the
// other is freed after the idle timeout.
func TestHeartbeatKeepsSession(t *testing.T) {
	b := brokertest.Run(t)
	// Beats every 50 ms against a 1 s timeout: a loaded machine may delay a
	// few.
	startWorker(t, b, func(c *worker.Config) { c.IdleTimeout = time.Second })
	live, dead := newRaw(t, b, "fabric.ops.cpu-0.live"), newRaw(t, b, "fabric.ops.cpu-0.dead")
	var applied uint64 // the stream sequence of the last frame sent
	for _, r := range []*rawSession{live, dead} {
		r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":4},{"op":"sync","tag":1}]}`)
		applied = r.result().Seq
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = live.nc.Publish("fabric.alive.cpu-0.live", nil)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); <-done }()

	js, _ := jetstream.New(live.nc)
	kv, _ := js.KeyValue(context.Background(), "FABRIC_CTRL")
	// Wait until the idle sweep has freed the silent session: an entry
	// written after both sessions' frames ran (an earlier one may count
	// only the first) that counts one session.
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		e, err := kv.Get(context.Background(), subjects.DeviceKey("cpu-0"))
		if err != nil {
			return err
		}
		var d codec.Device
		_ = json.Unmarshal(e.Value(), &d)
		if d.Applied < applied || d.Sessions != 1 {
			return fmt.Errorf("%d sessions at sequence %d, want 1 at %d or later", d.Sessions, d.Applied, applied)
		}
		return nil
	})
	live.sendJSON(`{"v":1,"ops":[{"op":"read","in":[1],"tag":2}]}`)
	if res := live.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 4 {
		t.Fatalf("the beating session lost its tensor: %+v", res)
	}
	dead.sendJSON(`{"v":1,"ops":[{"op":"read","in":[1],"tag":2}]}`)
	if res := dead.result(); len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeSessionFreed {
		t.Fatalf("the silent session: %+v", res)
	}
	// A frame with no op to answer gets one answer, tag 0.
	dead.sendJSON(`{"v":1,"ops":[{"op":"full","out":[3],"shape":[1]}]}`)
	if res := dead.result(); res.Tag != 0 || len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeSessionFreed {
		t.Fatalf("a frame without reads on the freed session: %+v", res)
	}
}
