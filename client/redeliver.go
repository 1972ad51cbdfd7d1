package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
)

// redelivery holds the frames whose publish failed without the stream
// saying it refuses them (no answer, no responders, a lost connection, a
// leader changing), and publishes each again, with its Nats-Msg-Id, until
// the stream stores it: within the stream's duplicate window a frame
// stored already is stored once, past it the worker drops the number it
// ran already. Its goroutine runs from the client's creation to Close.
type redelivery struct {
	mu      sync.Mutex
	pending map[string]*undelivered // by Nats-Msg-Id
	wake    chan struct{}           // buffered 1
}

type undelivered struct {
	msg   *nats.Msg
	due   time.Time     // next publish
	wait  time.Duration // backoff: from redeliverWait, doubling to redeliverMax
	since time.Time     // first failure
	err   error         // last failure
	out   bool          // published, answer awaited
}

const (
	redeliverWait = 50 * time.Millisecond
	redeliverMax  = 2 * time.Second
)

// redeliver takes m, whose publish failed with err, to be published again.
// It reports false when the client is closed.
func (c *Client) redeliver(m *nats.Msg, err error) bool {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return false
	}
	id := m.Header.Get(jetstream.MsgIDHeader)
	now := time.Now()
	r := &c.redeliv
	r.mu.Lock()
	u := r.pending[id]
	if u == nil {
		u = &undelivered{msg: m, since: now, wait: redeliverWait}
		r.pending[id] = u
	} else {
		u.wait = min(2*u.wait, redeliverMax)
	}
	u.err, u.out, u.due = err, false, now.Add(u.wait)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return true
}

// redeliverSoon publishes m again asking for the stream's acknowledgement
// (a waited frame whose answer did not come, a replacement), as a failed
// publish is.
func (c *Client) redeliverSoon(m *nats.Msg) {
	c.redeliver(m, errors.New("not yet confirmed stored"))
}

// delivered forgets m: the stream answered it.
func (c *Client) delivered(m *nats.Msg) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	r := &c.redeliv
	r.mu.Lock()
	delete(r.pending, id)
	r.mu.Unlock()
}

// redeliverLoop publishes the frames that are due, until Close.
func (c *Client) redeliverLoop() {
	r := &c.redeliv
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		now := time.Now()
		var due []*nats.Msg
		next := now.Add(time.Hour)
		r.mu.Lock()
		for _, u := range r.pending {
			switch {
			case u.out:
			case !u.due.After(now):
				u.out = true
				due = append(due, u.msg)
			default:
				next = minTime(next, u.due)
			}
		}
		r.mu.Unlock()
		// Frames of one session go out in the order of their numbers;
		// the worker orders them anyway.
		sortFrames(due)
		for _, m := range due {
			if _, err := c.js.PublishMsgAsync(m); err != nil {
				c.published(m, err)
			}
		}
		t.Reset(next.Sub(time.Now()))
		select {
		case <-c.stop:
			return
		case <-r.wake:
		case <-t.C:
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// sortFrames orders frames by subject, then by number (Fabric-Frame).
func sortFrames(ms []*nats.Msg) {
	num := func(m *nats.Msg) uint64 {
		n, _ := strconv.ParseUint(m.Header.Get(subjects.HeaderFrame), 10, 64)
		return n
	}
	slices.SortFunc(ms, func(a, b *nats.Msg) int {
		if c := strings.Compare(a.Subject, b.Subject); c != 0 {
			return c
		}
		return cmp.Compare(num(a), num(b))
	})
}

// Undelivered reports how many frames the client holds for the stream
// (published, the stream's acknowledgement not yet received after a
// failure), and the oldest failure among them.
func (c *Client) Undelivered() (frames int, since time.Time, last error) {
	r := &c.redeliv
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.pending {
		frames++
		if since.IsZero() || u.since.Before(since) {
			since, last = u.since, u.err
		}
	}
	return frames, since, last
}

// disconnected is the error of a call made while the connection is down.
// A connection the broker closed for its credentials (revoked, expired)
// does not come back: that is ErrCredentials.
func (c *Client) disconnected(st nats.Status) error {
	cause := ""
	err := c.nc.LastError()
	if err != nil {
		cause = fmt.Sprintf(", last error: %v", err)
	}
	if st == nats.CLOSED && c.opts.creds != "" && (errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAuthExpired)) {
		who := "the service user"
		if c.opts.credsTenant != "" {
			who = "tenant " + c.opts.credsTenant
		}
		return fmt.Errorf("%w: the broker closed the connection and refuses the credentials of %s in %s (expired or revoked)%s; the client does not reconnect: connect with new credentials",
			ErrCredentials, who, c.opts.creds, cause)
	}
	return fmt.Errorf("%w: %w: connection %s%s; the client reconnects by itself and its frames go out once a node answers: check that the broker (or a majority of the cluster's nodes) is up at %s",
		ErrUnavailable, ErrDisconnected, strings.ToLower(st.String()), cause, strings.Join(c.nc.Servers(), ", "))
}

// diagnose words err, a JetStream request that failed for want of an
// answer, by what the fabric can still say: the connection, then
// JetStream's meta leader, which answers the stream-by-subject lookup
// (any node answers account info, with or without a quorum).
func (c *Client) diagnose(ctx context.Context, err error) error {
	if st := c.nc.Status(); st != nats.CONNECTED {
		return c.disconnected(st)
	}
	at := c.nc.ConnectedServerName()
	if at == "" {
		at = c.nc.ConnectedUrlRedacted()
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeDupInProcess {
		// The stream's leader took the frame but cannot commit it: its
		// replicas do not answer.
		return fmt.Errorf("%w: %w: stream %s has a leader that cannot store (%v): a majority of the nodes holding it are down or cut off from it: bring them back; calls carry on once they are",
			ErrUnavailable, ErrNoQuorum, c.names.OpsStream(), err)
	}
	if c.names.Tenant() != "" {
		// A tenant may not ask JetStream about the fabric's streams.
		return fmt.Errorf("%w: %w: stream %s did not answer (%v)", ErrUnavailable, ErrNoLeader, c.names.OpsStream(), err)
	}
	if _, ok := ctx.Deadline(); !ok || ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), probeTimeout/2)
		defer cancel()
	}
	_, merr := c.js.StreamNameBySubject(ctx, c.names.Ops("x", "x"))
	switch {
	case merr == nil:
		return fmt.Errorf("%w: %w: stream %s did not answer (%v); its leader is down and the others are electing one, or a majority of the nodes holding it are down: bring them back; calls carry on once it has a leader",
			ErrUnavailable, ErrNoLeader, c.names.OpsStream(), err)
	case errors.As(merr, &apiErr) && apiErr.Code != 503:
		// Not allowed to ask, or JetStream says something else: keep to
		// what the stream's silence says.
		return fmt.Errorf("%w: %w: stream %s did not answer (%v)", ErrUnavailable, ErrNoLeader, c.names.OpsStream(), err)
	}
	return fmt.Errorf("%w: %w: JetStream has no meta leader (the stream: %v; JetStream: %v): a majority of the cluster's nodes are down or cut off from the node this client is on (%s): bring them back; calls carry on once they are",
		ErrUnavailable, ErrNoQuorum, err, merr, at)
}
