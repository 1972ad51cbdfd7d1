package main

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// The device benchmarks run (small) against a CPU worker, so the GPU run
// only measures.
func TestBenchDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fabric")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bf := brokerFlags{listen: "127.0.0.1:-1", store: t.TempDir(), name: "jetfabric", maxPayload: 8 << 20, replicas: 1}
	f, err := startFabric(ctx, bf, workerFlags{cpus: 1, idle: time.Minute}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	c, err := client.Connect(f.b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	var rep gpuBench
	if err := benchDevice(ctx, s, 32, 3, 4096, 3, &rep, t.Logf); err != nil {
		t.Fatal(err)
	}
	if rep.MatmulOpsS <= 0 || rep.ChainGBs <= 0 {
		t.Errorf("report %+v", rep)
	}
}
