package worker

import (
	"context"
	"encoding/json"
	"errors"
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

// TestFeedAsksAgainForATimedOutConsumer: a try at creating the consumer
// that timed out may have been made all the same (a meta leader that
// answers late); the next try asks for the same consumer, which the
// server answers with the one it made, so that slow answers do not leave
// a consumer behind for every try. After a try that failed otherwise,
// the next asks for a new one.
func TestFeedAsksAgainForATimedOutConsumer(t *testing.T) {
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := subjects.Default()
	var m metrics
	f, err := startFeed(ctx, js, names.OpsStream(), []string{names.OpsDevice("cpu-7")}, "cpu-7", 0, func(jetstream.Msg, *jetstream.MsgMetadata) {}, &m, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { f.Stop(); <-f.Done() }()
	consumers := func() []string {
		t.Helper()
		st, err := js.Stream(ctx, names.OpsStream())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		l := st.ListConsumers(ctx)
		for ci := range l.Info() {
			out = append(out, ci.Name)
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	first := f.name

	// The loop's part, by hand: the old consumer stopped, a try that
	// times out before an answer.
	f.mu.Lock()
	f.serial++
	old := f.current
	f.mu.Unlock()
	old.Stop()
	if err := f.open(ctx, time.Nanosecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a try with no time: %v, want a timeout", err)
	}
	timedOut := f.again.name
	if timedOut == "" || timedOut == first {
		t.Fatalf("the timed-out try's consumer %q is not remembered (the first was %q)", timedOut, first)
	}
	// The server made it all the same.
	if _, err := js.CreateOrUpdatePushConsumer(ctx, names.OpsStream(), jetstream.ConsumerConfig{
		Name: timedOut, DeliverSubject: f.again.inbox, DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
		FlowControl: true, IdleHeartbeat: feedHeartbeat, InactiveThreshold: 30 * time.Second, MemoryStorage: true, Replicas: 1,
		FilterSubject: names.OpsDevice("cpu-7"),
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.open(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if f.name != timedOut {
		t.Fatalf("the try after a timeout made consumer %q, want %q asked for again", f.name, timedOut)
	}
	f.remove(first)
	if got := consumers(); len(got) != 1 || got[0] != timedOut {
		t.Fatalf("consumers %v, want only %s", got, timedOut)
	}

	// A try refused (not timed out): the next asks for a new consumer.
	f.mu.Lock()
	f.serial++
	old = f.current
	f.mu.Unlock()
	old.Stop()
	f.stream = "NO_SUCH_STREAM"
	if err := f.open(ctx, 10*time.Second); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a try on a missing stream: %v, want a refusal", err)
	}
	f.stream = names.OpsStream()
	if err := f.open(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if f.name == timedOut || f.again.name != "" {
		t.Fatalf("after a refusal the next try asked for %q again", f.name)
	}
}
