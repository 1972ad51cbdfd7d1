package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
)

// TestWorkerClaim starts two identical worker processes with -claim cpu:
// each takes its own free slot.
func TestWorkerClaim(t *testing.T) {
	b := brokertest.Run(t)
	_, out1 := spawn(t, "worker", "--url", b.ClientURL(), "--claim", "cpu")
	waitDevice(t, b.ClientURL(), "cpu-0")
	_, out2 := spawn(t, "worker", "--url", b.ClientURL(), "--claim", "cpu", "--cpus", "2")
	waitDevice(t, b.ClientURL(), "cpu-2")

	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	devs, err := c.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	workers := map[string]string{}
	for _, d := range devs {
		if !client.Live(d, time.Now()) {
			t.Errorf("%s is not live: %+v", d.Name, d)
		}
		workers[d.Name] = d.Worker
	}
	if len(devs) != 3 || workers["cpu-0"] == workers["cpu-1"] || workers["cpu-1"] != workers["cpu-2"] {
		t.Fatalf("devices %+v; want cpu-0 on the first worker, cpu-1 and cpu-2 on the second\n%s\n%s", devs, out1, out2)
	}
}

func TestWorkerClaimRejects(t *testing.T) {
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"worker", "--claim", "gpu"}, `-claim "gpu": want one of cpu`},
		{[]string{"worker", "--claim", "cpu-0"}, "want one of cpu"},
		{[]string{"worker", "--claim", "cpu", "--devices", "cpu-0"}, "exclude each other"},
		{[]string{"worker", "--claim", "cpu", "--cpus", "0"}, "-cpus 0"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), c.mention) {
			t.Errorf("%v: exit %d, want 1 mentioning %q:\n%s%s", c.args, code, c.mention, stdout.String(), stderr.String())
		}
	}
}
