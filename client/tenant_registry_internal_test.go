package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestTenantDevice: a tenant, which reads registry keys only by direct
// get, finds a device in the registry service's list (the leader's view)
// before calling it unregistered; a device the list does not hold is not
// found, and Open of it fails with ErrNoDevice.
func TestTenantDevice(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, false)
	if err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	workertest.Run(t, b, workertest.CPUs(1))
	c, err := Connect(b.ClientURL(), WithCreds(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, ok, err := c.tenantDevice(ctx, "cpu-0")
	if err != nil || !ok || d.Name != "cpu-0" || d.State != "serving" {
		t.Fatalf("cpu-0 in the registry service's list: %+v %t %v", d, ok, err)
	}
	for _, name := range []string{"cpu-99", "gpu-0"} {
		if d, ok, err := c.tenantDevice(ctx, name); err != nil || ok {
			t.Errorf("%s: %+v %t %v, want not listed", name, d, ok, err)
		}
		if _, err := c.Open(ctx, name); !errors.Is(err, ErrNoDevice) {
			t.Errorf("Open %s: %v, want ErrNoDevice", name, err)
		}
	}
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Full([]int{2}, 3)
	if v, err := x.Float32s(ctx); err != nil || v[0] != 3 {
		t.Fatalf("a tenant's session on cpu-0: %v %v", v, err)
	}
}
