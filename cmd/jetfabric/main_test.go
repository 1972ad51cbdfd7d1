package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
)

// TestMain lets the test binary run as the jetfabric command, so tests can
// start real worker processes built from this package.
func TestMain(m *testing.M) {
	if os.Getenv("JETFABRIC_TEST_MAIN") == "1" {
		main()
		return
	}
	// The embedded demo starts a worker process from this binary.
	demoWorkerEnv = []string{"JETFABRIC_TEST_MAIN=1"}
	os.Exit(m.Run())
}

// output collects a process's output; safe to read while it runs.
type output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// spawn starts `jetfabric args...` as a separate process.
func spawn(t *testing.T, args ...string) (*exec.Cmd, *output) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "JETFABRIC_TEST_MAIN=1")
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A paused process would never see the SIGTERM: resume it first,
		// and kill it if it does not stop in time.
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return cmd, out
}

func waitDevice(t *testing.T, url, device string) {
	t.Helper()
	c, err := client.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		devs, err := c.Devices(context.Background())
		if err == nil {
			for _, d := range devs {
				if d.Name == device && client.Live(d, time.Now()) {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %s never came up: %v %+v", device, err, devs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWorkerProcess runs the worker as its own OS process, and the demo
// against it across the process boundary.
func TestWorkerProcess(t *testing.T) {
	b := brokertest.Run(t)
	w, out := spawn(t, "worker", "--url", b.ClientURL(), "--cpus", "2")
	waitDevice(t, b.ClientURL(), "cpu-1")

	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"demo", "--url", b.ClientURL(), "--chain", "2000", "--mnist-steps", "0"}, &stdout, &stderr); code != 0 {
		t.Fatalf("demo exited %d\n%s\n%s\nworker:\n%s", code, stdout.String(), stderr.String(), out.String())
	}
	if !strings.Contains(stdout.String(), "demo passed") {
		t.Fatalf("demo output:\n%s", stdout.String())
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"devices", "--url", b.ClientURL()}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "cpu-1") {
		t.Fatalf("devices exited %d:\n%s%s", code, stdout.String(), stderr.String())
	}
	// A clean stop marks the devices stopped.
	_ = w.Process.Signal(syscall.SIGTERM)
	if err := w.Wait(); err != nil {
		t.Fatalf("worker exit: %v\n%s", err, out.String())
	}
	stdout.Reset()
	run(context.Background(), []string{"devices", "--url", b.ClientURL()}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "stopped") {
		t.Fatalf("after stop:\n%s", stdout.String())
	}
}

// TestDemoEmbedded: the demo on its own fabric shows two devices, a
// transfer, a job, a worker killed and its standby carrying on, each
// checked. Its MNIST steps are TestDemoMNIST's: reading the data files
// takes seconds under the race detector.
func TestDemoEmbedded(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"demo", "--chain", "1000", "--mnist-steps", "0"}, &stdout, &stderr); code != 0 {
		t.Fatalf("demo exited %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	t.Logf("demo:\n%s", out)
	for _, want := range []string{
		"1000 dependent adds in order, each freeing the one before (2000 ops): result 1000",
		"transfer cpu-0 -> cpu-1",
		"through FABRIC_JOBS: taken by worker demo-",
		"killed worker demo-a",
		"1000 adds before the kill and 1000 after give 2000",
		"demo passed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output", want)
		}
	}
	if !strings.Contains(stderr.String(), "demo: 1/") || !strings.Contains(stderr.String(), "standby demo-b carries the session on") {
		t.Errorf("progress lines on stderr:\n%s", stderr.String())
	}
}

func TestBadCommandLines(t *testing.T) {
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{nil, 2, "Usage"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"broker", "--listen", "127.0.0.1:-1"}, 1, "store dir is required"},
		{[]string{"broker", "--store", "x", "--listen", "nocolon"}, 1, "-listen"},
		{[]string{"broker", "--store", "x", "--user", "nopassword"}, 2, "name:password"},
		{[]string{"broker", "--store", "x", "--xfer-storage", "tape"}, 1, "want file or memory"},
		{[]string{"broker", "--store", "x", "--raft-timers", "nats"}, 1, "without -cluster"},
		{[]string{"broker", "--store", "x", "--cluster", "c", "--raft-timers", "1s,2s"}, 1, "want heartbeat,election-min,election-max"},
		{[]string{"broker", "--store", "x", "--cluster", "c", "--raft-timers", "1s,2s,3s"}, 1, "at least 3 heartbeats"},
		{[]string{"up", "--store", "x", "--cluster", "c", "--raft-timers", "250ms,2s,2s"}, 1, "must be longer than the shortest"},
		{[]string{"worker", "--cpus", "0"}, 1, "-cpus 0"},
		{[]string{"worker", "--devices", "cpu.0"}, 1, "forbidden character"},
		{[]string{"devices", "--url", "nats://127.0.0.1:1"}, 1, "nothing listens at nats://127.0.0.1:1: start a broker"},
		{[]string{"top", "--url", "http://127.0.0.1:8222"}, 1, "use nats://127.0.0.1:4222"},
		{[]string{"demo", "--url", "ftp://x:1"}, 1, "want nats://host:port"},
		{[]string{"worker", "--url", "https://h:8222"}, 1, "not HTTP"},
		{[]string{"version", "extra"}, 2, "unexpected arguments"},
		{[]string{"healthcheck", "--http", "127.0.0.1:1"}, 1, "is the broker running with -http 127.0.0.1:1?"},
		{[]string{"bench", "--layout", "sideways", "--upload-mib", "0"}, 1, "want inproc or procs"},
		{[]string{"demo", "extra"}, 2, "unexpected arguments"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.mention) {
			t.Errorf("%v: exit %d, want %d mentioning %q:\n%s%s", c.args, code, c.code, c.mention, stdout.String(), stderr.String())
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "jetfabric ") || !strings.Contains(stdout.String(), "go1") {
			t.Errorf("%v: exit %d: %q %q", args, code, stdout.String(), stderr.String())
		}
	}
}

