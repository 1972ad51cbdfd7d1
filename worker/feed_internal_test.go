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

// TestIdleDeviceKeepsItsConsumer: a device with no frames of its own, on
// a stream holding another device's frames, is healthy: the watch of its
// consumer asks the server and leaves the consumer alone (its delivered
// stream sequence moves past the frames it skips, which never come).
func TestIdleDeviceKeepsItsConsumer(t *testing.T) {
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultConfig()
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}, {Name: "cpu-1", Kind: "cpu", Backend: cpu.New()}}
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
	defer w.Stop(context.Background())
	js, _ := jetstream.New(nc)
	inbox, _ := nc.SubscribeSync(nats.NewInbox())
	for i := range 5 {
		m := nats.NewMsg("fabric.ops.cpu-0.busy")
		m.Data = []byte(fmt.Sprintf(`{"v":1,"ops":[{"op":"full","out":[%d],"shape":[1],"value":%d},{"op":"read","in":[%d],"tag":%d}]}`, i+1, i, i+1, i+1))
		m.Header.Set(subjects.HeaderReply, inbox.Subject)
		m.Header.Set(subjects.HeaderContentType, "application/json")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		msg, err := inbox.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r codec.Result
		if err := json.Unmarshal(msg.Data, &r); err != nil || len(r.Errors) > 0 {
			t.Fatalf("frame %d: %v %+v", i, err, r)
		}
	}
	idle := w.devices[1]
	f := idle.feed
	asked := f.asked.Load()
	checkUntil(t, time.Minute, func() error {
		if n := f.asked.Load(); n < asked+2 {
			return fmt.Errorf("the idle device's consumer was asked about %d times since the frames", n-asked)
		}
		return nil
	})
	if n := idle.m.renewals.Load(); n != 0 {
		t.Fatalf("the idle device's consumer was created again %d times", n)
	}
}
