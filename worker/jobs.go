package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// Jobs makes a worker take stateless jobs for one device kind from the
// jobs stream. Every worker taking a kind shares one durable consumer, so
// each job goes to one of them; a job not acknowledged within AckWait (its
// worker died) is delivered again, to any of them.
type Jobs struct {
	// Kind is the device kind, e.g. "cpu": jobs published on
	// fabric.jobs.<kind>.
	Kind string
	// Backend runs the jobs. It is used by the job loop alone, never by a
	// device loop.
	Backend kernels.Backend
	// AckWait is how long a job may go unacknowledged before it is
	// delivered again; a running job extends it as it goes (default 10s).
	AckWait time.Duration
}

// JobResultTTL is how long a job's result stays in the control bucket.
const JobResultTTL = time.Hour

func (j Jobs) validate() error {
	if err := subjects.ValidateToken(j.Kind); err != nil {
		return fmt.Errorf("%w: jobs kind: %v", ErrInvalidConfig, err)
	}
	if j.Backend == nil {
		return fmt.Errorf("%w: jobs of kind %s have no backend", ErrInvalidConfig, j.Kind)
	}
	if j.AckWait < 0 {
		return fmt.Errorf("%w: jobs ack wait %v", ErrInvalidConfig, j.AckWait)
	}
	return nil
}

// jobLoop takes jobs of one kind until the worker stops.
type jobLoop struct {
	w    *Worker
	cfg  Jobs
	dev  *device // runs the jobs' ops; never started, holds no lease
	iter jetstream.MessagesContext
	m    jobMetrics
}

func (w *Worker) startJobs(ctx context.Context, j Jobs) (*jobLoop, error) {
	if j.AckWait == 0 {
		j.AckWait = 10 * time.Second
	}
	cfg := jetstream.ConsumerConfig{
		Durable:       subjects.JobsConsumer(j.Kind),
		Description:   "jetfabric workers taking " + j.Kind + " jobs",
		FilterSubject: w.names.Jobs(j.Kind),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       j.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: 10000,
	}
	if w.cfg.Tenants {
		cfg.FilterSubject, cfg.FilterSubjects = "", []string{w.names.Jobs(j.Kind), w.names.TenantJobs(j.Kind)}
	}
	cons, err := w.js.CreateOrUpdateConsumer(ctx, w.names.JobsStream(), cfg)
	if err != nil {
		return nil, fmt.Errorf("worker: jobs consumer for %s: %w", j.Kind, err)
	}
	// One job at a time per worker: the others stay in the stream for
	// the other workers.
	it, err := cons.Messages(jetstream.PullMaxMessages(1))
	if err != nil {
		return nil, fmt.Errorf("worker: consume %s jobs: %w", j.Kind, err)
	}
	dev := newDevice(w, Device{Name: "jobs-" + j.Kind, Kind: j.Kind, Backend: j.Backend})
	dev.syncCollectives = true // a job's session is gone when it ends
	return &jobLoop{w: w, cfg: j, dev: dev, iter: it}, nil
}

