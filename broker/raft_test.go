package broker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
)

// TestRaftTimers: a cluster node sets nats-server's raft timers to its
// configuration, and nats-server's raft draws its election waits from
// them; a node with other timers cannot start beside it in the same
// process; once every node has stopped, other timers can be set.
func TestRaftTimers(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	// False when nats-server no longer has the variables linked in
	// raft_linkname.go (an upgraded module): the build does not fail.
	if !broker.RaftLinked {
		t.Fatal("nats-server's raft timers are not linked: see broker/raft_linkname.go")
	}
	want := broker.RaftTimers{Heartbeat: 400 * time.Millisecond, ElectionMin: 2 * time.Second, ElectionMax: 2500 * time.Millisecond}
	cl := brokertest.RunCluster(t, 3, func(c *broker.Config) { c.Cluster.Raft = want })
	if got := broker.CurrentRaftTimers(); got != want {
		t.Fatalf("nats-server's raft timers %v while the cluster runs, want %v", got, want)
	}
	for range 1000 {
		if d := broker.DrawElectionWait(); d < want.ElectionMin || d >= want.ElectionMax {
			t.Fatalf("nats-server drew an election wait of %v, want [%v, %v)", d, want.ElectionMin, want.ElectionMax)
		}
	}

	// A node of another cluster, with other timers, in the same process.
	cfg := broker.DefaultConfig()
	cfg.Name, cfg.Port, cfg.HTTPPort, cfg.StoreDir = "other", -1, 0, t.TempDir()
	cfg.Cluster = broker.ClusterConfig{Name: "other", Host: "127.0.0.1", Port: -1, Raft: broker.NATSRaftTimers()}
	other, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = other.Start(ctx)
	if !errors.Is(err, broker.ErrInvalidConfig) || !strings.Contains(err.Error(), want.String()) {
		t.Fatalf("a node with other raft timers started beside the cluster: %v; want ErrInvalidConfig naming %v", err, want)
	}
	if err := other.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := broker.CurrentRaftTimers(); got != want {
		t.Fatalf("nats-server's raft timers %v after the refused node, want %v", got, want)
	}

	// The same timers again: a node may join (acquire counts it).
	if err := broker.AcquireRaftTimers(want); err != nil {
		t.Fatal(err)
	}
	broker.ReleaseRaftTimers()

	for i := range 3 {
		cl.Stop(i)
	}
	if err := broker.AcquireRaftTimers(broker.NATSRaftTimers()); err != nil {
		t.Fatalf("other timers once the cluster stopped: %v", err)
	}
	defer broker.ReleaseRaftTimers()
	if got := broker.CurrentRaftTimers(); got != broker.NATSRaftTimers() {
		t.Fatalf("nats-server's raft timers %v, want %v", got, broker.NATSRaftTimers())
	}
}

// TestParseRaftTimers: the flag's forms, and every kind of bad timers.
func TestParseRaftTimers(t *testing.T) {
	for in, want := range map[string]broker.RaftTimers{
		"default":                           broker.DefaultRaftTimers(),
		"nats":                              broker.NATSRaftTimers(),
		"250ms,1.5s,3s":                     broker.DefaultRaftTimers(),
		" 500ms, 2s ,4s":                    {Heartbeat: 500 * time.Millisecond, ElectionMin: 2 * time.Second, ElectionMax: 4 * time.Second},
		"1s,4s,9s":                          broker.NATSRaftTimers(),
		"50ms,150ms,151ms":                  {Heartbeat: 50 * time.Millisecond, ElectionMin: 150 * time.Millisecond, ElectionMax: 151 * time.Millisecond},
		broker.DefaultRaftTimers().String(): broker.DefaultRaftTimers(),
	} {
		got, err := broker.ParseRaftTimers(in)
		if err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	for in, mention := range map[string]string{
		"":               "want heartbeat,election-min,election-max",
		"fast":           "want heartbeat,election-min,election-max",
		"1s,2s":          "want heartbeat,election-min,election-max",
		"1s,4s,9s,10s":   "want heartbeat,election-min,election-max",
		"1s,4s,nine":     "invalid duration",
		"10ms,1s,2s":     "heartbeat 10ms",
		"3s,10s,20s":     "heartbeat 3s",
		"-1s,4s,9s":      "heartbeat -1s",
		"1s,2s,3s":       "at least 3 heartbeats",
		"250ms,3s,3s":    "must be longer than the shortest",
		"250ms,3s,2s":    "must be longer than the shortest",
		"250ms,1.5s,90s": "at most 1m0s",
	} {
		_, err := broker.ParseRaftTimers(in)
		if !errors.Is(err, broker.ErrInvalidConfig) || !strings.Contains(err.Error(), mention) {
			t.Errorf("%q: %v; want ErrInvalidConfig mentioning %q", in, err, mention)
		}
	}
	// Bad timers fail before anything is set.
	before := broker.CurrentRaftTimers()
	if err := broker.AcquireRaftTimers(broker.RaftTimers{Heartbeat: time.Second, ElectionMin: time.Second, ElectionMax: 2 * time.Second}); !errors.Is(err, broker.ErrInvalidConfig) {
		t.Fatalf("acquire of bad timers: %v", err)
	}
	if got := broker.CurrentRaftTimers(); got != before {
		t.Fatalf("bad timers changed nats-server's: %v, was %v", got, before)
	}
}
