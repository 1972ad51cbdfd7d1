package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestBench runs a tiny fabric benchmark in each layout and checks that
// the report has every figure, the baselines included.
func TestBench(t *testing.T) {
	t.Setenv("JETFABRIC_TEST_MAIN", "1") // the spawned processes run main
	for _, layout := range []string{"inproc", "procs"} {
		var stdout, stderr bytes.Buffer
		args := []string{"bench", "--layout", layout, "--rounds", "50", "--ops", "8192", "--upload-mib", "5", "--xfer-storage", "memory", "--json"}
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", layout, code, stdout.String(), stderr.String())
		}
		var rep benchReport
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("%s: report is not JSON: %v\n%s", layout, err, stdout.String())
		}
		for name, v := range map[string]float64{
			"round trip": rep.RoundTripP50us, "raw request": rep.RawRequestP50us, "floor": rep.FloorP50us,
			"pipelined": rep.PipelinedOpsPerS, "replays": rep.ReplayOpsPerS, "raw publish": rep.RawPublishFramesS, "upload": rep.UploadMBs, "read-back": rep.ReadMBs,
		} {
			if !(v > 0) {
				t.Errorf("%s: %s is %v in %s", layout, name, v, stdout.String())
			}
		}
		if rep.XferStorage != "memory" {
			t.Errorf("%s: xfer storage %q", layout, rep.XferStorage)
		}
	}
}

// TestBenchTLS: bench --tls measures a plain fabric and one with TLS on
// every connection (the broker, worker and raw responder processes given
// the certificates in -layout procs) and reports both with their ratios.
func TestBenchTLS(t *testing.T) {
	t.Setenv("JETFABRIC_TEST_MAIN", "1")
	for _, layout := range []string{"inproc", "procs"} {
		var stdout, stderr bytes.Buffer
		args := []string{"bench", "--tls", "--tls-runs", "1", "--layout", layout, "--rounds", "30", "--ops", "4096", "--upload-mib", "2", "--xfer-storage", "memory", "--json"}
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", layout, code, stdout.String(), stderr.String())
		}
		var rep tlsReport
		if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
			t.Fatalf("%s: report is not JSON: %v\n%s", layout, err, stdout.String())
		}
		for _, m := range tlsMetrics {
			if !(*m.get(&rep.Plain) > 0) || !(*m.get(&rep.TLS) > 0) || !(rep.Ratios[m.key] > 0) {
				t.Errorf("%s: %s: plain %v, TLS %v, ratio %v", layout, m.key, *m.get(&rep.Plain), *m.get(&rep.TLS), rep.Ratios[m.key])
			}
		}
		if !strings.Contains(stderr.String(), "TLS (tls://127.0.0.1:") {
			t.Errorf("%s: the TLS fabric's URL is not tls://:\n%s", layout, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"bench", "--tls", "--tls-runs", "0"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "-tls-runs 0") {
		t.Errorf("--tls-runs 0: exit %d: %s", code, stderr.String())
	}
}

// TestBenchURL measures a fabric that is already running (-url), as
// python/bench.py has the Go client do beside the Python one; a URL where
// nothing listens fails with the connection's error.
func TestBenchURL(t *testing.T) {
	t.Setenv("JETFABRIC_TEST_MAIN", "1") // the raw responder runs main
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1))
	var stdout, stderr bytes.Buffer
	args := []string{"bench", "--url", b.ClientURL(), "--rounds", "50", "--ops", "8192", "--upload-mib", "5", "--json"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	var rep benchReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report is not JSON: %v\n%s", err, stdout.String())
	}
	if !(rep.RoundTripP50us > 0 && rep.RawRequestP50us > 0 && rep.UploadMBs > 0 && rep.ReadMBs > 0) {
		t.Errorf("figures missing: %s", stdout.String())
	}
	if !strings.Contains(rep.Layout, b.ClientURL()) {
		t.Errorf("layout %q does not name the fabric", rep.Layout)
	}
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), []string{"bench", "--url", "nats://127.0.0.1:1", "--rounds", "1"}, &stdout, &stderr); code == 0 {
		t.Errorf("bench of a URL where nothing listens succeeded:\n%s", stdout.String())
	}
}
