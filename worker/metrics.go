package worker

import (
	"io"
	"maps"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/prom"
)

// errorCodes are the wire error codes counted per device, in exposition order.
var errorCodes = [...]string{
	codec.CodeMalformed, codec.CodeVersion, codec.CodeUnknownOp, codec.CodeArity, codec.CodeShape,
	codec.CodeDType, codec.CodeAttr, codec.CodeUnknownID, codec.CodeFailedID, codec.CodeDuplicate,
	codec.CodeTooLarge, codec.CodeLimit, codec.CodeInternal, codec.CodeUnavailabe,
	codec.CodeResourceExhausted, codec.CodeSessionFreed, codec.CodePermission, codec.CodeQuota,
}

// metrics are one device's counters. The device loop updates them once a
// frame (a frame carries up to thousands of ops), and once an error: a few
// uncontended atomic adds, nothing per op. The metrics endpoint reads them
// from another goroutine.
type metrics struct {
	frames    atomic.Uint64
	ops       atomic.Uint64
	execNanos atomic.Uint64
	errors    [len(errorCodes)]atomic.Uint64
	// bytes moved in (uploads) and out (reads), inline in frames and
	// results or through the object store.
	inInline, inObject, outInline, outObject atomic.Uint64
	// pending is the number of the device's frames in the stream after
	// the last one handled, as JetStream counted when it delivered it.
	pending atomic.Uint64
	// checkpoints committed, their total time and the size of the last;
	// the time the last one took and when it was committed (Unix ns);
	// checkpoints that failed.
	checkpoints, ckptNanos, ckptBytes atomic.Uint64
	// restorePending: bytes of restored tensors still to be read.
	restorePending                      atomic.Int64
	ckptLastNanos, ckptAt, ckptFailures atomic.Uint64
	// warmBytes: the memory of the tensors a standby read ahead (warm.go);
	// warmHits: the restored tensors a takeover found read ahead.
	warmBytes atomic.Int64
	warmHits  atomic.Uint64
	// snapNanos is the time the device loop spent taking checkpoint
	// snapshots: all that a checkpoint stops the loop for.
	snapNanos atomic.Uint64
	// fusedGroups run on a fusing backend and the ops they covered.
	fusedGroups, fusedOps atomic.Uint64
	// programRuns are replays run as a recorded program, programOps the
	// ops of the graphs they ran; programs the programs held, programBytes
	// their memory (see program.go).
	programRuns, programOps atomic.Uint64
	programs, programBytes  atomic.Int64
	// duplicates are numbered frames dropped because the session ran
	// that number already; renewals the device's consumers created again
	// (lost with a node, stalled, or a gap); stalled is 1 while frames
	// wait in the stream and none was delivered for feedStall.
	duplicates, renewals atomic.Uint64
	stalled              atomic.Bool
	// lastFrame is when the device last ran a frame (Unix ns).
	lastFrame atomic.Int64
	// flying is the number of collectives in flight (see collective.go).
	flying atomic.Int64
	// collNanos is the time collectives in flight took, start to end;
	// collWaitNanos the time the loop waited for them to end.
	collNanos, collWaitNanos atomic.Uint64
	// views counts the quota views the device took (quota.go).
	views atomic.Uint64
}

// fused records a fused group of n ops.
func (m *metrics) fused(n int) {
	m.fusedGroups.Add(1)
	m.fusedOps.Add(uint64(n))
}

// checkpoint records a committed checkpoint of size bytes that took took.
func (m *metrics) checkpoint(took time.Duration, size int64) {
	m.checkpoints.Add(1)
	m.ckptNanos.Add(uint64(took))
	m.ckptBytes.Store(uint64(size))
	m.ckptLastNanos.Store(uint64(took))
	m.ckptAt.Store(uint64(time.Now().UnixNano()))
}

// Job outcomes, the values of jetfabric_jobs_total's outcome label.
const (
	jobOK        = "ok"        // ran, result stored
	jobFailed    = "failed"    // ran, result stored with its op errors
	jobDropped   = "dropped"   // could never run (undecodable); terminated
	jobDuplicate = "duplicate" // another worker had stored its result already
	jobRetried   = "retried"   // the result could not be stored; handed back
)

var jobOutcomes = [...]string{jobOK, jobFailed, jobDropped, jobDuplicate, jobRetried}

// jobMetrics are one job loop's counters, updated once a job.
type jobMetrics struct {
	outcomes    [len(jobOutcomes)]atomic.Uint64
	nanos       atomic.Uint64
	running     atomic.Int64
	redelivered atomic.Uint64
	// pending is the consumer's count of jobs still queued after the
	// last one delivered here.
	pending atomic.Uint64
}

// started records a job taken on its attempt-th delivery.
func (m *jobMetrics) started(attempt uint64) {
	m.running.Add(1)
	if attempt > 1 {
		m.redelivered.Add(1)
	}
}

