package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/poll"
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
	// The registry has the ops counted at the device's next heartbeat.
	poll.Until(t, time.Minute, 20*time.Millisecond, func() error {
		devs, err := c.Devices(context.Background())
		if err != nil || len(devs) != 1 || devs[0].Ops != 102 {
			return fmt.Errorf("devices %+v, %v: want cpu-0 with 102 ops", devs, err)
		}
		return nil
	})

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
	// cpu-0 serving top-test 1 <mem> <lag> <ops/s> <ops> <beat>: twice.
	if len(rows) < 18 || rows[1] != "serving" || rows[2] != "top-test" || rows[3] != "1" || !strings.ContainsAny(rows[4][len(rows[4])-1:], "BKMGTPE") || rows[7] != "102" {
		t.Errorf("rows %q", rows)
	}
	if rows[6] != "-" { // no rate before a second refresh
		t.Errorf("first ops/s %q, want -", rows[6])
	}

	if code := run(context.Background(), []string{"top", "--interval", "1ms"}, &stdout, &stderr); code != 1 {
		t.Errorf("interval 1ms: exit %d", code)
	}
}

// TestTopWidth: a refresh fits 80 columns, whatever the names and counts.
func TestTopWidth(t *testing.T) {
	now := time.Now()
	devs := []client.Device{
		{Name: "cpu-0", Kind: "cpu", State: "serving", Worker: "0123456789ab-1234567", Sessions: 1234, Lag: 123456789, Ops: 98765432101234, Beat: now.Add(-400 * time.Millisecond)},
		{Name: "a-very-long-device-name-17", Kind: "gpu", State: "serving", Worker: "w", Beat: now.Add(-72 * time.Hour)},
		{Name: "cpu-1", Kind: "cpu", State: "stopped", Worker: "host-1", Beat: now.Add(-90 * time.Minute)},
	}
	v := &topView{prev: map[string]topSample{"cpu-0": {worker: devs[0].Worker, ops: 1, at: now.Add(-time.Second)}}}
	var buf bytes.Buffer
	v.render(context.Background(), &buf, devs, now)
	t.Logf("\n%s", buf.String())
	for _, l := range strings.Split(buf.String(), "\n") {
		if len(l) > 80 {
			t.Errorf("%d columns: %q", len(l), l)
		}
	}
	for _, c := range []struct {
		n    uint64
		want string
	}{{0, "0"}, {999999, "999999"}, {1_250_000, "1.2M"}, {98_765_432_101, "98.8G"}, {98765432101234, "99T"}} {
		if got := count(c.n); got != c.want {
			t.Errorf("count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

// TestDeviceState: devices and top show a device that is behind, stalled
// or stuck, besides lost and the registry's own states.
func TestDeviceState(t *testing.T) {
	now := time.Now()
	serving := client.Device{State: "serving", Beat: now.Add(-time.Second), LastFrame: now.Add(-time.Second)}
	with := func(edit func(*client.Device)) client.Device { d := serving; edit(&d); return d }
	for _, tc := range []struct {
		d    client.Device
		want string
	}{
		{serving, "serving"},
		{with(func(d *client.Device) { d.State = "stopped" }), "stopped"},
		{with(func(d *client.Device) { d.Beat = now.Add(-time.Minute) }), "lost"},
		{with(func(d *client.Device) { d.Lag = 3 }), "behind"},
		{with(func(d *client.Device) { d.Lag, d.Stalled = 3, true }), "stalled"},
		{with(func(d *client.Device) { d.Lag, d.LastFrame = 19, now.Add(-92*time.Second) }), "stuck 1m32s"},
	} {
		if got := deviceState(tc.d, now); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.d, got, tc.want)
		}
	}
}
