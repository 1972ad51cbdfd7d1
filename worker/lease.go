package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
)

// ErrLeaseLost: another worker owns the device now; the holder must stop
// writing and step down.
var ErrLeaseLost = errors.New("worker: device lease lost")

// leaseValue is the JSON value of lease.<device>.
type leaseValue struct {
	Worker   string    `json:"worker"`
	Acquired time.Time `json:"acquired"`
	// Live is the token of the holder's liveness subject
	// (subjects.WorkerLive), "" from a worker that answers none.
	Live string `json:"live,omitempty"`
}

// lease is one device's ownership in FABRIC_CTRL. The holder renews it by
// compare-and-set on its revision; a standby takes it by compare-and-set
// too, once it sees the revision unchanged for the lease TTL or the
// holder's connection gone (see holderGone), so at most one worker holds a
// given revision. Every durable write of the holder (checkpoints, registry
// entries) names the revision it holds, and the server refuses it once the
// lease has moved on: a paused worker that wakes up cannot overwrite its
// successor's state.
type lease struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	names  subjects.Names
	device string
	me     leaseValue // the holder's Worker and Live
	ttl    time.Duration

	mu  sync.Mutex // serialises renewals and fenced writes
	rev uint64
}

// leaseStoreTTL is how long the server keeps an abandoned lease key; the
// takeover decision does not wait for it (see acquire).
const leaseStoreTTL = time.Minute

// goneFor is how long a standby must find a lease's holder gone
// (holderGone), in every look, before it takes the lease without waiting
// out its TTL: longer than a connection that drops and is made again at
// once takes (a worker's first reconnect comes after 100 to 125 ms), or
// than a cluster's routes take to tell each other of a subscription.
func goneFor(ttl time.Duration) time.Duration { return min(ttl/2, 250*time.Millisecond) }

// leasePoll is how often a standby looks at the lease it waits for: an
// eighth of the TTL, at most maxLeasePoll, so that a holder's death is
// seen as soon with a long TTL as with the default.
func leasePoll(ttl time.Duration) time.Duration { return min(ttl/8, maxLeasePoll) }

const maxLeasePoll = 250 * time.Millisecond

