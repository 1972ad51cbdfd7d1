package client_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
)

// TestTenantOptionsRefused: bad tenant names, creds files that are not,
// and a tenant's client on a connection without the tenant's inbox prefix.
func TestTenantOptionsRefused(t *testing.T) {
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, name := range []string{"", "a.b", "a b", "*", ">"} {
		if _, err := client.New(nc, client.WithTenant(name)); !errors.Is(err, client.ErrInvalidOption) {
			t.Errorf("tenant %q: %v", name, err)
		}
	}
	if _, err := client.New(nc, client.WithTenant("acme")); !errors.Is(err, client.ErrInvalidOption) {
		t.Errorf("a tenant's client on a connection with the default inbox prefix: %v", err)
	}
	c, err := client.New(nc)
	if err != nil || c.Tenant() != "" {
		t.Fatalf("single-user client: %v %q", err, c.Tenant())
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.creds")
	if err := os.WriteFile(junk, []byte("not a creds file"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{junk, filepath.Join(dir, "missing.creds")} {
		if _, err := client.Connect(b.ClientURL(), client.WithCreds(path)); !errors.Is(err, client.ErrInvalidOption) {
			t.Errorf("creds %s: %v", path, err)
		}
	}
}
