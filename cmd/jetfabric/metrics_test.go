package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestUpMetrics runs `jetfabric up --metrics` and scrapes the broker's and
// the worker's series from one endpoint.
func TestUpMetrics(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"up", "--store", t.TempDir(), "--listen", "127.0.0.1:-1", "--http", "", "--metrics", addr}, &stdout, &stderr)
	}()
	var body string
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
		}
		select {
		case code := <-done:
			t.Fatalf("up exited %d: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metrics on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{
		`jetfabric_stream_last_sequence{stream="FABRIC_OPS"} `,
		`jetfabric_jetstream_streams{server="jetfabric"} `,
		`jetfabric_device_frames_total{device="cpu-0"} 0`,
		`jetfabric_device_errors_total{device="cpu-0",code="shape"} 0`,
		"# TYPE jetfabric_device_ops_total counter",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("up exited %d: %s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("up did not stop")
	}
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("metrics still served after up stopped")
	}
}

func TestMetricsFlagBadAddress(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"up", "--store", t.TempDir(), "--listen", "127.0.0.1:-1", "--http", "", "--metrics", "127.0.0.1:bad"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "-metrics 127.0.0.1:bad") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}
