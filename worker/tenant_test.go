package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
)

// TestTenantSessionsSurviveARestart: two tenants' sessions with the same
// token are two sessions; a worker's clean stop checkpoints them and the
// next worker restores each to its tenant, quotas included.
func TestTenantSessionsSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	creds := map[string]string{}
	for _, rec := range []codec.Tenant{{Name: "a", Bytes: 1 << 20}, {Name: "b"}} {
		p, err := tenant.Add(dir, subjects.Default(), rec, false)
		if err != nil {
			t.Fatal(err)
		}
		creds[rec.Name] = p
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	w := startWorker(t, b, func(c *worker.Config) { c.CheckpointInterval = 0 })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(name string) *client.Client {
		c, err := client.Connect(b.ClientURL(), client.WithCreds(creds[name]))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ca, cb := connect("a"), connect("b")
	sa, err := ca.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	// a holds 512 KiB of its 1 MiB.
	xa := sa.Full([]int{128 << 10}, 1)
	if err := sa.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// b's frames on a session of the same token: another session, whose
	// tensor 1 is b's own.
	raw := cb.Conn()
	frame, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: []codec.Op{
		{Op: "full", Shape: []int{1}, Value: 2, Out: []uint64{1}}, {Op: "read", In: []uint64{1}, Tag: 1}}})
	bRead := func() codec.Result {
		t.Helper()
		inbox := "_INBOX_fabric.t.b." + sa.ID()
		sub, err := raw.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		m := newMsg("fabric.t.b.ops.cpu-0."+sa.ID(), inbox, frame)
		if err := raw.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		r, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var res codec.Result
		if err := codec.Unmarshal(codec.CBOR, r.Data, &res); err != nil {
			t.Fatal(err)
		}
		return res
	}
	if r := bRead(); len(r.Errors) != 0 || r.Tensor == nil || len(r.Tensor.Shape) != 1 || r.Tensor.Shape[0] != 1 {
		t.Fatalf("b's session of a's token: %+v", r)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	startWorker(t, b, func(c *worker.Config) { c.CheckpointInterval = 0; c.ID = "second" })
	// a's tensor is back, and still counts against a's quota.
	if v, err := xa.Float32s(ctx); err != nil || len(v) != 128<<10 || v[0] != 1 {
		t.Fatalf("a's tensor after the restart: %d values, %v", len(v), err)
	}
	over := sa.Full([]int{192 << 10}, 1)
	if _, err := over.Read(ctx); err == nil {
		t.Error("a's restored bytes were not counted against its quota")
	}
	// b's session was restored as b's: a second read of its tensor 1 gives
	// b's value (its full would be a duplicate id).
	if r := bRead(); len(r.Errors) == 0 || r.Errors[0].Code != codec.CodeDuplicate || r.Tensor == nil || len(r.Tensor.Shape) != 1 || r.Tensor.Shape[0] != 1 {
		t.Errorf("b's restored session: %+v", r)
	}
}

func newMsg(subject, reply string, data []byte) *nats.Msg {
	return &nats.Msg{Subject: subject, Data: data, Header: nats.Header{subjects.HeaderReply: []string{reply}}}
}

// TestTenantHeartbeats: a tenant's heartbeat keeps its own session, not
// another tenant's session of the same token.
func TestTenantHeartbeats(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	conns := map[string]*nats.Conn{}
	for _, name := range []string{"a", "b"} {
		if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: name}, false); err != nil {
			t.Fatal(err)
		}
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	for _, name := range []string{"a", "b"} {
		nc, err := nats.Connect(b.ClientURL(), nats.UserCredentials(tenant.CredsPath(dir, name)), nats.CustomInboxPrefix("_INBOX_fabric.t."+name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		conns[name] = nc
	}
	startWorker(t, b, func(c *worker.Config) { c.IdleTimeout = time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	call := func(name string, ops []codec.Op) codec.Result {
		t.Helper()
		nc := conns[name]
		inbox := "_INBOX_fabric.t." + name + ".s"
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		data, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: ops})
		if err := nc.PublishMsg(newMsg("fabric.t."+name+".ops.cpu-0.s", inbox, data)); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var r codec.Result
		if err := codec.Unmarshal(codec.CBOR, m.Data, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, name := range []string{"a", "b"} {
		call(name, []codec.Op{{Op: "full", Shape: []int{1}, Value: 4, Out: []uint64{1}}, {Op: "sync", Tag: 1}})
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = conns["a"].Publish("fabric.t.a.alive.cpu-0.s", nil)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); <-done }()
	svc, err := nats.Connect(b.ClientURL(), b.ServiceOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	kv, _ := js.KeyValue(ctx, "FABRIC_CTRL")
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		e, err := kv.Get(ctx, subjects.DeviceKey("cpu-0"))
		if err != nil {
			return err
		}
		var d codec.Device
		_ = json.Unmarshal(e.Value(), &d)
		if d.Sessions != 1 {
			return fmt.Errorf("%d sessions, want 1", d.Sessions)
		}
		return nil
	})
	if r := call("a", []codec.Op{{Op: "read", In: []uint64{1}, Tag: 2}}); len(r.Errors) > 0 || r.Tensor == nil {
		t.Errorf("a's beating session: %+v", r)
	}
	if r := call("b", []codec.Op{{Op: "read", In: []uint64{1}, Tag: 2}}); len(r.Errors) != 1 || r.Errors[0].Code != codec.CodeSessionFreed {
		t.Errorf("b's silent session of the same token: %+v", r)
	}
}
