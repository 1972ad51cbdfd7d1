package natsconn_test

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/natsconn"
)

// TestAnother: the second connection reaches the same server under its
// own name, and the first connection's handlers stay with the first.
func TestAnother(t *testing.T) {
	b := brokertest.Run(t)
	closed := make(chan struct{}, 2)
	nc, err := nats.Connect(b.ClientURL(), nats.Name("first"), nats.ClosedHandler(func(*nats.Conn) { closed <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	other, err := natsconn.Another(nc, "first lane 2")
	if err != nil {
		t.Fatal(err)
	}
	if other.Opts.Name != "first lane 2" || other.ConnectedUrl() != nc.ConnectedUrl() || other.Opts.ClosedCB != nil {
		t.Fatalf("another connection: name %q, url %q (first %q), closed handler set: %v", other.Opts.Name, other.ConnectedUrl(), nc.ConnectedUrl(), other.Opts.ClosedCB != nil)
	}
	other.Close()
	select {
	case <-closed:
		t.Fatal("closing the second connection ran the first's closed handler")
	default:
	}
	nc.Close()
	<-closed

	bad := nats.Conn{Opts: nats.GetDefaultOptions()}
	bad.Opts.Servers = []string{"nats://127.0.0.1:1"}
	if _, err := natsconn.Another(&bad, "nowhere"); err == nil {
		t.Fatal("dialled a server that is not there")
	}
}
