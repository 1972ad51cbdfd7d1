// Package brokertest starts a real jetfabric broker for tests: an embedded
// nats-server with JetStream on a free loopback port, its store in the
// test's temporary directory, shut down when the test ends.
package brokertest

import (
	"context"
	"fmt"
	"net"
	"strings"
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

// Cluster is a JetStream cluster of real brokers in this process, each on
// its own loopback ports and store, the stream and buckets replicated on
// three nodes. Nodes can be stopped and started again on their store.
type Cluster struct {
	t     testing.TB
	cfgs  []broker.Config
	nodes []*broker.Broker // nil: stopped
}

// RunCluster starts an n-node cluster (n >= 3) and waits until every node
// serves and the fabric is provisioned. Cluster tests are slow: callers
// skip them under -short.
func RunCluster(t testing.TB, n int, edit ...func(*broker.Config)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, cfgs: make([]broker.Config, n), nodes: make([]*broker.Broker, n)}
	ports := freePorts(t, 2*n)
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i]))
	}
	for i := range n {
		cfg := broker.DefaultConfig()
		cfg.Name = fmt.Sprintf("n%d", i+1)
		cfg.Port, cfg.HTTPPort = ports[i], 0
		cfg.StoreDir = t.TempDir()
		cfg.Cluster = broker.ClusterConfig{Name: "fabric", Host: "127.0.0.1", Port: ports[n+i], Routes: routes}
		cfg.Provision.Replicas = 3
		cfg.Provision.XferMaxBytes = 1 << 30
		cfg.Provision.OpsMaxBytes = 1 << 30
		cfg.ReadyTimeout = 2 * time.Minute // three nodes electing on a busy machine
		for _, e := range edit {
			e(&cfg)
		}
		c.cfgs[i] = cfg
	}
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- c.start(i) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("brokertest: cluster: %v", err)
		}
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Stop(i)
		}
	})
	return c
}

func (c *Cluster) start(i int) error {
	b, err := broker.New(c.cfgs[i])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		_ = b.Shutdown(context.Background())
		return fmt.Errorf("node %s: %w", c.cfgs[i].Name, err)
	}
	c.nodes[i] = b
	return nil
}

// URLs are the client URLs of every node, comma-separated, for a client
// that moves to a surviving node by itself.
func (c *Cluster) URLs() string {
	var urls []string
	for _, cfg := range c.cfgs {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", cfg.Port))
	}
	return strings.Join(urls, ",")
}

// Node is node i (nil while stopped).
func (c *Cluster) Node(i int) *broker.Broker { return c.nodes[i] }

// Index is the index of the node named name, or -1.
func (c *Cluster) Index(name string) int {
	for i, cfg := range c.cfgs {
		if cfg.Name == name {
			return i
		}
	}
	return -1
}

// Stop shuts node i down (its store stays).
func (c *Cluster) Stop(i int) {
	if b := c.nodes[i]; b != nil {
		_ = b.Shutdown(context.Background())
		c.nodes[i] = nil
	}
}

// Restart starts the stopped nodes idx again on their stores, at once
// (a node waits for a quorum to serve JetStream), and waits until every
// one serves.
func (c *Cluster) Restart(idx ...int) {
	c.t.Helper()
	errs := make(chan error, len(idx))
	for _, i := range idx {
		if c.nodes[i] != nil {
			errs <- nil
			continue
		}
		go func() { errs <- c.start(i) }()
	}
	for range idx {
		if err := <-errs; err != nil {
			c.t.Fatalf("brokertest: restart: %v", err)
		}
	}
}

// freePorts finds n distinct free loopback ports.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("brokertest: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
