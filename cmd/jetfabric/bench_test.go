package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
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
