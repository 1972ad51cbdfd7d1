package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/poll"
)

// streamConfig connects to b and returns the config of its stream name.
func streamConfig(t *testing.T, b *broker.Broker, name string) (jetstream.JetStream, jetstream.StreamConfig) {
	t.Helper()
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return js, s.CachedInfo().Config
}

func TestStartProvisionsEverything(t *testing.T) {
	b := brokertest.Run(t)
	js, cfg := streamConfig(t, b, "FABRIC_OPS")
	ctx := context.Background()
	if cfg.Discard != jetstream.DiscardNew || cfg.Retention != jetstream.LimitsPolicy || cfg.MaxMsgSize != 8<<20 {
		t.Errorf("ops stream config: discard %v retention %v max msg %d", cfg.Discard, cfg.Retention, cfg.MaxMsgSize)
	}
	if len(cfg.Subjects) != 1 || cfg.Subjects[0] != "fabric.ops.*.*" {
		t.Errorf("ops stream subjects %v", cfg.Subjects)
	}
	if _, err := js.KeyValue(ctx, "FABRIC_CTRL"); err != nil {
		t.Error(err)
	}
	for _, b := range []string{"FABRIC_XFER", "FABRIC_RESULTS", "FABRIC_CKPT"} {
		if _, err := js.ObjectStore(ctx, b); err != nil {
			t.Error(err)
		}
	}
	if rs, err := js.Stream(ctx, "OBJ_FABRIC_RESULTS"); err != nil || rs.CachedInfo().Config.Storage != jetstream.MemoryStorage || rs.CachedInfo().Config.MaxBytes <= 0 {
		t.Errorf("results bucket: want memory storage, bounded: %v", err)
	}
	if err := broker.WaitProvisioned(ctx, js, b.Names()); err != nil {
		t.Error(err)
	}
	// Provisioning again is a no-op.
	if err := broker.ProvisionStreams(ctx, js, b.Names(), broker.DefaultProvision()); err != nil {
		t.Errorf("second provision: %v", err)
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Error(err)
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Errorf("second shutdown: %v", err)
	}
}

// TestXferOnMemory: the transfer bucket on memory storage, bounded by
// what the server may hold in memory, however large the configured limit.
func TestXferOnMemory(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) {
		c.Provision.XferStorage = jetstream.MemoryStorage
		c.Provision.XferMaxBytes = 1 << 50
	})
	js, cfg := streamConfig(t, b, "OBJ_FABRIC_XFER")
	ctx := context.Background()
	if cfg.Storage != jetstream.MemoryStorage || cfg.MaxBytes <= 0 || cfg.MaxBytes >= 1<<50 {
		t.Fatalf("transfer bucket on %v with max bytes %d", cfg.Storage, cfg.MaxBytes)
	}
	// The checkpoints stay on file.
	ck, err := js.Stream(ctx, "OBJ_FABRIC_CKPT")
	if err != nil || ck.CachedInfo().Config.Storage != jetstream.FileStorage {
		t.Fatalf("checkpoint bucket: %v", err)
	}
}

