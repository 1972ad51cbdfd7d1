//go:build cgo && linux

package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/jetfabric/jetfabric/codec"
)

// nvmlLib is the part of NVML the worker uses: nvml.New() and the mock of
// go-nvml's tests both have it.
type nvmlLib interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// nvmlDevice is the part of an NVML device handle the worker uses.
type nvmlDevice interface {
	GetName() (string, nvml.Return)
	GetUUID() (string, nvml.Return)
	GetMemoryInfo() (nvml.Memory, nvml.Return)
	GetCudaComputeCapability() (int, int, nvml.Return)
	GetUtilizationRates() (nvml.Utilization, nvml.Return)
	GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return)
	GetPowerUsage() (uint32, nvml.Return)
}

// OpenNVML loads NVML (libnvidia-ml.so.1, found at run time) and lists the
// GPUs. Without a driver it returns an error wrapping ErrNoGPU.
func OpenNVML() (*NVML, error) { return openNVML(nvml.New()) }

func openNVML(lib nvmlLib) (*NVML, error) {
	if err := nvmlError("init", lib.Init()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoGPU, err)
	}
	n, err := discover(lib)
	if err != nil {
		_ = lib.Shutdown()
		return nil, err
	}
	return n, nil
}

func discover(lib nvmlLib) (*NVML, error) {
	count, ret := lib.DeviceGetCount()
	if err := nvmlError("device count", ret); err != nil {
		return nil, err
	}
	devs := make([]nvmlDevice, count)
	gpus := make([]GPU, count)
	for i := range count {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if err := nvmlError("device handle", ret); err != nil {
			return nil, fmt.Errorf("gpu %d: %w", i, err)
		}
		d, ok := h.(nvmlDevice)
		if !ok {
			return nil, fmt.Errorf("worker: NVML device %d lacks methods the worker needs", i)
		}
		g := GPU{Index: i}
		var errs []error
		var r nvml.Return
		g.Name, r = d.GetName()
		errs = append(errs, nvmlError("name", r))
		g.UUID, r = d.GetUUID()
		errs = append(errs, nvmlError("uuid", r))
		mem, r := d.GetMemoryInfo()
		errs = append(errs, nvmlError("memory", r))
		g.Memory = int64(mem.Total)
		g.Major, g.Minor, r = d.GetCudaComputeCapability()
		errs = append(errs, nvmlError("compute capability", r))
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("gpu %d: %w", i, err)
		}
		devs[i], gpus[i] = d, g
	}
	return &NVML{
		gpus:     gpus,
		sample:   func(i int) (codec.Telemetry, error) { return sample(devs[i]) },
		shutdown: func() error { return nvmlError("shutdown", lib.Shutdown()) },
	}, nil
}

// sample reads a device's telemetry. A field NVML does not support on this
// device stays zero; other failures are errors.
func sample(d nvmlDevice) (codec.Telemetry, error) {
	t := codec.Telemetry{Time: time.Now().UTC()}
	var errs []error
	if u, r := d.GetUtilizationRates(); r == nvml.SUCCESS {
		t.Util, t.MemUtil = int(u.Gpu), int(u.Memory)
	} else {
		errs = append(errs, optional("utilization", r))
	}
	if m, r := d.GetMemoryInfo(); r == nvml.SUCCESS {
		t.MemUsed, t.MemTotal = int64(m.Used), int64(m.Total)
	} else {
		errs = append(errs, optional("memory", r))
	}
	if c, r := d.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.SUCCESS {
		t.TempC = int(c)
	} else {
		errs = append(errs, optional("temperature", r))
	}
	if mw, r := d.GetPowerUsage(); r == nvml.SUCCESS {
		t.PowerW = float64(mw) / 1000
	} else {
		errs = append(errs, optional("power", r))
	}
	return t, errors.Join(errs...)
}

func optional(call string, r nvml.Return) error {
	if r == nvml.ERROR_NOT_SUPPORTED {
		return nil
	}
	return nvmlError(call, r)
}

// nvmlError turns an NVML status into an error, nil on success. It is the
// one place nvml.Return becomes error: it never leaves the worker.
func nvmlError(call string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("worker: nvml %s: %s", call, r.Error())
}