// finished records a job's outcome and the time it was held.
func (m *jobMetrics) finished(outcome string, took time.Duration) {
	m.running.Add(-1)
	m.nanos.Add(uint64(took))
	for i, o := range jobOutcomes {
		if o == outcome {
			m.outcomes[i].Add(1)
		}
	}
}

// ioCount is what one frame moved; the device loop adds it to metrics at
// the end of the frame.
type ioCount struct {
	inInline, inObject, outInline, outObject uint64
}

// add adds o's counts to c.
func (c *ioCount) add(o *ioCount) {
	c.inInline += o.inInline
	c.inObject += o.inObject
	c.outInline += o.outInline
	c.outObject += o.outObject
}

// frameDone records a frame of n ops that ran for took and moved c.
func (m *metrics) frameDone(n int, took time.Duration, c *ioCount) {
	m.frames.Add(1)
	m.ops.Add(uint64(n))
	m.execNanos.Add(uint64(took))
	m.moved(c)
}

// moved records the bytes that c counts.
func (m *metrics) moved(c *ioCount) {
	if *c != (ioCount{}) {
		m.inInline.Add(c.inInline)
		m.inObject.Add(c.inObject)
		m.outInline.Add(c.outInline)
		m.outObject.Add(c.outObject)
	}
}

// countError counts one error by its wire code (unknown codes count as
// internal).
func (m *metrics) countError(code string) {
	m.errors[codeIndex(code)].Add(1)
}

func codeIndex(code string) int {
	for i, c := range errorCodes {
		if c == code {
			return i
		}
	}
	return codeIndex(codec.CodeInternal)
}

