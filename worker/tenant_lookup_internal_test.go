package worker

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// TestTenantRecordLookedUp: a tenant provisioned while the worker runs is
// served at its first frame even when the worker's watch of the tenant
// records has not brought its record (here the watch never does): the
// worker looks the record up. A tenant with no record is still refused.
func TestTenantRecordLookedUp(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	release := make(chan struct{})
	testHookTenantWatch = func() { <-release }
	defer func() { testHookTenantWatch = nil }()

	nc, err := nats.Connect(b.ClientURL(), b.ServiceOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultConfig()
	cfg.ID = "lookup"
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New(cpu.WithCache(0))}}
	cfg.CheckpointInterval = 0
	cfg.Tenants, cfg.TenantIssuer = true, b.AccountKey()
	w, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()
	defer close(release) // before the stop: the watch waits in the hook

	names := subjects.Default()
	add := func(name string, provision bool) string {
		rec := codec.Tenant{Name: name}
		creds, err := tenant.Add(dir, names, rec, false)
		if err != nil {
			t.Fatal(err)
		}
		if !provision {
			return creds
		}
		d, err := tenant.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := broker.ProvisionTenant(ctx, js, names, broker.DefaultProvision(), rec, d.Signed[name]); err != nil {
			t.Fatal(err)
		}
		return creds
	}
	run := func(creds string) ([]float32, error) {
		var c *client.Client
		poll.Until(t, time.Minute, 50*time.Millisecond, func() (err error) {
			c, err = client.Connect(b.ClientURL(), client.WithCreds(creds))
			return err
		})
		defer c.Close()
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			return nil, err
		}
		x := s.Full([]int{3}, 2)
		return x.Add(x).Float32s(ctx)
	}
	if v, err := run(add("late", true)); err != nil || !slices.Equal(v, []float32{4, 4, 4}) {
		t.Errorf("the tenant provisioned while the worker ran: %v %v", v, err)
	}
	if v, err := run(add("never", false)); err == nil {
		t.Errorf("a tenant with no record: %v, no error", v)
	}
}
