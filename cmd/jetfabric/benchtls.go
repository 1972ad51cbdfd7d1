package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/certs"
)

// tlsReport is what `jetfabric bench --tls --json` prints: the medians of
// the runs on each fabric, and TLS's figure over plain's for each.
type tlsReport struct {
	Layout  string             `json:"layout"`
	Machine string             `json:"machine"`
	Runs    int                `json:"runs"`
	Plain   benchReport        `json:"plain"`
	TLS     benchReport        `json:"tls"`
	Ratios  map[string]float64 `json:"tls_over_plain"`
	// Every run, in the order measured.
	PlainRuns []benchReport `json:"plain_runs"`
	TLSRuns   []benchReport `json:"tls_runs"`
}

// tlsMetric is one figure of a benchReport the TLS comparison reports.
type tlsMetric struct {
	key, label string
	get        func(*benchReport) *float64
	lower      bool // lower is better (a latency)
}

var tlsMetrics = []tlsMetric{
	{"roundtrip_p50_us", "tiny op + read round trip p50 (us)", func(r *benchReport) *float64 { return &r.RoundTripP50us }, true},
	{"roundtrip_p99_us", "tiny op + read round trip p99 (us)", func(r *benchReport) *float64 { return &r.RoundTripP99us }, true},
	{"raw_request_p50_us", "raw NATS request/reply 64 B p50 (us)", func(r *benchReport) *float64 { return &r.RawRequestP50us }, true},
	{"js_floor_p50_us", "JetStream floor 64 B p50 (us)", func(r *benchReport) *float64 { return &r.FloorP50us }, true},
	{"pipelined_ops_per_s", "pipelined ops, one session (ops/s)", func(r *benchReport) *float64 { return &r.PipelinedOpsPerS }, false},
	{"replay_ops_per_s", "pipelined ops in replays (ops/s)", func(r *benchReport) *float64 { return &r.ReplayOpsPerS }, false},
	{"raw_js_publish_frames_per_s", "raw JetStream async publish (frames/s)", func(r *benchReport) *float64 { return &r.RawPublishFramesS }, false},
	{"upload_mb_per_s", "upload (MB/s)", func(r *benchReport) *float64 { return &r.UploadMBs }, false},
	{"read_mb_per_s", "read-back (MB/s)", func(r *benchReport) *float64 { return &r.ReadMBs }, false},
}

// benchTLS measures a fabric without TLS and one with TLS on every
// connection, both running, alternating runs so that drift of the machine
// hits both, and reports the medians side by side.
func benchTLS(ctx context.Context, layout string, ckpt time.Duration, bw benchWorker, device string, rounds, ops, upload, runs int,
	asJSON bool, stdout io.Writer, progress func(string, ...any)) error {
	dir, err := os.MkdirTemp("", "jetfabric-bench-tls-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	files, err := certs.Write(dir, certs.Options{Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		return err
	}
	plainURL, stopPlain, err := benchFabric(ctx, layout, ckpt, bw, progress)
	if err != nil {
		return err
	}
	defer stopPlain()
	bw.tls = &files
	tlsURL, stopTLS, err := benchFabric(ctx, layout, ckpt, bw, progress)
	if err != nil {
		return err
	}
	defer stopTLS()
	var plain, secure []benchReport
	for i := range runs {
		for _, side := range []struct {
			name string
			url  string
			opts []client.Option
			out  *[]benchReport
		}{{"plain", plainURL, nil, &plain}, {"TLS", tlsURL, []client.Option{client.WithTLS(files.CA, "", "")}, &secure}} {
			progress("run %d of %d, %s (%s)", i+1, runs, side.name, side.url)
			var rep benchReport
			if err := benchRun(ctx, side.url, device, rounds, ops, upload, nil, &rep, progress, side.opts); err != nil {
				return fmt.Errorf("%s: %w", side.name, err)
			}
			*side.out = append(*side.out, rep)
		}
	}
	r := tlsReport{Runs: runs, Plain: medianReport(plain), TLS: medianReport(secure), Ratios: map[string]float64{}, PlainRuns: plain, TLSRuns: secure,
		Machine: fmt.Sprintf("%s/%s, %d CPUs, GOMAXPROCS %d", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0))}
	r.Layout = "all in one process (broker, worker, client; TCP loopback)"
	if layout == "procs" {
		r.Layout = "separate processes (broker, worker, raw responder, client; TCP loopback)"
	}
	for _, m := range tlsMetrics {
		if p := *m.get(&r.Plain); p > 0 {
			r.Ratios[m.key] = *m.get(&r.TLS) / p
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(stdout, "layout: %s; %s\nmedians of %d runs of each fabric, alternating; TLS on every connection of the second\n", r.Layout, r.Machine, runs)
	fmt.Fprintf(stdout, "%-40s %12s %12s %10s\n", "", "plain", "TLS", "TLS/plain")
	for _, m := range tlsMetrics {
		p, t := *m.get(&r.Plain), *m.get(&r.TLS)
		if p == 0 && t == 0 {
			continue
		}
		cost := "slower"
		switch {
		case t == p:
			cost = "same"
		case m.lower == (t < p):
			cost = "faster"
		}
		fmt.Fprintf(stdout, "%-40s %12.1f %12.1f %9.3fx  (%s)\n", m.label, p, t, r.Ratios[m.key], cost)
	}
	return nil
}

// medianReport takes the median of each compared figure over reps.
func medianReport(reps []benchReport) benchReport {
	out := reps[0]
	for _, m := range tlsMetrics {
		var v []float64
		for i := range reps {
			v = append(v, *m.get(&reps[i]))
		}
		*m.get(&out) = median(v)
	}
	return out
}