// WriteMetrics writes the worker's metrics in the Prometheus text
// exposition format (version 0.0.4): per device, frames and ops executed,
// errors by code, execution time, bytes moved, sessions, tensor memory,
// the applied stream sequence and the frames still queued.
func (w *Worker) WriteMetrics(out io.Writer) error {
	now := time.Now()
	p := prom.NewWriter(out)
	p.Family("jetfabric_worker_info", "gauge", "The worker: its id and host; always 1.")
	p.Sample("jetfabric_worker_info", prom.Labels("worker", w.cfg.ID, "host", hostname()), 1)

	type series struct {
		name, typ, help string
		value           func(d *device) float64
	}
	for _, s := range []series{
		{"jetfabric_device_frames_total", "counter", "Frames executed (decodable or not).",
			func(d *device) float64 { return float64(d.m.frames.Load()) }},
		{"jetfabric_device_ops_total", "counter", "Ops executed, failed ones included.",
			func(d *device) float64 { return float64(d.m.ops.Load()) }},
		{"jetfabric_device_exec_seconds_total", "counter", "Time spent executing frames: kernels and the worker's own op handling.",
			func(d *device) float64 { return float64(d.m.execNanos.Load()) / 1e9 }},
		{"jetfabric_device_sessions", "gauge", "Live sessions.",
			func(d *device) float64 { return float64(d.sessionCount.Load()) }},
		{"jetfabric_device_tensor_bytes", "gauge", "Tensor memory held by the device's sessions (frees a checkpoint in flight defers included).",
			func(d *device) float64 { return float64(d.mem.held.Load()) }},
		{"jetfabric_device_memory_budget_bytes", "gauge", "The most tensor memory the device's sessions may hold together (0: no budget).",
			func(d *device) float64 { return float64(d.mem.budget) }},
		{"jetfabric_device_applied_sequence", "gauge", "FABRIC_OPS stream sequence of the last frame the device applied.",
			func(d *device) float64 { return float64(d.applied.Load()) }},
		{"jetfabric_device_lag_frames", "gauge", "The device's frames in the stream after the last one handled (JetStream's count at its delivery).",
			func(d *device) float64 { return float64(d.m.pending.Load()) }},
		{"jetfabric_device_checkpoints_total", "counter", "Checkpoints committed.",
			func(d *device) float64 { return float64(d.m.checkpoints.Load()) }},
		{"jetfabric_device_checkpoint_seconds_total", "counter", "Time spent writing and committing checkpoints.",
			func(d *device) float64 { return float64(d.m.ckptNanos.Load()) / 1e9 }},
		{"jetfabric_device_checkpoint_snapshot_seconds_total", "counter", "Time the device loop spent taking checkpoint snapshots (the checkpoints are written beside the loop).",
			func(d *device) float64 { return float64(d.m.snapNanos.Load()) / 1e9 }},
		{"jetfabric_device_checkpoint_bytes", "gauge", "Bytes the last checkpoint wrote (new tensors and its manifest).",
			func(d *device) float64 { return float64(d.m.ckptBytes.Load()) }},
		{"jetfabric_device_checkpoint_last_seconds", "gauge", "Time the last committed checkpoint took to write and commit.",
			func(d *device) float64 { return float64(d.m.ckptLastNanos.Load()) / 1e9 }},
		{"jetfabric_device_checkpoint_timestamp_seconds", "gauge", "Unix time of the last committed checkpoint (0: none yet by this worker).",
			func(d *device) float64 { return float64(d.m.ckptAt.Load()) / 1e9 }},
		{"jetfabric_device_checkpoint_failures_total", "counter", "Checkpoints that failed to be written or committed.",
			func(d *device) float64 { return float64(d.m.ckptFailures.Load()) }},
		{"jetfabric_device_restore_pending_bytes", "gauge", "Bytes of the last restore's large tensors still to be read from their objects (the device serves meanwhile).",
			func(d *device) float64 { return float64(d.m.restorePending.Load()) }},
		{"jetfabric_device_standby_warm_bytes", "gauge", "Memory of the tensors a standby read ahead from the device's last committed checkpoint, for a takeover.",
			func(d *device) float64 { return float64(d.m.warmBytes.Load()) }},
		{"jetfabric_device_restore_warm_tensors_total", "counter", "Restored tensors a takeover found read ahead by the standby, not read from their objects.",
			func(d *device) float64 { return float64(d.m.warmHits.Load()) }},
		{"jetfabric_device_fused_groups_total", "counter", "Runs of elementwise ops executed as one fused kernel.",
			func(d *device) float64 { return float64(d.m.fusedGroups.Load()) }},
		{"jetfabric_device_fused_ops_total", "counter", "Ops executed inside fused groups.",
			func(d *device) float64 { return float64(d.m.fusedOps.Load()) }},
		{"jetfabric_device_program_replays_total", "counter", "Replays of captured graphs run as a recorded device program (one launch of a CUDA graph) instead of op by op.",
			func(d *device) float64 { return float64(d.m.programRuns.Load()) }},
		{"jetfabric_device_program_ops_total", "counter", "Ops of the graphs replayed as recorded device programs.",
			func(d *device) float64 { return float64(d.m.programOps.Load()) }},
		{"jetfabric_device_programs", "gauge", "Recorded device programs held by the device's sessions.",
			func(d *device) float64 { return float64(d.m.programs.Load()) }},
		{"jetfabric_device_program_bytes", "gauge", "Device memory held by recorded programs (their inputs, outputs and intermediates).",
			func(d *device) float64 { return float64(d.m.programBytes.Load()) }},
		{"jetfabric_device_collectives_in_flight", "gauge", "Collective ops running beside the device loop, their outputs not yet written.",
			func(d *device) float64 { return float64(d.m.flying.Load()) }},
		{"jetfabric_device_collective_seconds_total", "counter", "Time collectives run beside the device loop took, from their start to their output written, summed over them.",
			func(d *device) float64 { return float64(d.m.collNanos.Load()) / 1e9 }},
		{"jetfabric_device_collective_wait_seconds_total", "counter", "Time the device loop stood waiting for collectives in flight to end (an op reading an output, a read, a sync, a checkpoint).",
			func(d *device) float64 { return float64(d.m.collWaitNanos.Load()) / 1e9 }},
		{"jetfabric_device_duplicate_frames_total", "counter", "Frames dropped because their session had run a frame of that number (a publish retried past the stream's duplicate window).",
			func(d *device) float64 { return float64(d.m.duplicates.Load()) }},
		{"jetfabric_device_consumer_renewals_total", "counter", "Times the device's consumer was created again (lost with a node, stalled, or a gap in delivery).",
			func(d *device) float64 { return float64(d.m.renewals.Load()) }},
		{"jetfabric_device_stalled", "gauge", "1 while the device's frames wait in the stream and none was delivered for a few seconds.",
			func(d *device) float64 {
				if d.m.stalled.Load() {
					return 1
				}
				return 0
			}},
		{"jetfabric_device_loop_age_seconds", "gauge", "Time since the device loop last came round (at most about 1 s when healthy).",
			func(d *device) float64 { return now.Sub(time.Unix(0, d.loopAt.Load())).Seconds() }},
	} {
		p.Family(s.name, s.typ, s.help)
		for _, d := range w.devices {
			p.Sample(s.name, prom.Labels("device", d.cfg.Name), s.value(d))
		}
	}

	p.Family("jetfabric_device_errors_total", "counter", "Op and frame errors by wire code (docs/PROTOCOL.md).")
	for _, d := range w.devices {
		for i, code := range errorCodes {
			p.Sample("jetfabric_device_errors_total", prom.Labels("device", d.cfg.Name, "code", code), float64(d.m.errors[i].Load()))
		}
	}
	p.Family("jetfabric_session_tensor_bytes", "gauge", "Tensor memory held by each session (as of the device's last housekeeping, about once a second).")
	for _, d := range w.devices {
		if l := d.sessBytes.Load(); l != nil {
			for _, s := range *l {
				p.Sample("jetfabric_session_tensor_bytes", prom.Labels("device", d.cfg.Name, "session", s.id), float64(s.bytes))
			}
		}
	}
	if w.cfg.Tenants {
		w.writeQuotaMetrics(p)
	}
	p.Family("jetfabric_device_bytes_total", "counter", "Tensor bytes moved: in by uploads, out by reads; inline in frames and results, or through the object store.")
	for _, d := range w.devices {
		for _, b := range []struct {
			dir, path string
			v         *atomic.Uint64
		}{{"in", "inline", &d.m.inInline}, {"in", "object", &d.m.inObject}, {"out", "inline", &d.m.outInline}, {"out", "object", &d.m.outObject}} {
			p.Sample("jetfabric_device_bytes_total", prom.Labels("device", d.cfg.Name, "direction", b.dir, "path", b.path), float64(b.v.Load()))
		}
	}
	w.writeJobMetrics(p)
	return p.Flush()
}

