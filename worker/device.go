package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// device is one device's loop: the only goroutine that touches its sessions
// and its backend.
type device struct {
	w       *Worker
	cfg     Device
	started time.Time

	sessions map[string]*session
	// sessionCount and applied are read by the heartbeat.
	sessionCount atomic.Int64
	applied      atomic.Uint64
	// loopAt is when the loop last came round (unix ns), for health.
	loopAt atomic.Int64
	m      metrics

	mu   sync.Mutex
	iter jetstream.MessagesContext
}

func newDevice(w *Worker, cfg Device) *device {
	return &device{w: w, cfg: cfg, sessions: map[string]*session{}, started: time.Now().UTC()}
}

// start registers the device and opens its ordered consumer. It resumes
// after the last sequence a previous owner recorded as applied.
func (d *device) start(ctx context.Context) error {
	w := d.w
	var from uint64
	if e, err := w.ctrl.Get(ctx, subjects.DeviceKey(d.cfg.Name)); err == nil {
		var prev codec.Device
		if json.Unmarshal(e.Value(), &prev) == nil {
			if prev.State == "serving" && time.Since(prev.Beat) < 3*w.cfg.Heartbeat && prev.Worker != w.cfg.ID {
				return fmt.Errorf("worker: device %s is served by %s (last heartbeat %v ago)", d.cfg.Name, prev.Worker, time.Since(prev.Beat).Round(time.Millisecond))
			}
			from = prev.Applied
		}
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("worker: registry %s: %w", d.cfg.Name, err)
	}
	d.applied.Store(from)
	cc := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{w.names.OpsDevice(d.cfg.Name)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if from > 0 {
		cc.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cc.OptStartSeq = from + 1
	}
	cons, err := w.js.OrderedConsumer(ctx, w.names.OpsStream(), cc)
	if err != nil {
		return fmt.Errorf("worker: consumer for %s: %w", d.cfg.Name, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return fmt.Errorf("worker: consume %s: %w", d.cfg.Name, err)
	}
	d.mu.Lock()
	d.iter = it
	d.mu.Unlock()
	return w.register(ctx, d, "serving")
}

// run consumes frames in stream order until halt.
func (d *device) run() {
	d.mu.Lock()
	it := d.iter
	d.mu.Unlock()
	idleCheck := time.Now()
	d.loopAt.Store(idleCheck.UnixNano())
	for {
		msg, err := it.Next(jetstream.NextMaxWait(time.Second))
		switch {
		case err == nil:
			d.handle(msg)
		case errors.Is(err, nats.ErrTimeout):
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return
		default:
			d.w.logf("worker: %s: next frame: %v", d.cfg.Name, err)
			select {
			case <-d.w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		if now := time.Now(); now.Sub(idleCheck) > time.Second {
			d.evictIdle(now)
			idleCheck = now
			d.loopAt.Store(now.UnixNano())
		}
	}
}

func (d *device) halt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.iter != nil {
		d.iter.Stop()
	}
}

// close frees every session and closes the backend. Called after run returned.
func (d *device) close() {
	for id, s := range d.sessions {
		s.freeAll(d.cfg.Backend)
		delete(d.sessions, id)
	}
	d.sessionCount.Store(0)
	d.m.tensorBytes.Store(0)
	if c, ok := d.cfg.Backend.(io.Closer); ok {
		_ = c.Close()
	}
}

func (d *device) evictIdle(now time.Time) {
	limit := d.w.cfg.IdleTimeout
	if limit == 0 {
		return
	}
	for id, s := range d.sessions {
		if now.Sub(s.last) > limit {
			d.m.tensorBytes.Add(-s.bytes)
			d.w.logf("worker: %s: session %s idle for %v, freeing %d tensors", d.cfg.Name, id, now.Sub(s.last).Round(time.Second), len(s.tensors))
			s.freeAll(d.cfg.Backend)
			delete(d.sessions, id)
		}
	}
	d.sessionCount.Store(int64(len(d.sessions)))
}

// handle executes one frame. Nothing in it may panic on wire input.
func (d *device) handle(msg jetstream.Msg) {
	var seq uint64
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
		d.m.pending.Store(md.NumPending)
	}
	if seq != 0 && seq <= d.applied.Load() {
		return // already applied
	}
	defer d.applied.Store(seq)
	hdr := msg.Headers()
	reply := hdr.Get(subjects.HeaderReply)
	enc, encErr := codec.EncodingOf(hdr.Get(subjects.HeaderContentType))
	fail := func(code, format string, args ...any) codec.Error {
		d.m.countError(code)
		d.m.frames.Add(1)
		e := codec.Error{Seq: seq, Code: code, Message: fmt.Sprintf(format, args...)}
		d.reply(reply, enc, &codec.Result{V: codec.Version, Seq: seq, Errors: []codec.Error{e}})
		return e
	}
	_, sid, err := d.w.names.ParseOps(msg.Subject())
	if err != nil {
		fail(codec.CodeMalformed, "%v", err)
		return
	}
	s, ok := d.sessions[sid]
	if !ok {
		if len(d.sessions) >= d.w.cfg.Limits.MaxSessions {
			fail(codec.CodeLimit, "device %s has %d sessions, the limit", d.cfg.Name, len(d.sessions))
			return
		}
		s = newSession(sid)
		d.sessions[sid] = s
		d.sessionCount.Store(int64(len(d.sessions)))
	}
	s.last = time.Now()
	if encErr != nil {
		s.pending = append(s.pending, fail(codec.CodeMalformed, "%v", encErr))
		return
	}
	frame, err := codec.DecodeFrame(enc, msg.Data())
	if err != nil {
		code := codec.CodeMalformed
		switch {
		case errors.Is(err, codec.ErrVersion):
			code = codec.CodeVersion
		case errors.Is(err, codec.ErrTooManyOps):
			code = codec.CodeLimit
		}
		s.pending = append(s.pending, fail(code, "%v", err))
		return
	}
	x := exec{d: d, s: s, seq: seq, reply: reply, enc: enc}
	start, mem, n, closed := time.Now(), s.bytes, 0, false
	for n < len(frame.Ops) && !closed {
		closed = x.op(n, &frame.Ops[n])
		n++
	}
	d.m.frameDone(n, time.Since(start), s.bytes-mem, &x.io)
	if closed {
		delete(d.sessions, sid)
		d.sessionCount.Store(int64(len(d.sessions)))
	}
}

// reply publishes r on subject; errors are logged, never fatal.
func (d *device) reply(subject string, enc codec.Encoding, r *codec.Result) {
	if subject == "" {
		return
	}
	b, err := codec.Marshal(enc, r)
	if err != nil {
		d.w.logf("worker: %s: encode result: %v", d.cfg.Name, err)
		return
	}
	msg := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{}}
	msg.Header.Set(subjects.HeaderContentType, enc.String())
	if err := d.w.nc.PublishMsg(msg); err != nil {
		d.w.logf("worker: %s: reply to %s: %v", d.cfg.Name, subject, err)
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
