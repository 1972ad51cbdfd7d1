package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