// writeQuotaMetrics writes each tenant's use of each device, and of the
// other devices as the device's quota view holds it.
func (w *Worker) writeQuotaMetrics(p *prom.Writer) {
	p.Family("jetfabric_device_quota_views_total", "counter", "Quota views the device took from its frames (the tenants' use of the other devices).")
	for _, d := range w.devices {
		p.Sample("jetfabric_device_quota_views_total", prom.Labels("device", d.cfg.Name), float64(d.m.views.Load()))
	}
	for _, f := range []struct {
		name, help string
		use        func(d *device) map[string]codec.TenantUse
	}{
		{"jetfabric_tenant_use", "A tenant's use of the device (as of its last housekeeping): live sessions, bytes held, frames a second.", (*device).used},
		{"jetfabric_tenant_use_elsewhere", "A tenant's use of the other devices, as the device's quota view holds it.",
			func(d *device) map[string]codec.TenantUse {
				if v := d.view.Load(); v != nil {
					return v.Tenants
				}
				return nil
			}},
	} {
		p.Family(f.name, "gauge", f.help)
		for _, d := range w.devices {
			use := f.use(d)
			for _, tn := range slices.Sorted(maps.Keys(use)) {
				u := use[tn]
				for _, q := range []struct {
					quota string
					v     float64
				}{{"sessions", float64(u.Sessions)}, {"bytes", float64(u.Bytes)}, {"fps", u.FPS}} {
					p.Sample(f.name, prom.Labels("device", d.cfg.Name, "tenant", tn, "quota", q.quota), q.v)
				}
			}
		}
	}
}

// writeJobMetrics writes the series of the job loops, per device kind.
func (w *Worker) writeJobMetrics(p *prom.Writer) {
	p.Family("jetfabric_jobs_total", "counter", "Jobs taken from the job queue, by outcome: ok, failed (result holds op errors), dropped (undecodable), duplicate (already done elsewhere), retried (result not stored; handed back).")
	for _, l := range w.jobs {
		for i, o := range jobOutcomes {
			p.Sample("jetfabric_jobs_total", prom.Labels("kind", l.cfg.Kind, "outcome", o), float64(l.m.outcomes[i].Load()))
		}
	}
	for _, s := range []struct {
		name, typ, help string
		value           func(m *jobMetrics) float64
	}{
		{"jetfabric_jobs_running", "gauge", "Jobs running now (a worker runs one at a time per kind).",
			func(m *jobMetrics) float64 { return float64(m.running.Load()) }},
		{"jetfabric_jobs_seconds_total", "counter", "Time spent on jobs: running them and storing their results.",
			func(m *jobMetrics) float64 { return float64(m.nanos.Load()) / 1e9 }},
		{"jetfabric_jobs_redelivered_total", "counter", "Jobs taken on a second or later delivery (their first worker died or was too slow).",
			func(m *jobMetrics) float64 { return float64(m.redelivered.Load()) }},
		{"jetfabric_jobs_pending", "gauge", "Jobs of the kind still queued behind the last one this worker took (JetStream's count at that delivery).",
			func(m *jobMetrics) float64 { return float64(m.pending.Load()) }},
	} {
		p.Family(s.name, s.typ, s.help)
		for _, l := range w.jobs {
			p.Sample(s.name, prom.Labels("kind", l.cfg.Kind), s.value(&l.m))
		}
	}
}

// MetricsHandler serves WriteMetrics over HTTP, for /metrics.
func (w *Worker) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", prom.ContentType)
		if err := w.WriteMetrics(rw); err != nil {
			w.logf("worker: metrics: %v", err)
		}
	})
}
