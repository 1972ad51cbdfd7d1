package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestDemoMNIST: the demo's training step on two devices, with made-up
// images (reading the real files takes seconds under the race detector).
func TestDemoMNIST(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(2), func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fake := func(n int) *mnist.Set {
		s := &mnist.Set{N: n, Images: make([]byte, n*mnist.Rows*mnist.Cols), Labels: make([]byte, n)}
		for i := range s.Images {
			s.Images[i] = byte(i * 7)
		}
		for i := range s.Labels {
			s.Labels[i] = byte(i % mnist.Classes)
		}
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := demoMNIST(ctx, c, []string{"cpu-0", "cpu-1"}, 2, fake(2*demoBatch), fake(100), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "MNIST: 2 steps of 64 examples, an MLP 784-64-64-10 data-parallel on cpu-0 and cpu-1: loss ") {
		t.Errorf("output %q", out.String())
	}
}
