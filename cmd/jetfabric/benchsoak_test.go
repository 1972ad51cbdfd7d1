package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestBenchSoak runs a tiny state soak: real broker and worker processes,
// sessions whose tensors are checkpointed, the owner SIGKILLed twice with
// a standby waiting, every read compared with a run with neither.
func TestBenchSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker processes; skipped in -short")
	}
	t.Setenv("JETFABRIC_TEST_MAIN", "1") // the spawned processes run main
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "--soak", "2MiB", "--soak-sessions", "4", "--soak-tensor", "256KiB", "--soak-steps", "12",
		"--soak-step-every", "50ms", "--soak-probes", "1", "--soak-checkpoint-interval", "200ms", "--soak-kills", "2",
		"--soak-lease-ttl", "300ms", "--soak-settle", "0s"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	m := regexp.MustCompile(`reads identical to the run without kills: (\d+) of (\d+)`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] || m[2] != "96" { // 4 sessions x 12 steps x (a sum and a probe)
		t.Fatalf("reads line %q in\n%s", m, out)
	}
	for _, want := range []string{"kill 1:", "kill 2:", "read p99:", "RSS at most", "after the sessions were freed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in\n%s", want, out)
		}
	}
	// A step's wait starts at the kill or later: it is never longer than
	// the time from the kill to the answer.
	kills := regexp.MustCompile(`kill \d+: first session answered after (\d+) ms, median session (\d+) ms, last (\d+) ms; their steps waited (\d+) / (\d+) / (\d+) ms`).FindAllStringSubmatch(out, -1)
	if len(kills) != 2 {
		t.Fatalf("%d kill lines with waits in\n%s", len(kills), out)
	}
	for _, k := range kills {
		for i := 1; i <= 3; i++ {
			answer, _ := strconv.Atoi(k[i])
			wait, _ := strconv.Atoi(k[i+3])
			if wait > answer {
				t.Errorf("%q: a wait of %d ms over the %d ms from the kill to the answer", k[0], wait, answer)
			}
		}
	}
}

func TestBenchSoakRejects(t *testing.T) {
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--soak", "lots"}, "-soak"},
		{[]string{"--soak", "50%"}, "-soak"},
		{[]string{"--soak", "1GiB", "--soak-sessions", "0"}, "-soak-sessions"},
		{[]string{"--soak", "1GiB", "--soak-tensor", "1KiB"}, "-soak-tensor"},
		{[]string{"--soak", "1MiB", "--soak-tensor", "1MiB"}, "one tensor"},
		{[]string{"--soak", "1GiB", "--soak-steps", "0"}, "-soak-steps"},
		{[]string{"--soak", "1GiB", "--soak-checkpoint-interval", "0s"}, "-soak-checkpoint-interval"},
		{[]string{"--soak", "1GiB", "--soak-kills", "-1"}, "negative"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), append([]string{"bench"}, c.args...), &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), c.mention) {
			t.Errorf("%v: exit %d, stderr %q; want a failure naming %q", c.args, code, stderr.String(), c.mention)
		}
	}
}

// TestSoakMillisJSON: a latency with no reads to take it from is null in
// the soak's JSON, not an error.
func TestSoakMillisJSON(t *testing.T) {
	b, err := json.Marshal(struct{ A, B millis }{millis(math.NaN()), 1.5})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"A":null,"B":1.500}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
