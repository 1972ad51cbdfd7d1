// Package workertest starts real jetfabric workers for tests: each on its
// own NATS connection to a broker (see broker/brokertest), serving CPU
// devices, stopped when the test ends.
package workertest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// CPUs returns n CPU devices named cpu-0 ... cpu-(n-1).
func CPUs(n int) []worker.Device {
	devs := make([]worker.Device, n)
	for i := range devs {
		devs[i] = worker.Device{Name: fmt.Sprintf("cpu-%d", i), Kind: "cpu", Backend: cpu.New()}
	}
	return devs
}

// Run starts a worker serving devices on b, with the default configuration
// changed by edit, and returns once its devices serve. The worker logs to
// t. It connects as the broker's own services do (Broker.Connect): over
// TCP, or in process where the broker requires TLS.
func Run(t testing.TB, b *broker.Broker, devices []worker.Device, edit ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	nc, err := b.Connect(nats.Name("jetfabric-worker workertest"))
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	tenants := func(c *worker.Config) { c.Tenants, c.TenantIssuer = b.AccountKey() != "", b.AccountKey() }
	return runOn(t, nc, devices, append([]func(*worker.Config){tenants}, edit...)...)
}

// RunAt is Run on a broker at urls (comma-separated: the nodes of a
// cluster), reconnecting for ever to whichever node answers.
func RunAt(t testing.TB, urls string, devices []worker.Device, edit ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	return runOn(t, nc, devices, edit...)
}

// runOn starts the worker on nc, which it closes when the test ends.
func runOn(t testing.TB, nc *nats.Conn, devices []worker.Device, edit ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	cfg := worker.DefaultConfig()
	cfg.Devices = devices
	cfg.Logf = t.Logf
	for _, e := range edit {
		e(&cfg)
	}
	w, err := worker.New(nc, cfg)
	if err != nil {
		nc.Close()
		t.Fatalf("workertest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		nc.Close()
		t.Fatalf("workertest: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("workertest: stop: %v", err)
		}
		nc.Close()
	})
	return w
}

// TensorBytes is the tensor memory device holds on w, from w's metrics
// (jetfabric_device_tensor_bytes).
func TensorBytes(t testing.TB, w *worker.Worker, device string) float64 {
	t.Helper()
	return Metric(t, w, "jetfabric_device_tensor_bytes", device)
}

// Metric is the sample of the device metric name for device on w.
func Metric(t testing.TB, w *worker.Worker, name, device string) float64 {
	t.Helper()
	series := name + `{device="` + device + `"}`
	v, ok := Sample(t, w, series)
	if !ok {
		t.Fatalf("no %s in the metrics", series)
	}
	return v
}

// Sample is the value of series (a metric's name and its labels, as the
// exposition writes them) on w, and whether w has it.
func Sample(t testing.TB, w *worker.Worker, series string) (float64, bool) {
	t.Helper()
	var b strings.Builder
	if err := w.WriteMetrics(&b); err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}
