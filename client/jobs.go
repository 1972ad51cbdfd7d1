package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// NewJob returns a session that records ops instead of sending them, for a
// job: a stateless op program that any worker taking jobs of a device kind
// can run. Build it with the usual tensor methods (uploads over the inline
// limit go to the object store, so the job names them by reference), then
// Submit it. A job cannot read; name its outputs when submitting.
func (c *Client) NewJob() *Session {
	return &Session{c: c, record: true, id: "job", waiters: map[uint64]chan *codec.Result{}}
}

// Submit publishes the job recorded in job for workers of device kind and
// returns its id. Outputs are the tensors whose values the result keeps.
func (c *Client) Submit(ctx context.Context, kind string, job *Session, outputs ...*Tensor) (string, error) {
	if !job.record {
		return "", fmt.Errorf("%w: Submit takes a session from NewJob", ErrInvalidArgument)
	}
	if err := subjects.ValidateToken(kind); err != nil {
		return "", fmt.Errorf("client: job kind: %w", err)
	}

	job.mu.Lock()
	errs := job.errs
	ops := append([]codec.Op(nil), job.queued...)
	job.mu.Unlock()
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	j := codec.Job{V: codec.Version, ID: hex.EncodeToString(b[:]), Ops: ops}
	for i, t := range outputs {
		if t == nil || t.s != job || t.id == 0 {
			return "", fmt.Errorf("%w: output %d is not a tensor of this job", ErrInvalidArgument, i)
		}
		j.Outputs = append(j.Outputs, t.id)
	}
	data, err := codec.Marshal(codec.CBOR, &j)
	if err != nil {
		return "", fmt.Errorf("client: encode job: %w", err)
	}
	if _, err := c.js.Publish(ctx, c.names.Jobs(kind), data); err != nil {
		return "", fmt.Errorf("%w: job of %d bytes: %v", ErrPublish, len(data), err)
	}
	return j.ID, nil
}

// JobResult is a finished job.
type JobResult struct {
	codec.JobResult
	c *Client
}

// Err is the job's failure, if it failed: its op errors joined.
func (r *JobResult) Err() error {
	errs := make([]error, len(r.Errors))
	for i := range r.Errors {
		errs[i] = &r.Errors[i]
	}
	return errors.Join(errs...)
}

// Output reads output i of the job.
func (r *JobResult) Output(ctx context.Context, i int) (*Data, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	if i < 0 || i >= len(r.Outputs) {
		return nil, fmt.Errorf("%w: job %s has %d outputs, not %d", ErrInvalidArgument, r.ID, len(r.Outputs), i)
	}
	o := r.Outputs[i]
	store, err := r.c.objects()
	if err != nil {
		return nil, err
	}
	b, info, err := store.Get(ctx, o.Object)
	if err != nil {
		return nil, fmt.Errorf("client: job %s output %d: %w", r.ID, i, err)
	}
	if o.SHA256 != "" && info.SHA256 != o.SHA256 {
		return nil, fmt.Errorf("client: job %s output %d has digest %s, the worker wrote %s", r.ID, i, info.SHA256, o.SHA256)
	}
	return &Data{DType: o.DType, Shape: o.Shape, Bytes: b}, nil
}

// Wait waits for the results of the jobs ids, in that order, or for ctx.
func (c *Client) Wait(ctx context.Context, ids ...string) ([]*JobResult, error) {
	if c.names.Tenant() != "" {
		for _, id := range ids {
			if err := subjects.ValidateToken(id); err != nil {
				return nil, fmt.Errorf("client: job id: %w", err)
			}
		}
		return c.waitTenantJobs(ctx, ids)
	}
	kv, err := c.js.KeyValue(ctx, c.names.CtrlBucket())
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	want := make(map[string]int, len(ids))
	for i, id := range ids {
		if err := subjects.ValidateToken(id); err != nil {
			return nil, fmt.Errorf("client: job id: %w", err)
		}
		want[subjects.JobKey(id)] = i
	}
	out := make([]*JobResult, len(ids))
	left := len(ids)
	var mu sync.Mutex
	// One watch over every job result: results already stored arrive
	// first, then new ones as workers store them.
	w, err := kv.Watch(ctx, "job.*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("client: watch job results: %w", err)
	}
	defer w.Stop()
	for left > 0 {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			i, ok := want[e.Key()]
			if !ok || out[i] != nil {
				continue
			}
			var r codec.JobResult
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				return nil, fmt.Errorf("client: result of job %s: %w", ids[i], err)
			}
			mu.Lock()
			out[i] = &JobResult{JobResult: r, c: c}
			left--
			mu.Unlock()
		case <-ctx.Done():
			return out, fmt.Errorf("client: %d of %d jobs unfinished: %w", left, len(ids), ctx.Err())
		}
	}
	return out, nil
}
