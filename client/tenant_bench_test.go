package client_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// BenchmarkTenants: a tiny op and its read (round trip), and pipelined
// ops on one session (1,000 adds and frees, then a sync, per iteration),
// on a fabric without tenants (off), on one with them (on: operator mode,
// the client a user of the tenant's own account, its frames crossing the
// account's imports, the worker checking the tenant's reply subject and
// quotas) and on one with tenants and TLS (tls: the client's and the
// worker's connections both over TLS). The worker connects over TCP in
// all three, as a worker process does. The fabrics run side by side and
// the measurements alternate.
func BenchmarkTenants(b *testing.B) {
	ctx := context.Background()
	modes := []string{"off", "on", "tls"}
	sessions := map[string]*client.Session{}
	for _, mode := range modes {
		c := tenantBenchFabric(b, mode)
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close(ctx) })
		sessions[mode] = s
	}
	// Three rounds, each measuring every mode in turn, so that a machine
	// busy with other work weighs on all alike (-count would run each
	// sub-benchmark its times in a row).
	for range 3 {
		for _, mode := range modes {
			s := sessions[mode]
			x := s.Full([]int{4}, 1)
			b.Run("roundtrip/"+mode, func(b *testing.B) {
				for b.Loop() {
					if _, err := x.Add(x).Read(ctx); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/roundtrip")
			})
		}
		for _, mode := range modes {
			s := sessions[mode]
			x := s.Full([]int{4}, 1)
			b.Run("pipelined/"+mode, func(b *testing.B) {
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

// tenantBenchFabric starts a broker and a worker for mode (off, on or
// tls; see BenchmarkTenants) and connects a client.
func tenantBenchFabric(b *testing.B, mode string) *client.Client {
	b.Helper()
	var copts []client.Option
	var wopts []nats.Option
	var dir string
	if mode != "off" {
		dir = b.TempDir()
		if err := tenant.Init(dir); err != nil {
			b.Fatal(err)
		}
		creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "bench", Sessions: 16, Bytes: 1 << 30, FPS: 1e6}, false)
		if err != nil {
			b.Fatal(err)
		}
		copts = append(copts, client.WithCreds(creds))
		d, err := tenant.Load(dir)
		if err != nil {
			b.Fatal(err)
		}
		wopts = append(wopts, broker.ServiceUser(d))
	}
	var tlsFiles certs.Files
	if mode == "tls" {
		var err error
		if tlsFiles, err = certs.Write(b.TempDir(), certs.Options{Hosts: []string{"127.0.0.1"}}); err != nil {
			b.Fatal(err)
		}
		copts = append(copts, client.WithTLS(tlsFiles.CA, "", ""))
		wopts = append(wopts, nats.RootCAs(tlsFiles.CA))
	}
	br := brokertest.Run(b, func(c *broker.Config) {
		c.AuthDir = dir
		if mode == "tls" {
			c.TLS = broker.TLSConfig{CertFile: tlsFiles.ServerCert, KeyFile: tlsFiles.ServerKey, CAFile: tlsFiles.CA}
		}
	})
	startTCPWorker(b, br, wopts)
	c, err := client.Connect(br.ClientURL(), copts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}
