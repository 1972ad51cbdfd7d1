package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/worker"
)

func TestGPUFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{{"", 0, false}, {"none", 0, false}, {"all", -1, false}, {"0", 0, false}, {"3", 3, false}, {"-1", 0, true}, {"x", 0, true}} {
		f := workerFlags{gpus: tc.in}
		n, err := f.gpuCount()
		if n != tc.want || (err != nil) != tc.err {
			t.Errorf("-gpus %q: %d, %v", tc.in, n, err)
		}
	}
	if _, err := (&workerFlags{cpus: 1, gpus: "x"}).config(nil); err == nil {
		t.Error("-gpus x accepted")
	}
	if _, err := (&workerFlags{cpus: 0, gpus: "none"}).config(nil); err == nil {
		t.Error("-cpus 0 -gpus none accepted")
	}
	if _, err := (&workerFlags{cpus: 1, gpus: "none", cpuThreads: -1}).config(nil); err == nil || !strings.Contains(err.Error(), "-cpu-threads -1") {
		t.Errorf("-cpu-threads -1: %v", err)
	}
}

// Without a driver (or cgo), -gpus all says so once and serves the CPU;
// a number of GPUs is an error.
func TestGPUFlagNoDriver(t *testing.T) {
	if n, err := worker.OpenNVML(); err == nil {
		n.Close()
		t.Skip("this machine has an NVIDIA driver")
	}
	f := workerFlags{cpus: 1, gpus: "all"}
	cfg, err := f.config(nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs []string
	cfg, closeGPUs, err := f.withGPUs(cfg, func(format string, a ...any) { logs = append(logs, fmt.Sprintf(format, a...)) })
	if err != nil {
		t.Fatal(err)
	}
	closeGPUs()
	if len(cfg.Devices) != 1 || cfg.Devices[0].Name != "cpu-0" {
		t.Errorf("devices %+v, want cpu-0 alone", cfg.Devices)
	}
	if len(logs) != 1 || !strings.Contains(logs[0], "no GPU") {
		t.Errorf("logs %q, want one saying no GPU", logs)
	}
	f.gpus = "2"
	if _, _, err := f.withGPUs(cfg, nil); err == nil {
		t.Error("-gpus 2 without a driver accepted")
	}
	f = workerFlags{cpus: 0, gpus: "all"}
	if _, err = f.config(nil); err == nil || !strings.Contains(err.Error(), "-cpus 0") {
		t.Errorf("-cpus 0 with no GPU: %v", err)
	}
}
