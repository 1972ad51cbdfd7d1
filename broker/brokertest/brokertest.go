// Package brokertest starts a real jetfabric broker for tests: an embedded
// nats-server with JetStream on a free loopback port, its store in the
// test's temporary directory, shut down when the test ends.
package brokertest

import (
	"context"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
)

// Run starts a provisioned broker on 127.0.0.1 with a random port.
func Run(t testing.TB, edit ...func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.DefaultConfig()
	cfg.Port = -1
	cfg.HTTPPort = 0
	cfg.StoreDir = t.TempDir()
	cfg.Provision.XferMaxBytes = 4 << 30
	for _, e := range edit {
		e(&cfg)
	}
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b
}
