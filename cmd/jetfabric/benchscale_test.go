package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestBenchScale runs a tiny scaling benchmark: real broker and worker
// processes, jobs through the job queue.
func TestBenchScale(t *testing.T) {
	t.Setenv("JETFABRIC_TEST_MAIN", "1") // the spawned processes run main
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "--scale", "1,2", "--scale-jobs", "4", "--scale-n", "16", "--scale-chain", "2", "--scale-sets", "1"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{"1 workers", "2 workers", "jobs/s", "job queue", "-gpus none"} {
		if !strings.Contains(stdout.String(), want) {
			t.Fatalf("no %q in\n%s", want, stdout.String())
		}
	}
}

func TestBenchScaleRejects(t *testing.T) {
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"bench", "--scale", "0"}, "want increasing worker counts from 1"},
		{[]string{"bench", "--scale", "2,1"}, "want increasing"},
		{[]string{"bench", "--scale", "one"}, "want increasing"},
		{[]string{"bench", "--scale", "1", "--scale-jobs", "0"}, "-scale-jobs 0"},
		{[]string{"bench", "--scale", "1", "--worker-cores", "-1"}, "-worker-cores -1"},
		{[]string{"bench", "--scale", "1", "--scale-gpus", "many"}, "-scale-gpus"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), c.mention) {
			t.Errorf("%v: exit %d, want 1 mentioning %q:\n%s%s", c.args, code, c.mention, stdout.String(), stderr.String())
		}
	}
}

// TestSpawnBroker: a broker process comes up on a port it chose, named
// by its ready line; one that exits before it is ready (here: no store)
// fails with an error saying so.
func TestSpawnBroker(t *testing.T) {
	t.Setenv("JETFABRIC_TEST_MAIN", "1") // the spawned processes run main
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	url, stop, err := spawnBroker(ctx, exe, nil, "nats://", func(listen string) []string {
		return []string{"broker", "--listen", listen, "--http", "", "--store", dir}
	})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	if strings.HasSuffix(url, ":4222") || strings.HasSuffix(url, ":-1") {
		t.Errorf("url %s: not a port the broker chose", url)
	}
	nc.Close()
	stop()
	_, _, err = spawnBroker(ctx, exe, nil, "nats://", func(listen string) []string {
		return []string{"broker", "--listen", listen, "--http", ""}
	})
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("a broker that cannot start: %v", err)
	}
	for line, want := range map[string]string{
		"jetfabric broker ready: clients nats://127.0.0.1:40509, monitoring , store /tmp/x": "127.0.0.1:40509",
		"jetfabric broker ready: clients tls://127.0.0.1:7, monitoring http://x, store s":   "127.0.0.1:7",
		"jetfabric broker: shutting down":                                                   "",
	} {
		got := ""
		if m := brokerReady.FindStringSubmatch(line); m != nil {
			got = m[1]
		}
		if got != want {
			t.Errorf("%q: address %q, want %q", line, got, want)
		}
	}
}