// acquireLease returns once the worker me names (its Worker and Live)
// holds the device's lease, waiting as a standby while a live holder
// renews it, or until ctx ends. onStandby is called once if the lease was
// held by someone else. lag, if not nil, is how much longer than the
// others this standby leaves a dead or paused holder's lease before it
// takes it (see device.takeoverLag).
func acquireLease(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, names subjects.Names,
	device string, me leaseValue, ttl time.Duration, onStandby func(holder string), lag func() time.Duration) (*lease, error) {
	l := &lease{js: js, kv: kv, names: names, device: device, me: me, ttl: ttl}
	key := subjects.LeaseKey(device)
	val := l.value()
	var seenRev uint64
	var seenAt time.Time
	var gone absence     // of the holder of seenRev
	var vacant time.Time // since when no one has held the lease
	told := false
	late := func() time.Duration {
		if lag == nil {
			return 0
		}
		return lag()
	}
	for {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			if vacant.IsZero() {
				vacant = time.Now()
			}
			if time.Since(vacant) < late() {
				break // a standby with more read ahead may take it first
			}
			rev, err := kv.Create(ctx, key, val, jetstream.KeyTTL(leaseStoreTTL))
			if err == nil {
				l.rev = rev
				return l, nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) {
				return nil, fmt.Errorf("worker: lease %s: %w", device, err)
			}
		case err != nil:
			if ctx.Err() != nil {
				return nil, fmt.Errorf("worker: lease %s: %w", device, ctx.Err())
			}
		default:
			vacant = time.Time{}
			var held leaseValue
			_ = json.Unmarshal(e.Value(), &held)
			if held.Worker == me.Worker {
				// Our own lease from before a restart: take it back at once.
				if rev, err := l.put(ctx, val, e.Revision()); err == nil {
					l.rev = rev
					return l, nil
				}
			}
			if e.Revision() != seenRev {
				seenRev, seenAt, gone = e.Revision(), time.Now(), absence{}
				if !told && onStandby != nil {
					onStandby(held.Worker)
					told = true
				}
			}
			away := gone.look(holderGone(js.Conn(), names, held, leasePoll(ttl)/2))
			// Not renewed for a whole TTL (the holder is gone or paused),
			// or the holder's connection gone for goneFor: take it.
			if wait := late(); time.Since(seenAt) >= ttl+wait || away >= goneFor(ttl)+wait {
				val = l.value()
				if rev, err := l.put(ctx, val, seenRev); err == nil {
					l.rev = rev
					return l, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("worker: lease %s: %w", device, ctx.Err())
		case <-time.After(leasePoll(ttl)):
		}
	}
}

// holderGone reports whether the worker that wrote held has no
// connection to the fabric now: nothing subscribes to its liveness
// subject, and the server says so at once ("no responders"). A holder
// connected but slow to answer within wait, or paused, is not gone, nor
// is one that names no liveness subject (a worker before it): for them
// the lease's TTL decides.
func holderGone(nc *nats.Conn, names subjects.Names, held leaseValue, wait time.Duration) bool {
	if held.Live == "" || subjects.ValidateToken(held.Live) != nil {
		return false
	}
	_, err := nc.Request(names.WorkerLive(held.Live), nil, wait)
	return errors.Is(err, nats.ErrNoResponders)
}

// absence is how long every look at a lease has found its holder gone.
type absence struct{ since time.Time }

// look records one look (gone: holderGone's answer) and returns how long
// the holder has been gone in every look since the first of them, 0 if it
// is not gone now.
func (a *absence) look(gone bool) time.Duration {
	switch {
	case !gone:
		a.since = time.Time{}
		return 0
	case a.since.IsZero():
		a.since = time.Now()
	}
	return time.Since(a.since)
}

// value is the lease's value as of now.
func (l *lease) value() []byte {
	v := l.me
	v.Acquired = time.Now().UTC()
	b, _ := json.Marshal(v)
	return b
}

// put writes the lease value if the key's last revision is rev.
func (l *lease) put(ctx context.Context, val []byte, rev uint64) (uint64, error) {
	ack, err := l.js.Publish(ctx, l.names.CtrlSubject(subjects.LeaseKey(l.device)), val,
		jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(leaseStoreTTL))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// renew extends the lease. ErrLeaseLost means another worker took it.
func (l *lease) renew(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rev == 0 {
		return ErrLeaseLost
	}
	val := l.value()
	rev, err := l.put(ctx, val, l.rev)
	if err != nil && isWrongSequence(err) && l.reclaim(ctx) {
		rev, err = l.put(ctx, val, l.rev)
	}
	if err != nil {
		if isWrongSequence(err) {
			l.rev = 0
			return fmt.Errorf("%w: %s", ErrLeaseLost, l.device)
		}
		return fmt.Errorf("worker: renew lease %s: %w", l.device, err)
	}
	l.rev = rev
	return nil
}

// reclaimTimeout bounds reclaim's read of the lease.
const reclaimTimeout = 2 * time.Second

// reclaim handles a write refused because the lease's last revision is
// not l.rev: it reads the lease from the control bucket's leader, and
// when that holds this worker's value at a later revision, that revision
// is l.rev and reclaim reports true. Such a revision is a renewal whose
// answer was lost, stored all the same (the stream's leader died with the
// answer in flight, or stored it after the renewal timed out): the lease
// is still this worker's, and no other worker wrote it since. Anything
// else (another worker's value, the key deleted, no answer within
// reclaimTimeout) reports false. l.mu is held.
func (l *lease) reclaim(ctx context.Context) bool {
	// A time of its own: the refused write may have used up the caller's
	// (a renewal has a lease TTL in all), and the leader that refused it
	// answers at once.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reclaimTimeout)
	defer cancel()
	stream := l.names.CtrlStream()
	req, _ := json.Marshal(map[string]string{"last_by_subj": l.names.CtrlSubject(subjects.LeaseKey(l.device))})
	// STREAM.MSG.GET, which the stream's leader answers: a direct get
	// (kv.Get) may be answered by a replica that has not caught up.
	m, err := l.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return false
	}
	var r struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Data []byte `json:"data"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
	}
	if json.Unmarshal(m.Data, &r) != nil || r.Message == nil || r.Message.Seq <= l.rev ||
		bytes.Contains(r.Message.Hdrs, []byte("KV-Operation")) { // a delete or purge marker
		return false
	}
	var held leaseValue
	if json.Unmarshal(r.Message.Data, &held) != nil || held.Worker != l.me.Worker {
		return false
	}
	l.rev = r.Message.Seq
	return true
}

// write puts value under key in the control bucket, fenced on the lease:
// the server refuses it unless the lease's last revision is still ours.
func (l *lease) write(ctx context.Context, key string, value []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rev == 0 {
		return ErrLeaseLost
	}
	write := func() error {
		_, err := l.js.PublishMsg(ctx, &nats.Msg{Subject: l.names.CtrlSubject(key), Data: value},
			jetstream.WithExpectLastSequenceForSubject(l.rev, l.names.CtrlSubject(subjects.LeaseKey(l.device))))
		return err
	}
	err := write()
	if err != nil && isWrongSequence(err) && l.reclaim(ctx) {
		err = write()
	}
	if err != nil {
		if isWrongSequence(err) {
			l.rev = 0
			return fmt.Errorf("%w: %s: write of %s refused", ErrLeaseLost, l.device, key)
		}
		return fmt.Errorf("worker: write %s: %w", key, err)
	}
	return nil
}

// release gives the lease up so a standby can take over at once.
func (l *lease) release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rev == 0 {
		return nil
	}
	err := l.kv.Delete(ctx, subjects.LeaseKey(l.device), jetstream.LastRevision(l.rev))
	l.rev = 0
	if err != nil && !isWrongSequence(err) {
		return fmt.Errorf("worker: release lease %s: %w", l.device, err)
	}
	return nil
}

// held reports whether the lease is still believed held.
func (l *lease) held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev != 0
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyExists)
}
