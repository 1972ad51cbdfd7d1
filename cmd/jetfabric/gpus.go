package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/jetfabric/jetfabric/kernels/all"
	"github.com/jetfabric/jetfabric/worker"
)

// wantGPUs reports whether -gpus asks for any GPU.
func (f *workerFlags) wantGPUs() bool { return f.gpus != "" && f.gpus != "none" && f.gpus != "0" }

// haveGPUs reports whether -gpus asks for GPUs and NVML finds at least one.
func (f *workerFlags) haveGPUs() bool {
	if !f.wantGPUs() {
		return false
	}
	n, err := worker.OpenNVML()
	if err != nil {
		return false
	}
	defer n.Close()
	return len(n.GPUs()) > 0
}

// gpuCount parses -gpus: -1 for all, else the number asked for.
func (f *workerFlags) gpuCount() (int, error) {
	switch f.gpus {
	case "", "none":
		return 0, nil
	case "all":
		return -1, nil
	}
	n, err := strconv.Atoi(f.gpus)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("-gpus %q: want all, none or a number", f.gpus)
	}
	return n, nil
}

// withGPUs adds the GPUs -gpus asks for to cfg, as gpu-0 ..., each on the
// CUDA backend with NVML's name, UUID, memory and telemetry. Without a
// driver, -gpus all logs that once and adds none; a number of GPUs that the
// machine does not have is an error. The returned function closes NVML;
// call it after the worker stopped (the worker closes the backends).
func (f *workerFlags) withGPUs(cfg worker.Config, logf func(string, ...any)) (worker.Config, func(), error) {
	none := func() {}
	want, err := f.gpuCount()
	if err != nil || want == 0 {
		return cfg, none, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	n, err := worker.OpenNVML()
	if err != nil {
		if want > 0 {
			return cfg, none, fmt.Errorf("-gpus %d: %w", want, err)
		}
		logf("worker: no GPU (%v); serving the CPU", err)
		if len(cfg.Devices) == 0 && len(cfg.Jobs) == 0 {
			return cfg, none, errors.New("no GPU found and -cpus 0: nothing to serve")
		}
		return cfg, none, cfg.Validate()
	}
	closeNVML := func() { _ = n.Close() }
	gpus := n.GPUs()
	if want > len(gpus) {
		closeNVML()
		return cfg, none, fmt.Errorf("-gpus %d: this machine has %d", want, len(gpus))
	}
	if want < 0 {
		want = len(gpus)
	}
	// CUDA numbers devices fastest first unless told otherwise; NVML by
	// PCI bus id. The same order makes gpu-N one device for both.
	if os.Getenv("CUDA_DEVICE_ORDER") == "" {
		_ = os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
	}
	var devs []worker.Device
	for i := range want {
		b, err := all.OpenGPU(gpus[i].Index, all.WithTF32(f.tf32), all.WithChains(!f.noChains))
		if err != nil {
			for _, d := range devs {
				if c, ok := d.Backend.(interface{ Close() error }); ok {
					_ = c.Close()
				}
			}
			closeNVML()
			return cfg, none, fmt.Errorf("gpu-%d: %w", gpus[i].Index, err)
		}
		d := n.Device(i, b)
		logf("worker: %s: %s (%s, compute capability %s, %d MiB)", d.Name, gpus[i].Name, gpus[i].UUID, d.Props["compute_capability"], gpus[i].Memory>>20)
		devs = append(devs, d)
	}
	for i := range devs {
		devs[i].Budget = f.budget
	}
	cfg.Devices = append(cfg.Devices, devs...)
	if err := cfg.Validate(); err != nil {
		closeNVML()
		return cfg, none, err
	}
	return cfg, closeNVML, nil
}
