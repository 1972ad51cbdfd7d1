package worker

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// maxFreed bounds the sessions a device remembers having freed as idle.
const maxFreed = 4096

// liveness is what a device knows of its sessions' clients: when each
// last sent a heartbeat (written by the heartbeat subscription, read by
// the device loop, under mu), and which sessions it freed for being idle
// (device loop only), so that a client that comes back is told so.
type liveness struct {
	beats map[string]time.Time
	// freed and order: sessions freed as idle, oldest first.
	freed map[string]time.Time
	order []string
}

// onAlive records a heartbeat of the session named by the subject's last
// token. It never waits for the device loop.
func (d *device) onAlive(m *nats.Msg) {
	sid := lastToken(m.Subject)
	if sid == "" {
		return
	}
	if d.w.cfg.Tenants {
		tenant, _, session, err := d.w.names.ParseAlive(m.Subject)
		if err != nil {
			return
		}
		sid = subjects.SessionKey(tenant, session)
	}
	now := time.Now()
	d.aliveMu.Lock()
	if d.live.beats == nil {
		d.live.beats = map[string]time.Time{}
	}
	d.live.beats[sid] = now
	d.aliveMu.Unlock()
}

func lastToken(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '.' {
			return s[i+1:]
		}
	}
	return s
}

// lastSeen is the later of the session's last frame and its client's last
// heartbeat.
func (d *device) lastSeen(s *session) time.Time {
	d.aliveMu.Lock()
	b := d.live.beats[s.id]
	d.aliveMu.Unlock()
	if b.After(s.last) {
		return b
	}
	return s.last
}

// forgetBeats drops heartbeats older than limit (of sessions that ended,
// or were never opened here).
func (d *device) forgetBeats(now time.Time, limit time.Duration) {
	d.aliveMu.Lock()
	defer d.aliveMu.Unlock()
	for id, t := range d.live.beats {
		if now.Sub(t) > limit {
			delete(d.live.beats, id)
		}
	}
}

// noteFreed remembers that session id was freed as idle at t. Device loop
// only.
func (d *device) noteFreed(id string, t time.Time) {
	if d.live.freed == nil {
		d.live.freed = map[string]time.Time{}
	}
	if _, ok := d.live.freed[id]; !ok {
		d.live.order = append(d.live.order, id)
	}
	d.live.freed[id] = t
	for len(d.live.order) > maxFreed {
		delete(d.live.freed, d.live.order[0])
		d.live.order = d.live.order[1:]
	}
}

// wasFreed reports when session id was freed as idle, if it was.
func (d *device) wasFreed(id string) (time.Time, bool) {
	t, ok := d.live.freed[id]
	return t, ok
}

// refuseFreed answers a frame of a session freed as idle: every op that
// waits for an answer (read, sync, close) gets the error, so that its
// caller learns why; a frame with none gets one answer with tag 0.
func (d *device) refuseFreed(data []byte, seq uint64, reply string, enc codec.Encoding, encErr error, sid string, at time.Time) {
	e := codec.Error{Seq: seq, Code: codec.CodeSessionFreed, Message: fmt.Sprintf(
		"session %s was freed at %s: no frame and no heartbeat from its client for %v; its tensors are gone: open a new session",
		sid, at.UTC().Format(time.RFC3339), d.w.cfg.IdleTimeout)}
	d.refuseFrame(data, seq, reply, enc, encErr, e)
}

// refuseFrame answers every read, sync or close of a frame that is not
// run with e (the frame itself when none of its ops waits).
func (d *device) refuseFrame(data []byte, seq uint64, reply string, enc codec.Encoding, encErr error, e codec.Error) {
	d.m.countError(e.Code)
	answered := false
	if encErr == nil {
		if f, err := codec.DecodeFrame(enc, data); err == nil {
			for i, op := range f.Ops {
				if op.Tag == 0 {
					continue
				}
				ei := e
				ei.Index, ei.Op = i, op.Op
				d.reply(reply, enc, &codec.Result{V: codec.Version, Tag: op.Tag, Seq: seq, Index: i, Errors: []codec.Error{ei}})
				answered = true
			}
		}
	}
	if !answered {
		d.reply(reply, enc, &codec.Result{V: codec.Version, Seq: seq, Errors: []codec.Error{e}})
	}
}
