package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// BenchmarkTLS: the tiny op + read round trip and pipelined ops on a
// fabric without TLS and, in the same run, on one whose client and worker
// connections both use TLS (the worker over TCP in both, as a worker
// process connects). jetfabric bench --tls measures the same with the raw
// NATS figures beside them.
func BenchmarkTLS(b *testing.B) {
	f, err := certs.Write(b.TempDir(), certs.Options{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		b.Fatal(err)
	}
	type fab struct {
		name string
		c    *client.Client
	}
	var fabs []fab
	for _, side := range []struct {
		name  string
		tls   bool
		nopts []nats.Option
		copts []client.Option
	}{
		{"plain", false, nil, nil},
		{"tls", true, []nats.Option{nats.RootCAs(f.CA)}, []client.Option{client.WithTLS(f.CA, "", "")}},
	} {
		br := brokertest.Run(b, func(c *broker.Config) {
			if side.tls {
				c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA}
			}
		})
		startTCPWorker(b, br, side.nopts)
		c, err := client.Connect(br.ClientURL(), side.copts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		fabs = append(fabs, fab{side.name, c})
	}
	ctx := context.Background()
	for _, f := range fabs {
		b.Run("roundtrip/"+f.name, func(b *testing.B) {
			s := open(b, f.c, "cpu-0")
			one := s.Full([]int{1}, 1)
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				y := one.Add(one)
				if _, err := y.Float32s(ctx); err != nil {
					b.Fatal(err)
				}
				y.Free()
			}
		})
	}
	const chain = 1 << 16
	for _, f := range fabs {
		b.Run("pipelined/"+f.name, func(b *testing.B) {
			for b.Loop() {
				// A session of its own for each chain, opened and
				// closed outside the timing, so no session grows.
				b.StopTimer()
				s, err := f.c.Open(ctx, "cpu-0")
				if err != nil {
					b.Fatal(err)
				}
				one := s.Full([]int{1}, 1)
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				x := s.Full([]int{1}, 0)
				for range chain {
					x = x.Add(one)
				}
				v, err := x.Float32s(ctx)
				if err != nil || v[0] != chain {
					b.Fatalf("chain of %d adds: %v %v", chain, v, err)
				}
				b.StopTimer()
				_ = s.Close(ctx)
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*chain)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// startTCPWorker runs a worker serving cpu-0 on its own TCP connection to
// br, dialled with opts, until the benchmark ends, as a worker process
// connects (workertest.Run connects in process when the broker requires
// TLS).
func startTCPWorker(b *testing.B, br *broker.Broker, opts []nats.Option) {
	b.Helper()
	nc, err := nats.Connect(br.ClientURL(), opts...)
	if err != nil {
		b.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.Devices = workertest.CPUs(1)
	cfg.CheckpointInterval = 0
	cfg.Tenants, cfg.TenantIssuer = br.AccountKey() != "", br.AccountKey()
	w, err := worker.New(nc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = w.Start(ctx)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = w.Stop(context.Background()); nc.Close() })
}
