package worker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/prom"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// scrape GETs url and returns every sample by its series (name and labels).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != prom.ContentType {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %q: %s", url, resp.Status, resp.Header.Get("Content-Type"), b)
	}
	got := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q: %v", line, err)
		}
		got[line[:i]] = v
	}
	return got
}

func TestMetrics(t *testing.T) {
	b := brokertest.Run(t)
	w := startWorker(t, b)
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()

	r := newRaw(t, b, "fabric.ops.cpu-0.metrics1")
	r.sendJSON(`{"v":1,"ops":[
		{"op":"upload","out":[1],"dtype":"f32","shape":[2,2],"values":[1,2,3,4]},
		{"op":"matmul","out":[2],"in":[1,1]},
		{"op":"read","in":[2],"tag":1}]}`)
	if res := r.result(); len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	r.sendJSON(`{"v":1,"ops":[{"op":"frobnicate","out":[3],"in":[2]},{"op":"read","in":[99],"tag":2}]}`)
	if res := r.result(); len(res.Errors) != 2 {
		t.Fatalf("errors %v, want unknown_op and unknown_id", res.Errors)
	}
	if err := r.send("application/json", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	r.result()

	// The undecodable frame is answered from inside its handling; the
	// device records it as applied just after.
	dev := `{device="cpu-0"}`
	var m map[string]float64
	checkFor(t, time.Minute, 10*time.Millisecond, func() error {
		if m = scrape(t, srv.URL); m["jetfabric_device_applied_sequence"+dev] != 3 {
			return fmt.Errorf("applied sequence %v, want 3", m["jetfabric_device_applied_sequence"+dev])
		}
		return nil
	})
	for series, want := range map[string]float64{
		"jetfabric_device_frames_total" + dev:                                        3,
		"jetfabric_device_ops_total" + dev:                                           5,
		`jetfabric_device_errors_total{device="cpu-0",code="unknown_op"}`:            1,
		`jetfabric_device_errors_total{device="cpu-0",code="unknown_id"}`:            1,
		`jetfabric_device_errors_total{device="cpu-0",code="malformed"}`:             1,
		`jetfabric_device_errors_total{device="cpu-0",code="shape"}`:                 0,
		`jetfabric_device_bytes_total{device="cpu-0",direction="in",path="inline"}`:  16,
		`jetfabric_device_bytes_total{device="cpu-0",direction="out",path="inline"}`: 16,
		`jetfabric_device_bytes_total{device="cpu-0",direction="out",path="object"}`: 0,
		"jetfabric_device_sessions" + dev:                                            1,
		"jetfabric_device_tensor_bytes" + dev:                                        32,
		"jetfabric_device_applied_sequence" + dev:                                    3,
		"jetfabric_device_lag_frames" + dev:                                          0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if v := m[`jetfabric_worker_info{worker="`+w.ID()+`",host="`+hostname(t)+`"}`]; v != 1 {
		t.Errorf("worker info %v", v)
	}
	if v := m["jetfabric_device_exec_seconds_total"+dev]; v <= 0 || v > 10 {
		t.Errorf("exec seconds %v", v)
	}
	if v := m["jetfabric_device_loop_age_seconds"+dev]; v < 0 || v > 5 {
		t.Errorf("loop age %v", v)
	}

	// Closing the session returns its tensor memory.
	// The close is answered from inside its frame; the frame's accounting
	// lands just after.
	r.sendJSON(`{"v":1,"ops":[{"op":"close","tag":3}]}`)
	r.result()
	checkFor(t, time.Minute, 10*time.Millisecond, func() error {
		m := scrape(t, srv.URL)
		if m["jetfabric_device_tensor_bytes"+dev] != 0 || m["jetfabric_device_sessions"+dev] != 0 {
			return fmt.Errorf("after close: tensor bytes %v, sessions %v", m["jetfabric_device_tensor_bytes"+dev], m["jetfabric_device_sessions"+dev])
		}
		return nil
	})
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestJobAndCheckpointMetrics: a job that runs, a job that fails and a
// checkpoint show in the job-queue and checkpoint series.
func TestJobAndCheckpointMetrics(t *testing.T) {
	b := brokertest.Run(t)
	w := startWorker(t, b, func(c *worker.Config) {
		c.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New()}}
	})
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	good := c.NewJob()
	y := good.Full([]int{2}, 1).Add(good.Full([]int{2}, 2))
	okID, err := c.Submit(ctx, "cpu", good, y)
	if err != nil {
		t.Fatal(err)
	}
	bad := c.NewJob()
	z := bad.Full([]int{2}, 1).Add(bad.Full([]int{3}, 1))
	badID, err := c.Submit(ctx, "cpu", bad, z)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, okID, badID); err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Full([]int{4}, 1).Float32s(ctx); err != nil {
		t.Fatal(err)
	}
	s.Checkpoint()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	// The results are stored before the counters move: wait for them.
	var m map[string]float64
	checkFor(t, time.Minute, 10*time.Millisecond, func() error {
		m = scrape(t, srv.URL)
		if m[`jetfabric_jobs_total{kind="cpu",outcome="ok"}`]+m[`jetfabric_jobs_total{kind="cpu",outcome="failed"}`] != 2 ||
			m[`jetfabric_device_checkpoints_total{device="cpu-0"}`] < 1 {
			return fmt.Errorf("jobs ok %v, failed %v; checkpoints %v", m[`jetfabric_jobs_total{kind="cpu",outcome="ok"}`],
				m[`jetfabric_jobs_total{kind="cpu",outcome="failed"}`], m[`jetfabric_device_checkpoints_total{device="cpu-0"}`])
		}
		return nil
	})
	for series, want := range map[string]float64{
		`jetfabric_jobs_total{kind="cpu",outcome="ok"}`:              1,
		`jetfabric_jobs_total{kind="cpu",outcome="failed"}`:          1,
		`jetfabric_jobs_total{kind="cpu",outcome="dropped"}`:         0,
		`jetfabric_jobs_running{kind="cpu"}`:                         0,
		`jetfabric_jobs_redelivered_total{kind="cpu"}`:               0,
		`jetfabric_jobs_pending{kind="cpu"}`:                         0,
		`jetfabric_device_checkpoint_failures_total{device="cpu-0"}`: 0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if v := m[`jetfabric_jobs_seconds_total{kind="cpu"}`]; v <= 0 {
		t.Errorf("job seconds %v", v)
	}
	if v := m[`jetfabric_device_checkpoint_last_seconds{device="cpu-0"}`]; v <= 0 {
		t.Errorf("last checkpoint took %v s", v)
	}
	if v := m[`jetfabric_device_checkpoint_timestamp_seconds{device="cpu-0"}`]; v < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Errorf("last checkpoint at %v", v)
	}
}
