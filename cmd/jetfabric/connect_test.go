package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/poll"
)

// TestWorkerBeforeBroker: a worker started before its broker waits for it,
// retrying with backoff, and serves once it is up; it outlives the
// broker's restart.
func TestWorkerBeforeBroker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	w, out := spawn(t, "worker", "--url", url, "--cpus", "1", "--gpus", "none")
	says(t, out, "no broker at")
	dir := t.TempDir()
	at := func(c *broker.Config) { c.Port, c.StoreDir = port, dir }
	b := brokertest.Run(t, at)
	waitDevice(t, url, "cpu-0")
	if !strings.Contains(out.String(), "retrying with backoff") {
		t.Fatalf("the worker did not say it waits:\n%s", out.String())
	}

	// The broker goes away and comes back on its store: the worker
	// reconnects and serves again.
	if err := b.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	says(t, out, "lost the broker")
	brokertest.Run(t, at)
	says(t, out, "jetfabric: connected to")
	c, err := client.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Full([]int{2}, 3).Sum().Float32s(ctx); err != nil || len(v) != 1 || v[0] != 6 {
		t.Fatalf("read after the broker's restart: %v %v\n%s", v, err, out.String())
	}
	_ = w.Process.Signal(syscall.SIGTERM)
	if err := w.Wait(); err != nil {
		t.Fatalf("worker exit: %v\n%s", err, out.String())
	}
}

// says waits until the process's output has said what.
func says(t *testing.T, out *output, what string) {
	t.Helper()
	poll.Until(t, time.Minute, 20*time.Millisecond, func() error {
		if !strings.Contains(out.String(), what) {
			return fmt.Errorf("the worker has not said %q:\n%s", what, out.String())
		}
		return nil
	})
}

// TestSecondSignalEndsAWorker: a worker whose broker is gone waits on its clean
// stop (the last checkpoints cannot be written); a second signal ends it
// at once, by the signal.
func TestSecondSignalEndsAWorker(t *testing.T) {
	b := brokertest.Run(t)
	w, out := spawn(t, "worker", "--url", b.ClientURL(), "--cpus", "1", "--gpus", "none")
	waitDevice(t, b.ClientURL(), "cpu-0")
	if err := b.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	says(t, out, "lost the broker")
	_ = w.Process.Signal(syscall.SIGTERM)
	says(t, out, "a second signal exits at once")
	_ = w.Process.Signal(syscall.SIGTERM)
	err := w.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("worker exit: %v, want the second SIGTERM to end it\n%s", err, out.String())
	}
}
