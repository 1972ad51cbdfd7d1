package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

func TestTelemetryTable(t *testing.T) {
	b := brokertest.Run(t)
	nc, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	names := subjects.Default()
	tw, err := watchTelemetry(nc, names)
	if err != nil {
		t.Fatal(err)
	}
	defer tw.stop()
	s := codec.Telemetry{Device: "gpu-0", Time: time.Now(), Util: 87, MemUtil: 40, MemUsed: 3 << 30, MemTotal: 80 << 30, TempC: 45, PowerW: 312}
	data, _ := json.Marshal(s)
	if err := nc.Publish(names.Telemetry("gpu-0"), data); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tw.wait(ctx, []string{"gpu-0"})
	devs := []client.Device{{Name: "cpu-0", Kind: "cpu"}, {Name: "gpu-0", Kind: "gpu", Props: map[string]string{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}}}
	var out bytes.Buffer
	tw.print(&out, devs, time.Now())
	for _, want := range []string{"gpu-0", "H100 80GB HBM3", "9.0", "87%", "3.0/80.0", "45 C", "312 W"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "cpu-0") {
		t.Errorf("table lists cpu-0:\n%s", out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if len(l) > 80 {
			t.Errorf("%d columns: %q", len(l), l)
		}
	}
}
