package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// claimWorker claims n cpu slots as worker id and starts a worker on them.
func claimWorker(t *testing.T, b *broker.Broker, id string, n int) *worker.Worker {
	t.Helper()
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names, err := worker.ClaimDevices(ctx, nc, worker.Claim{Kind: "cpu", Count: n, Worker: id, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.ID = id
	cfg.Heartbeat = 100 * time.Millisecond
	cfg.Logf = t.Logf
	for _, name := range names {
		cfg.Devices = append(cfg.Devices, worker.Device{Name: name, Kind: "cpu", Backend: cpu.New()})
	}
	w, err := worker.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return w
}

func TestClaimDistinctSlots(t *testing.T) {
	b := brokertest.Run(t)
	w1 := claimWorker(t, b, "w1", 1)
	w2 := claimWorker(t, b, "w2", 1)
	if got := w1.Devices(); !slices.Equal(got, []string{"cpu-0"}) {
		t.Errorf("first worker serves %v, want [cpu-0]", got)
	}
	if got := w2.Devices(); !slices.Equal(got, []string{"cpu-1"}) {
		t.Errorf("second worker serves %v, want [cpu-1]", got)
	}
	w3 := claimWorker(t, b, "w3", 2)
	if got := w3.Devices(); !slices.Equal(got, []string{"cpu-2", "cpu-3"}) {
		t.Errorf("third worker serves %v, want [cpu-2 cpu-3]", got)
	}
	// A stopped worker's slot is free again, lowest first.
	if err := w1.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	w4 := claimWorker(t, b, "w4", 1)
	if got := w4.Devices(); !slices.Equal(got, []string{"cpu-0"}) {
		t.Errorf("after cpu-0 stopped, a new worker serves %v, want [cpu-0]", got)
	}
}

// TestClaimConcurrent: workers that claim at the same moment never share
// a slot.
func TestClaimConcurrent(t *testing.T) {
	b := brokertest.Run(t)
	const n = 6
	var mu sync.Mutex
	var all []string
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			nc, err := nats.Connect(b.ClientURL())
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got, err := worker.ClaimDevices(ctx, nc, worker.Claim{Kind: "cpu", Count: 2, Worker: fmt.Sprint("w", i)})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			all = append(all, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, name := range all {
		if seen[name] {
			t.Errorf("slot %s claimed twice: %v", name, all)
		}
		seen[name] = true
	}
	if len(seen) != 2*n {
		t.Errorf("%d distinct slots, want %d: %v", len(seen), 2*n, all)
	}
	for i := range 2 * n {
		if !seen[fmt.Sprint("cpu-", i)] {
			t.Errorf("cpu-%d not claimed: %v", i, all)
		}
	}
}

func TestClaimRejects(t *testing.T) {
	b := brokertest.Run(t)
	claimWorker(t, b, "w1", 1)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cases := []struct {
		name    string
		c       worker.Claim
		mention string
	}{
		{"no kind", worker.Claim{Count: 1, Worker: "x"}, "no device kind"},
		{"bad kind", worker.Claim{Kind: "cpu.*", Count: 1, Worker: "x"}, "kind"},
		{"zero count", worker.Claim{Kind: "cpu", Count: 0, Worker: "x"}, "want 1 to"},
		{"negative count", worker.Claim{Kind: "cpu", Count: -2, Worker: "x"}, "want 1 to"},
		{"no worker", worker.Claim{Kind: "cpu", Count: 1}, "worker id"},
		{"bad prefix", worker.Claim{Prefix: "a b", Kind: "cpu", Count: 1, Worker: "x"}, "claim"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := worker.ClaimDevices(ctx, nc, c.c)
			if !errors.Is(err, worker.ErrInvalidConfig) || !strings.Contains(err.Error(), c.mention) {
				t.Errorf("error %v; want ErrInvalidConfig mentioning %q", err, c.mention)
			}
		})
	}
	t.Run("all taken", func(t *testing.T) {
		_, err := worker.ClaimDevices(ctx, nc, worker.Claim{Kind: "cpu", Count: 2, Max: 2, Worker: "x"})
		if err == nil || !strings.Contains(err.Error(), "only 1 of 2") {
			t.Errorf("error %v; want one of two slots free", err)
		}
		// The slot it found is released: it is free for the next claim.
		got, err := worker.ClaimDevices(ctx, nc, worker.Claim{Kind: "cpu", Count: 1, Worker: "y"})
		if err != nil || !slices.Equal(got, []string{"cpu-1"}) {
			t.Errorf("claim after a failed claim: %v, %v; want [cpu-1]", got, err)
		}
	})
}
