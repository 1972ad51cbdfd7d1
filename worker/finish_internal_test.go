package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
)

// TestStopReleasesAfterSlowCheckpoint: a clean stop whose last checkpoint
// runs past the stop's deadline (a broker that answers late, or a process
// that stood still) still marks the registry entry stopped and gives the
// lease up once the broker answers, so that a standby takes over at once
// rather than after the lease runs out.
//
// When the lease ran out meanwhile (nobody renewed it while the process
// stood still), the entry is not the stopping worker's to write any more:
// the refusal is not an error of the stop.
func TestStopReleasesAfterSlowCheckpoint(t *testing.T) {
	t.Run("held", func(t *testing.T) { stopAfterSlowCheckpoint(t, false) })
	t.Run("expired", func(t *testing.T) { stopAfterSlowCheckpoint(t, true) })
}

func stopAfterSlowCheckpoint(t *testing.T, expire bool) {
	defer func(d time.Duration) { finishTimeout = d }(finishTimeout)
	finishTimeout = 200 * time.Millisecond
	var kv jetstream.KeyValue
	// The last checkpoint's write starts after the stop's deadline.
	testHookCheckpointWrite = func(string) {
		time.Sleep(4 * finishTimeout)
		if expire {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := kv.Delete(ctx, subjects.LeaseKey("cpu-0")); err != nil {
				t.Errorf("delete the lease: %v", err)
			}
		}
	}
	defer func() { testHookCheckpointWrite = nil }()

	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultConfig()
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}}
	cfg.CheckpointInterval = 0
	cfg.Logf = t.Logf
	w, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = w.Stop(context.Background())
		}
	}()

	js, _ := jetstream.New(nc)
	if kv, err = js.KeyValue(ctx, "FABRIC_CTRL"); err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, subjects.DeviceKey("cpu-0"))
	if err != nil {
		t.Fatal(err)
	}
	// A frame, so that the stop has a checkpoint to write.
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("fabric.ops.cpu-0.run")
	m.Data = []byte(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[4],"value":2},{"op":"sync","tag":1}]}`)
	m.Header.Set(subjects.HeaderReply, inbox.Subject)
	m.Header.Set(subjects.HeaderContentType, "application/json")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := inbox.NextMsg(time.Minute); err != nil {
		t.Fatalf("no answer to the frame: %v", err)
	}

	err = w.Stop(context.Background())
	stopped = true
	if err == nil {
		t.Error("the stop reported no error, though its last checkpoint started after its deadline")
	}
	if expire && errors.Is(err, ErrLeaseLost) {
		t.Errorf("the stop reports the refusal of a lease that ran out: %v", err)
	}
	if e, err := kv.Get(ctx, subjects.LeaseKey("cpu-0")); !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
		var held string
		if e != nil {
			held = string(e.Value())
		}
		t.Errorf("the lease was not given up: %v %s", err, held)
	}
	e, err := kv.Get(ctx, subjects.DeviceKey("cpu-0"))
	if err != nil {
		t.Fatal(err)
	}
	var dev codec.Device
	if err := json.Unmarshal(e.Value(), &dev); err != nil {
		t.Fatal(err)
	}
	switch {
	case expire && e.Revision() > before.Revision() && dev.State == "stopped":
		t.Errorf("registry entry written as %q without the lease", dev.State)
	case !expire && dev.State != "stopped":
		t.Errorf("registry entry %q after the stop, want stopped", dev.State)
	}
}
