package broker_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

func TestAuthDirOperatorMode(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	if err := tenant.Init(dir); err == nil {
		t.Error("a second init replaced the operator")
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme", Bytes: 1 << 20, Sessions: 2}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, false); err == nil {
		t.Error("a tenant was added twice")
	}
	if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "bad.name"}, false); err == nil {
		t.Error("a tenant name with a dot was accepted")
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	ctx := context.Background()

	// No credentials: refused.
	if nc, err := nats.Connect(b.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}
	// The service user sees everything: the streams capture both layouts,
	// the tenant's bucket and record exist.
	svc, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	s, err := js.Stream(ctx, "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.CachedInfo().Config.Subjects, " "); got != "fabric.ops.*.* fabric.t.*.ops.*.*" {
		t.Errorf("ops subjects %q", got)
	}
	os, err := js.ObjectStore(ctx, "FABRIC_XFER_acme")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Status(ctx)
	if st.(*jetstream.ObjectBucketStatus).StreamInfo().Config.MaxBytes != 1<<20 {
		t.Errorf("tenant bucket max bytes %d", st.(*jetstream.ObjectBucketStatus).StreamInfo().Config.MaxBytes)
	}
	kv, _ := js.KeyValue(ctx, "FABRIC_CTRL")
	e, err := kv.Get(ctx, "tenant.acme")
	if err != nil {
		t.Fatalf("tenant record: %v", err)
	}
	if rec, _, err := tenant.VerifyRecord(e.Value(), b.AccountKey(), "acme"); err != nil || rec.Sessions != 2 {
		t.Errorf("tenant record %+v: %v", rec, err)
	}
	// Records are verified: another name, another signer, no JWT at all.
	if _, _, err := tenant.VerifyRecord(e.Value(), b.AccountKey(), "other"); err == nil {
		t.Error("acme's record passed as another tenant's")
	}
	if _, _, err := tenant.VerifyRecord(e.Value(), "ADIFFERENTACCOUNT", "acme"); err == nil {
		t.Error("a record passed as signed by another account")
	}
	if _, _, err := tenant.VerifyRecord([]byte(`{"name":"acme"}`), b.AccountKey(), "acme"); err == nil {
		t.Error("an unsigned record passed")
	}

	// The tenant: refused outside its namespace, and the refusals counted.
	errs := make(chan error, 16)
	nc, err := nats.Connect(b.ClientURL(), nats.UserCredentials(creds), nats.CustomInboxPrefix("_INBOX_fabric.t.acme"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("fabric.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("fabric.ops.cpu-0.x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Request("$JS.API.STREAM.INFO.FABRIC_OPS", nil, time.Second); err == nil {
		t.Error("the tenant read the ops stream's info")
	}
	tjs, _ := jetstream.New(nc)
	if _, err := tjs.ObjectStore(ctx, "FABRIC_XFER_acme"); err != nil {
		t.Errorf("the tenant cannot open its own bucket: %v", err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		v := b.Violations()
		if v.Publish < 2 || v.Subscribe < 1 {
			return fmt.Errorf("violations %+v", v)
		}
		return nil
	})
	var m bytes.Buffer
	if err := b.WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.String(), `jetfabric_broker_permission_violations_total{server="jetfabric",kind="subscribe"} 1`) {
		t.Errorf("metrics:\n%s", m.String())
	}
}
