package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// startWorker serves cpu-0 from this process against url.
func startWorker(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.ID = "top-test"
	cfg.Devices = []worker.Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}}
	w, err := newWorker(context.Background(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Stop(context.Background())
		nc.Close()
	})
}

func TestTopPlain(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b.ClientURL())
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(context.Background(), "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Full([]int{4}, 1)
	for range 100 {
		x = x.Add(x)
	}
	if _, err := x.Float32s(context.Background()); err != nil {
		t.Fatal(err)
	}

	var stdout, stderr bytes.Buffer
	args := []string{"top", "--url", b.ClientURL(), "--count", "2", "--interval", "100ms"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("top exited %d: %s", code, stderr.String())
	}
	out := stdout.String()
	t.Logf("top:\n%s", out)
	if strings.Contains(out, "\x1b[") {
		t.Error("escape sequences in plain output")
	}
	if n := strings.Count(out, "jetfabric top"); n != 2 {
		t.Errorf("%d refreshes, want 2", n)
	}
	lines := strings.Split(out, "\n")
	var rows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "cpu-0 ") {
			rows = append(rows, strings.Fields(l)...)
		}
	}
	// cpu-0 cpu serving top-test 1 <memory/budget> <applied> 0 <ops/s> <ops> ...: twice.
	if len(rows) < 22 || rows[2] != "serving" || rows[3] != "top-test" || rows[4] != "1" || !strings.Contains(rows[5], "/") || rows[9] != "102" {
		t.Errorf("rows %q", rows)
	}
	if rows[8] != "-" { // no rate before a second refresh
		t.Errorf("first ops/s %q, want -", rows[8])
	}

	if code := run(context.Background(), []string{"top", "--interval", "1ms"}, &stdout, &stderr); code != 1 {
		t.Errorf("interval 1ms: exit %d", code)
	}
}