// TestHelp: every command's -h says what it does and gives an example
// before its flags, and shows no internal flag.
func TestHelp(t *testing.T) {
	for _, c := range commands {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{c.name, "-h"}, &stdout, &stderr); code != 0 {
			t.Errorf("%s -h: exit %d", c.name, code)
		}
		out := stderr.String()
		head, _, _ := strings.Cut(out, "\n")
		if !strings.HasPrefix(head, "jetfabric "+c.name+": ") || len(head) < len("jetfabric "+c.name+": ")+10 {
			t.Errorf("%s -h opens with %q", c.name, head)
		}
		ex := strings.Index(out, "Examples:\n  jetfabric "+c.name)
		if fl := strings.Index(out, "Flags:"); ex < 0 || fl >= 0 && fl < ex {
			t.Errorf("%s -h: no example before the flags:\n%s", c.name, out)
		}
		if strings.Contains(out, "internal:") {
			t.Errorf("%s -h shows an internal flag:\n%s", c.name, out)
		}
	}
}

func TestParseBudget(t *testing.T) {
	for _, c := range []struct {
		in       string
		bytes    int64
		fraction float64
		bad      bool
	}{
		{in: "80%", fraction: 0.8},
		{in: "8GiB", bytes: 8 << 30},
		{in: "512 MiB", bytes: 512 << 20},
		{in: "1.5GB", bytes: 1.5e9},
		{in: "4096", bytes: 4096},
		{in: "0%", bad: true},
		{in: "150%", bad: true},
		{in: "-1GiB", bad: true},
		{in: "lots", bad: true},
	} {
		b, f, err := parseBudget(c.in)
		if (err != nil) != c.bad || b != c.bytes || f != c.fraction {
			t.Errorf("parseBudget(%q) = %d, %v, %v; want %d, %v, error %v", c.in, b, f, err, c.bytes, c.fraction, c.bad)
		}
	}
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1536: "1.5K", 20 << 20: "20M", 3 << 30: "3.0G"} {
		if got := byteText(n); got != want {
			t.Errorf("byteText(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRaftTimersFlag: -raft-timers reaches a cluster node's configuration;
// without it the node gets the broker's default (a zero Raft).
func TestRaftTimersFlag(t *testing.T) {
	for value, want := range map[string]broker.RaftTimers{
		"":            {},
		"default":     broker.DefaultRaftTimers(),
		"nats":        broker.NATSRaftTimers(),
		"500ms,2s,4s": {Heartbeat: 500 * time.Millisecond, ElectionMin: 2 * time.Second, ElectionMax: 4 * time.Second},
	} {
		fs := flag.NewFlagSet("broker", flag.ContinueOnError)
		var bf brokerFlags
		bf.register(fs, "127.0.0.1:4222")
		args := []string{"--store", t.TempDir(), "--cluster", "c", "--routes", "nats://127.0.0.1:6222"}
		if value != "" {
			args = append(args, "--raft-timers", value)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := bf.brokerConfig()
		if err != nil || cfg.Cluster.Raft != want {
			t.Errorf("-raft-timers %q: %+v, %v; want %+v", value, cfg.Cluster.Raft, err, want)
		}
	}
}

// TestPrintTenants: each tenant's use of each device, and of all of them
// where it uses several; nothing without tenants.
func TestPrintTenants(t *testing.T) {
	var b strings.Builder
	printTenants(&b, []client.Device{{Name: "cpu-0"}, {Name: "cpu-1"}})
	if b.Len() != 0 {
		t.Errorf("devices without tenants: %q", b.String())
	}
	printTenants(&b, []client.Device{
		{Name: "cpu-1", Tenants: map[string]codec.TenantUse{"b": {Sessions: 2, Bytes: 3 << 20, FPS: 1.5}, "a": {Sessions: 1, Bytes: 100}}},
		{Name: "cpu-0", Tenants: map[string]codec.TenantUse{"b": {Sessions: 1, Bytes: 1 << 20, FPS: 2}}},
	})
	want := `
TENANT  DEVICE  SESSIONS  MEMORY  FRAMES/S
a       cpu-1   1         100B    0.0
b       cpu-0   1         1.0M    2.0
b       cpu-1   2         3.0M    1.5
b       all     3         4.0M    3.5
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
