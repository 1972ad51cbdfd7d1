package client_test

import (
	"context"
	"testing"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// BenchmarkTenants: a tiny op and its read (round trip), and pipelined
// ops on one session (1,000 adds and frees, then a sync, per iteration),
// on a fabric without tenants (off) and on one with them (on: operator
// mode, the tenant's permissions checked by the broker, the worker
// checking the tenant's reply subject and quotas). Both fabrics run side
// by side and the measurements alternate.
func BenchmarkTenants(b *testing.B) {
	ctx := context.Background()
	sessions := map[string]*client.Session{}
	for _, name := range []string{"off", "on"} {
		c := tenantBenchFabric(b, name == "on")
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close(ctx) })
		sessions[name] = s
	}
	// Three rounds, each measuring off then on, so that a machine busy
	// with other work weighs on both alike (-count would run each
	// sub-benchmark its times in a row).
	for range 3 {
		for _, name := range []string{"off", "on"} {
			s := sessions[name]
			x := s.Full([]int{4}, 1)
			b.Run("roundtrip/"+name, func(b *testing.B) {
				for b.Loop() {
					if _, err := x.Add(x).Read(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/roundtrip")
			})
		}
		for _, name := range []string{"off", "on"} {
			s := sessions[name]
			x := s.Full([]int{4}, 1)
			b.Run("pipelined/"+name, func(b *testing.B) {
				for b.Loop() {
					for range 1000 {
						x.Add(x).Free()
					}
					if err := s.Sync(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(2000*b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}

func tenantBenchFabric(b *testing.B, on bool) *client.Client {
	b.Helper()
	var opts []client.Option
	edit := func(*broker.Config) {}
	if on {
		dir := b.TempDir()
		if err := tenant.Init(dir); err != nil {
			b.Fatal(err)
		}
		creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "bench", Sessions: 16, Bytes: 1 << 30, FPS: 1e6}, false)
		if err != nil {
			b.Fatal(err)
		}
		edit = func(c *broker.Config) { c.AuthDir = dir }
		opts = append(opts, client.WithCreds(creds))
	}
	br := brokertest.Run(b, edit)
	workertest.Run(b, br, workertest.CPUs(1), func(c *worker.Config) {
		c.CheckpointInterval = 0
		c.Logf = nil
	})
	c, err := client.Connect(br.ClientURL(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}
