package sweep_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/sweep"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestNoFrameWaitsForEver: frames on each kind of bad subject get an
// error or a refusal, and none stays in the stream; frames of a served
// device are left to its worker.
func TestNoFrameWaitsForEver(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond })
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	frame := `{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":3},{"op":"read","in":[1],"tag":7}]}`
	publish := func(subject string) error {
		m := nats.NewMsg(subject)
		m.Data = []byte(frame)
		m.Header.Set(subjects.HeaderReply, inbox.Subject)
		m.Header.Set(subjects.HeaderContentType, subjects.ContentTypeJSON)
		_, err := js.PublishMsg(ctx, m, jetstream.WithRetryAttempts(0))
		return err
	}
	// A token too many: no stream takes it.
	if err := publish("fabric.ops.cpu-0.s.x"); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("frame with a token too many: %v; want no stream", err)
	}
	// Stored, but never run: a bad token, a device nobody serves.
	for _, subj := range []string{"fabric.ops.cpu!0.s", "fabric.ops.cpu-99.s"} {
		if err := publish(subj); err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
	}
	// A served device's frame is the worker's.
	if err := publish("fabric.ops.cpu-0.s"); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{codec.CodeInvalidSubject: true, codec.CodeNoDevice: true, "": true}
	cfg := sweep.DefaultConfig()
	cfg.Grace, cfg.Logf = 0, t.Logf
	sw, err := sweep.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The first pass answers the bad token; the second, the device
	// unserved since the first (grace 0).
	for pass := range 2 {
		if _, err := sw.Pass(ctx); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
	}
	for len(want) > 0 {
		m, err := inbox.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("answers missing: %v", want)
		}
		var r codec.Result
		if err := codec.Unmarshal(codec.JSON, m.Data, &r); err != nil {
			t.Fatal(err)
		}
		code := ""
		if len(r.Errors) > 0 {
			code = r.Errors[0].Code
		} else if r.Tensor == nil || r.Tensor.Values[0] != 3 {
			t.Fatalf("the served device's answer: %+v", r)
		}
		if r.Tag != 7 || !want[code] {
			t.Fatalf("answer %+v; want tag 7 and one of %v", r, want)
		}
		delete(want, code)
		t.Logf("answer: tag %d %v", r.Tag, r.Errors)
	}
	s, err := js.Stream(ctx, "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter("fabric.ops.>"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		if subj != "fabric.ops.cpu-0.s" {
			t.Errorf("%s still in the stream", subj)
		}
	}
	if _, err := sweep.New(nc, sweep.Config{Interval: 0}); !errors.Is(err, sweep.ErrInvalidConfig) {
		t.Fatalf("interval 0: %v", err)
	}
}

// TestTenantFrames: a tenant's frames that no worker will run are answered
// and removed too, and answered only under the tenant's inbox.
func TestTenantFrames(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, false)
	if err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	nc, err := nats.Connect(b.ClientURL(), nats.UserCredentials(creds), nats.CustomInboxPrefix("_INBOX_fabric.t.acme"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	mine, err := nc.SubscribeSync("_INBOX_fabric.t.acme.sweep")
	if err != nil {
		t.Fatal(err)
	}
	others, err := svc.SubscribeSync("_INBOX_fabric.t.other.>")
	if err != nil {
		t.Fatal(err)
	}
	frame := `{"v":1,"ops":[{"op":"read","in":[1],"tag":7}]}`
	for subj, reply := range map[string]string{
		"fabric.t.acme.ops.cpu!0.s":  "_INBOX_fabric.t.acme.sweep",
		"fabric.t.acme.ops.cpu-99.s": "_INBOX_fabric.t.acme.sweep",
		"fabric.t.acme.ops.cpu-98.s": "_INBOX_fabric.t.other.x", // not acme's inbox: no answer
	} {
		m := nats.NewMsg(subj)
		m.Data = []byte(frame)
		m.Header.Set(subjects.HeaderReply, reply)
		m.Header.Set(subjects.HeaderContentType, subjects.ContentTypeJSON)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
	}
	cfg := sweep.DefaultConfig()
	cfg.Grace, cfg.Logf = 0, t.Logf
	sw, err := sweep.New(svc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	removed := 0
	for pass := range 2 {
		n, err := sw.Pass(ctx)
		if err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		removed += n
	}
	if removed != 3 {
		t.Errorf("%d frames removed, want 3", removed)
	}
	want := map[string]bool{codec.CodeInvalidSubject: true, codec.CodeNoDevice: true}
	for len(want) > 0 {
		m, err := mine.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatalf("answers missing: %v", want)
		}
		var r codec.Result
		if err := codec.Unmarshal(codec.JSON, m.Data, &r); err != nil || len(r.Errors) != 1 || !want[r.Errors[0].Code] {
			t.Fatalf("answer %+v %v", r, err)
		}
		delete(want, r.Errors[0].Code)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := others.NextMsg(0); err == nil {
		t.Errorf("the sweeper answered outside the tenant's inbox, on %s", m.Subject)
	}
}