func TestRestartKeepsStore(t *testing.T) {
	dir := t.TempDir()
	for i := range 2 {
		b := brokertest.Run(t, func(c *broker.Config) { c.StoreDir = dir })
		nc, err := nats.Connect(b.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		s, err := js.Stream(context.Background(), "FABRIC_OPS")
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != uint64(i) {
			t.Errorf("run %d: %d messages in the ops stream, want %d", i, got, i)
		}
		if _, err := js.Publish(context.Background(), "fabric.ops.cpu-0.s", []byte("x")); err != nil {
			t.Fatal(err)
		}
		nc.Close()
		_ = b.Shutdown(context.Background())
	}
}

func TestAuthRequired(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.Users = []broker.User{{Name: "alice", Password: "s3cret"}} })
	if nc, err := nats.Connect(b.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	}
	nc, err := nats.Connect(b.ClientURL(), nats.UserInfo("alice", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
}

func TestInProcess(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.InProcess = true })
	if b.ClientURL() != "" {
		t.Errorf("in-process broker has URL %q", b.ClientURL())
	}
	nc, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("$JS.API.INFO", nil, 2*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestBadConfig(t *testing.T) {
	for name, edit := range map[string]func(*broker.Config){
		"no store dir":     func(c *broker.Config) { c.StoreDir = "" },
		"tiny payload":     func(c *broker.Config) { c.MaxPayload = 10 },
		"huge payload":     func(c *broker.Config) { c.MaxPayload = 1 << 30 },
		"bad port":         func(c *broker.Config) { c.Port = 70000 },
		"bad prefix":       func(c *broker.Config) { c.Prefix = "a.b" },
		"frame > payload":  func(c *broker.Config) { c.Provision.OpsMaxMsgSize = 16 << 20 },
		"replicas 2":       func(c *broker.Config) { c.Provision.Replicas = 2 },
		"user no password": func(c *broker.Config) { c.Users = []broker.User{{Name: "a"}} },
		"cluster in proc":  func(c *broker.Config) { c.InProcess = true; c.Cluster.Name = "c" },
		"missing file":     func(c *broker.Config) { c.ConfigFile = "/nonexistent/nats.conf" },
		"xfer storage 7":   func(c *broker.Config) { c.Provision.XferStorage = 7 },
		"results ttl":      func(c *broker.Config) { c.Provision.ResultsTTL = -time.Second },
		"results bytes":    func(c *broker.Config) { c.Provision.ResultsMaxBytes = -1 },
		"raft no cluster":  func(c *broker.Config) { c.Cluster.Raft = broker.NATSRaftTimers() },
		"raft elects fast": func(c *broker.Config) {
			c.Cluster.Name = "c"
			c.Cluster.Raft = broker.RaftTimers{Heartbeat: time.Second, ElectionMin: time.Second, ElectionMax: 2 * time.Second}
		},
		"raft no spread": func(c *broker.Config) {
			c.Cluster.Name = "c"
			c.Cluster.Raft = broker.RaftTimers{Heartbeat: time.Second, ElectionMin: 4 * time.Second, ElectionMax: 4 * time.Second}
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := broker.DefaultConfig()
			cfg.StoreDir = t.TempDir()
			cfg.Port = -1
			edit(&cfg)
			_, err := broker.New(cfg)
			if !errors.Is(err, broker.ErrInvalidConfig) {
				t.Fatalf("got %v, want ErrInvalidConfig", err)
			}
			if !strings.HasPrefix(err.Error(), "broker: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
}

// TestClusterNodeShutsDownInLameDuck: a cluster node's Shutdown goes
// through lame duck mode: its clients are told (and move to another node)
// before it closes, and it hands JetStream's leadership over first.
// TestLoneClusterNodeSaysWhy: a cluster node whose peers never come up
// cannot serve JetStream; its start ends at the ready timeout saying it
// waits for a meta leader and naming the routes, instead of a timed out
// provisioning request.
func TestLoneClusterNodeSaysWhy(t *testing.T) {
	cfg := broker.DefaultConfig()
	cfg.Name, cfg.Port, cfg.HTTPPort, cfg.StoreDir = "n1", -1, 0, t.TempDir()
	routes := []string{"nats://127.0.0.1:1", "nats://127.0.0.1:2"}
	cfg.Cluster = broker.ClusterConfig{Name: "fabric", Host: "127.0.0.1", Port: -1, Routes: routes}
	cfg.Provision.Replicas = 3
	cfg.ReadyTimeout = 3 * time.Second
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	err = b.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "JetStream not ready") || !strings.Contains(err.Error(), "elected a meta leader") || !strings.Contains(err.Error(), routes[1]) {
		t.Fatalf("a lone node of a three-node cluster started: %v", err)
	}
}

func TestClusterNodeShutsDownInLameDuck(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	cl := brokertest.RunCluster(t, 3)
	var leader int
	poll.Until(t, time.Minute, 50*time.Millisecond, func() error {
		for i := range 3 {
			if cl.Node(i).Server().JetStreamIsLeader() {
				leader = i
				return nil
			}
		}
		return errors.New("no meta leader")
	})
	told := make(chan struct{})
	nc, err := nats.Connect(cl.Node(leader).ClientURL(), nats.LameDuckModeHandler(func(*nats.Conn) { close(told) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cl.Stop(leader)
	// The notice reaches the connection before the node closes it; its
	// handler runs on the connection's callback goroutine.
	select {
	case <-told:
	case <-time.After(time.Minute):
		t.Fatal("the node shut down without lame duck mode")
	}
}
