//go:build cgo && linux

package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

// fakeNVML is go-nvml's mock of an 8-GPU machine, with the telemetry calls
// the mock leaves out answered: GPU i is 10*i % busy, i GiB in use, 40+i
// degrees and 100+i watts.
func fakeNVML() *dgxa100.Server {
	s := dgxa100.New()
	for i, h := range s.Devices {
		d := h.(*dgxa100.Device)
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i), Memory: uint32(i)}, nvml.SUCCESS
		}
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: d.MemoryInfo.Total, Used: uint64(i) << 30}, nvml.SUCCESS
		}
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return uint32(40 + i), nvml.SUCCESS }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return uint32(100+i) * 1000, nvml.SUCCESS }
	}
	return s
}

func TestNVMLDiscovery(t *testing.T) {
	lib := fakeNVML()
	n, err := worker.OpenNVMLLib(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	gpus := n.GPUs()
	if len(gpus) != 8 {
		t.Fatalf("found %d GPUs, want 8", len(gpus))
	}
	for i, g := range gpus {
		d := lib.Devices[i].(*dgxa100.Device)
		if g.Index != i || g.Name != d.Name || g.UUID != d.UUID || g.Memory != int64(d.MemoryInfo.Total) || g.Major != 8 || g.Minor != 0 {
			t.Errorf("gpu %d: %+v", i, g)
		}
		s, err := n.Telemetry(i)
		if err != nil {
			t.Fatal(err)
		}
		if s.Util != 10*i || s.MemUsed != int64(i)<<30 || s.MemTotal != g.Memory || s.TempC != 40+i || s.PowerW != float64(100+i) {
			t.Errorf("gpu %d telemetry: %+v", i, s)
		}
	}
	if _, err := n.Telemetry(8); err == nil {
		t.Error("telemetry of gpu 8 of 8 did not fail")
	}
}

// A failing Init (no driver) is ErrNoGPU.
func TestNVMLNoDriver(t *testing.T) {
	lib := fakeNVML()
	lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := worker.OpenNVMLLib(lib); !errorsIs(err, worker.ErrNoGPU) {
		t.Fatalf("open: %v, want ErrNoGPU", err)
	}
}

// Eight fake GPUs (computed on the CPU backend) register as gpu-0..gpu-7
// with their name, UUID, memory and compute capability, and publish
// telemetry on fabric.telemetry.gpu-N.
func TestNVMLRegistryAndTelemetry(t *testing.T) {
	lib := fakeNVML()
	n, err := worker.OpenNVMLLib(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	names, _ := subjects.New(subjects.DefaultPrefix)
	got := make(chan codec.Telemetry, 64)
	sub, err := nc.Subscribe(names.TelemetryAll(), func(m *nats.Msg) {
		var s codec.Telemetry
		if err := json.Unmarshal(m.Data, &s); err != nil {
			t.Errorf("telemetry on %s: %v", m.Subject, err)
			return
		}
		if m.Subject != names.Telemetry(s.Device) {
			t.Errorf("telemetry of %s on %s", s.Device, m.Subject)
		}
		select {
		case got <- s:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	startWorker(t, b, func(c *worker.Config) {
		c.TelemetryInterval = 50 * time.Millisecond
		c.Devices = nil
		for i := range n.GPUs() {
			c.Devices = append(c.Devices, n.Device(i, cpu.New()))
		}
	})
	seen := map[string]bool{}
	deadline := time.After(time.Minute)
	for len(seen) < 8 {
		select {
		case s := <-got:
			var i int
			if _, err := fmt.Sscanf(s.Device, "gpu-%d", &i); err != nil {
				t.Fatalf("telemetry from %q", s.Device)
			}
			if s.TempC != 40+i || s.PowerW != float64(100+i) || s.Util != 10*i || s.Time.IsZero() {
				t.Errorf("telemetry of %s: %+v", s.Device, s)
			}
			seen[s.Device] = true
		case <-deadline:
			t.Fatalf("telemetry from %d devices in 10s: %v", len(seen), seen)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), names.CtrlBucket())
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range n.GPUs() {
		e, err := kv.Get(context.Background(), subjects.DeviceKey(fmt.Sprintf("gpu-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		var d codec.Device
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			t.Fatal(err)
		}
		if d.Kind != "gpu" || d.Memory != g.Memory || d.Props["name"] != g.Name || d.Props["uuid"] != g.UUID || d.Props["compute_capability"] != "8.0" {
			t.Errorf("registry entry of gpu-%d: %+v", i, d)
		}
	}
}