func (l *jobLoop) run() {
	for {
		msg, err := l.iter.Next()
		switch {
		case err == nil:
			l.handle(msg)
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return
		default:
			l.w.logf("worker: %s jobs: next: %v", l.cfg.Kind, err)
			select {
			case <-l.w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (l *jobLoop) stop() { l.iter.Stop() }

// handle runs one job and acknowledges it once its result is stored.
func (l *jobLoop) handle(msg jetstream.Msg) {
	w := l.w
	var attempt, seq uint64
	if md, err := msg.Metadata(); err == nil {
		attempt, seq = md.NumDelivered, md.Sequence.Stream
		l.m.pending.Store(md.NumPending)
	}
	start := time.Now()
	l.m.started(attempt)
	outcome := jobDropped
	defer func() { l.m.finished(outcome, time.Since(start)) }()
	enc, err := codec.EncodingOf(msg.Headers().Get(subjects.HeaderContentType))
	var job codec.Job
	if err == nil {
		err = codec.Unmarshal(enc, msg.Data(), &job)
	}
	if err == nil && job.V != codec.Version {
		err = fmt.Errorf("%w: job version %d", codec.ErrVersion, job.V)
	}
	if err == nil {
		err = subjects.ValidateToken(job.ID)
	}
	tenant, terr := w.names.JobTenant(msg.Subject())
	if err == nil {
		err = terr
	}
	if err != nil {
		// It can never succeed: drop it for good, but say why if we can.
		w.logf("worker: %s jobs: dropping job %q at sequence %d: %v", l.cfg.Kind, job.ID, seq, err)
		if subjects.ValidateToken(job.ID) == nil {
			l.store(tenant, job.ID, &codec.JobResult{V: codec.Version, ID: job.ID, Worker: w.cfg.ID, Attempt: attempt,
				Errors: []codec.Error{{Seq: seq, Code: codec.CodeMalformed, Message: err.Error()}}})
		}
		_ = msg.Term()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := w.ctrl.Get(ctx, subjects.TenantJobKey(tenant, job.ID)); err == nil {
		_ = msg.Ack() // finished by another worker already
		outcome = jobDuplicate
		return
	}
	// Keep the job ours while it runs.
	done := make(chan struct{})
	var keep sync.WaitGroup
	keep.Go(func() {
		t := time.NewTicker(l.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	})
	res := l.run1(ctx, tenant, &job, seq, enc, attempt)
	close(done)
	keep.Wait()
	if err := l.store(tenant, job.ID, res); err != nil {
		w.logf("worker: %s jobs: %v", l.cfg.Kind, err)
		_ = msg.Nak()
		outcome = jobRetried
		return
	}
	outcome = jobOK
	if len(res.Errors) > 0 {
		outcome = jobFailed
	}
	if err := msg.DoubleAck(ctx); err != nil {
		w.logf("worker: %s jobs: ack job %s: %v", l.cfg.Kind, job.ID, err)
	}
}

// run1 executes the job's ops in a fresh session and stores its outputs.
func (l *jobLoop) run1(ctx context.Context, tenant string, job *codec.Job, seq uint64, enc codec.Encoding, attempt uint64) *codec.JobResult {
	s := newSession("job-" + job.ID)
	defer s.freeAll(l.dev)
	x := exec{d: l.dev, s: s, seq: seq, enc: enc}
	if tenant != "" {
		// A tenant's job runs under its quotas, its outputs go to its bucket.
		var err error
		if s.st, _, err = l.w.tenant(tenant); err != nil {
			return &codec.JobResult{V: codec.Version, ID: job.ID, Worker: l.w.cfg.ID, Attempt: attempt, Done: time.Now().UTC(),
				Errors: []codec.Error{{Seq: seq, Code: codeOf(err), Message: err.Error()}}}
		}
		s.tenant, s.use = tenant, l.dev.useOf(tenant)
		// Its bytes count with the tenant's on every device, as their
		// registry entries report them (a job is not replayed: it runs
		// again from the start).
		l.dev.view.Store(&codec.QuotaView{Tenants: l.w.viewOf("", time.Now())})
	}
	for i := range job.Ops {
		if x.op(i, &job.Ops[i]) {
			break
		}
	}
	res := &codec.JobResult{V: codec.Version, ID: job.ID, Worker: l.w.cfg.ID, Attempt: attempt}
	for i, id := range job.Outputs {
		if len(s.pending) > 0 {
			break
		}
		t, err := x.input(id)
		if err != nil {
			var fe *failedInput
			if !errors.As(err, &fe) {
				s.pending = append(s.pending, codec.Error{Seq: seq, Index: -1, Op: "output", Code: codeOf(err), Message: fmt.Sprintf("output %d: %v", i, err)})
			}
			break
		}
		data := make([]byte, t.Bytes())
		if err := l.dev.cfg.Backend.Download(data, t.Buf); err != nil {
			s.pending = append(s.pending, codec.Error{Seq: seq, Index: -1, Op: "output", Code: codec.CodeInternal, Message: err.Error()})
			break
		}
		name := subjects.JobOutputObject(job.ID, i)
		store, err := x.objects()
		if err != nil {
			s.pending = append(s.pending, codec.Error{Seq: seq, Index: -1, Op: "output", Code: codeOf(err), Message: err.Error()})
			break
		}
		info, err := store.Put(ctx, name, data, map[string]string{"dtype": t.DType.String(), "shape": shapeString(t.Shape), "job": job.ID})
		if err != nil {
			s.pending = append(s.pending, codec.Error{Seq: seq, Index: -1, Op: "output", Code: codec.CodeUnavailabe, Message: err.Error()})
			break
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		res.Outputs = append(res.Outputs, codec.Tensor{DType: t.DType.String(), Shape: shape, Object: name, SHA256: info.SHA256})
	}
	if len(s.pending) > 0 {
		res.Outputs = nil
		res.Errors = s.takeErrors(nil)
	}
	res.Done = time.Now().UTC()
	return res
}

// store writes the job's result once: if another worker already stored
// one (the job was delivered twice), that one stands.
func (l *jobLoop) store(tenant, id string, res *codec.JobResult) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = l.w.ctrl.Create(ctx, subjects.TenantJobKey(tenant, id), b, jetstream.KeyTTL(JobResultTTL))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("store result of job %s: %w", id, err)
	}
	return nil
}
