package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

// Session is a sequence of ops on one device, with its own tensors.
type Session struct {
	c       *Client
	device  string
	id      string
	subject string
	inbox   string
	sub     *nats.Subscription

	mu      sync.Mutex
	nextID  uint64
	nextTag uint64
	queued  []codec.Op
	qbytes  int
	timer   *time.Timer
	waiters map[uint64]chan *codec.Result
	// errs are failures seen here (bad arguments, refused frames) not yet
	// returned by a read or sync.
	errs   []error
	closed bool
	// frames numbers the frames published (header Fabric-Frame).
	frames uint64
	// acksSent counts the frames published asking for the stream's
	// acknowledgement.
	acksSent uint64
	// acks holds the stream's answers to them, under a lock of its own:
	// the JetStream context's callback that fills it must never wait for
	// mu, which a publisher holds while it waits for the publish window,
	// which that callback's goroutine frees.
	acks struct {
		sync.Mutex
		done    uint64        // frames answered
		wake    chan struct{} // closed when done grows while a call waits (see settle)
		refused []error       // refusals not yet returned by a read or sync
	}
	// record: a job or a graph being built; ops are kept, never sent
	// (see NewJob, NewGraph). graph is the graph, for a graph.
	record bool
	graph  *Graph
	// replies receives every answer on the inbox; see route.
	replies chan *nats.Msg
}

// replyBuffer bounds the answers held while nobody waits in call (answers
// to undecodable frames, and the answers a worker that took the device over
// gives again). Past it they are dropped: the ones that matter are waited for.
const replyBuffer = 4096

func newSession(c *Client, device string) (*Session, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s := &Session{
		c:       c,
		device:  device,
		id:      id,
		subject: c.names.Ops(device, id),
		inbox:   c.names.InboxPrefix() + "." + id,
		waiters: map[uint64]chan *codec.Result{},
	}
	// Replies land in a channel that the goroutines waiting in call read
	// themselves: the connection's reader hands a reply straight to its
	// waiter, with no dispatching goroutine between them.
	s.replies = make(chan *nats.Msg, replyBuffer)
	sub, err := c.nc.ChanSubscribe(s.inbox, s.replies)
	if err != nil {
		return nil, fmt.Errorf("client: subscribe %s: %w", s.inbox, err)
	}
	s.sub = sub
	return s, nil
}

// Device is the device the session runs on.
func (s *Session) Device() string { return s.device }

// ID is the session token (the last token of its op subject).
func (s *Session) ID() string { return s.id }

// route hands an answer to the call waiting for its tag.
func (s *Session) route(m *nats.Msg) {
	enc, _ := codec.EncodingOf(m.Header.Get(subjects.HeaderContentType))
	var r codec.Result
	if err := codec.Unmarshal(enc, m.Data, &r); err != nil {
		s.fail(fmt.Errorf("client: undecodable reply: %w", err))
		return
	}
	s.mu.Lock()
	ch := s.waiters[r.Tag]
	delete(s.waiters, r.Tag)
	s.mu.Unlock()
	if ch != nil {
		ch <- &r
		return
	}
	if r.Tag != 0 {
		// A second answer to a read (a worker that took the device over
		// replays frames), or one nobody waits for any more.
		return
	}
	// The answer to an undecodable frame still carries errors.
	for i := range r.Errors {
		s.fail(&r.Errors[i])
	}
}

// fail records an error to be returned by the next read or sync.
func (s *Session) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// enqueue adds op, minting output ids, and flushes if the frame is full.
// It returns the first output id (0 when the op has none).
func (s *Session) enqueue(op codec.Op, outs int, in ...*Tensor) *Tensor {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.errs = append(s.errs, fmt.Errorf("%w: session %s", ErrClosed, s.id))
		return &Tensor{s: s}
	}
	if len(in) > 0 {
		op.In = make([]uint64, len(in))
		for i, t := range in {
			if t == nil || t.s != s || t.id == 0 {
				s.errs = append(s.errs, fmt.Errorf("%w: %s input %d is nil or belongs to another session (move it with To)", ErrInvalidArgument, op.Op, i))
				return &Tensor{s: s}
			}
			op.In[i] = t.id
		}
	}
	var first uint64
	if outs > 0 {
		op.Out = make([]uint64, outs)
		for i := range op.Out {
			s.nextID++
			op.Out[i] = s.nextID
		}
		first = op.Out[0]
	}
	s.queueLocked(op, false)
	return &Tensor{s: s, id: first}
}

// queueLocked adds op to the frame being built, publishing the frame
// first if op does not fit in it. An op a call waits on (waited: a read,
// sync or close) is published at once, in a frame that is returned with
// its size (see publishLocked); any other is published when the frame is
// full or on the timer.
func (s *Session) queueLocked(op codec.Op, waited bool) (frame *nats.Msg, size int) {
	if s.record {
		s.queued = append(s.queued, op)
		return nil, 0
	}
	opSize := 48 + len(op.Data) + 8*(len(op.In)+len(op.Out)+len(op.Shape)+len(op.Axes)+len(op.Perm)+len(op.Values))
	if len(s.queued) > 0 && (len(s.queued) >= s.c.opts.maxFrameOps || s.qbytes+opSize > s.c.opts.maxFrameBytes) {
		s.flushLocked()
	}
	s.queued = append(s.queued, op)
	s.qbytes += opSize
	if waited {
		return s.publishLocked(true)
	}
	if len(s.queued) >= s.c.opts.maxFrameOps || s.qbytes >= s.c.opts.maxFrameBytes {
		s.flushLocked()
		return nil, 0
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(s.c.opts.flushDelay, s.flushTimer)
	}
	return nil, 0
}

func (s *Session) flushTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	s.flushLocked()
}

// flushLocked publishes the queued ops as one frame, asking for the
// stream's acknowledgement.
func (s *Session) flushLocked() { s.publishLocked(false) }

// publishLocked publishes the queued ops as one frame and returns it and
// its size, or nil when nothing was published (the reason is in s.errs).
//
// Every frame carries its number in its session (header Fabric-Frame) and
// a Nats-Msg-Id made of the session token and that number, so publishing
// it again stores it once (within the stream's duplicate window), and the
// worker runs a session's frames in the order of their numbers whatever
// order the stream stored them in.
//
// A frame that no call waits on is published asking for the stream's
// acknowledgement (asynchronously, up to the publish window in flight): a
// failure that says nothing about the frame (no answer, no responders, a
// lost connection, a leader changing) publishes it again, with the same
// id, until the stream stores it (see redeliver); a refusal is returned
// by the next read or sync. A frame that a call waits on (waited) carries
// its read, sync or close, and the worker's answer confirms that the
// stream stored it; it goes out as a plain core publish, which JetStream
// stores all the same, without an acknowledgement that would wake this
// process while the worker works. If the answer is late, call publishes it
// again asking for the acknowledgement (see confirm).
func (s *Session) publishLocked(waited bool) (msg *nats.Msg, size int) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if len(s.queued) == 0 || s.record {
		return nil, 0
	}
	data, err := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: s.queued})
	s.queued = s.queued[:0]
	s.qbytes = 0
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("client: encode frame: %w", err))
		return nil, 0
	}
	n := s.frames + 1
	msg = &nats.Msg{Subject: s.subject, Data: data, Header: nats.Header{
		subjects.HeaderReply:  []string{s.inbox},
		subjects.HeaderFrame:  []string{strconv.FormatUint(n, 10)},
		jetstream.MsgIDHeader: []string{msgID(s.subject, n)},
	}}
	size = len(data) + headerSize(msg.Header)
	if max := s.c.nc.MaxPayload(); max > 0 && int64(size) > max {
		// The server would close the connection: refuse it here. The
		// number is not used, so the session's frames stay contiguous.
		s.errs = append(s.errs, fmt.Errorf("%w: frame of %d bytes on %s is over the broker's max_payload of %d bytes (send large tensors with Upload, which goes through the object store, or split the work into smaller frames with WithMaxFrame)",
			ErrPublish, size, s.subject, max))
		return nil, 0
	}
	if waited {
		err = s.c.nc.PublishMsg(msg)
	} else {
		_, err = s.c.js.PublishMsgAsync(msg)
	}
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("%w: frame %d of %d bytes on %s: %v", ErrPublish, n, len(data), s.subject, err))
		return nil, 0
	}
	s.frames = n
	if !waited {
		s.acksSent++
	}
	return msg, size
}

// msgID is a frame's Nats-Msg-Id: the session's subject (its tenant,
// device and token: the stream de-duplicates across all of them) and the
// frame's number. A frame put in place of a refused one (see replace)
// adds "-r".
func msgID(subject string, n uint64) string { return subject + "-" + strconv.FormatUint(n, 10) }

// headerSize is what a message's headers add to its size on the wire,
// which the server's max_payload and the stream's max message size count:
// "NATS/1.0\r\n", "key: value\r\n" each, "\r\n".
func headerSize(h nats.Header) int {
	n := len("NATS/1.0\r\n") + 2
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n
}

// published records the stream's answer to a frame published asking for
// an acknowledgement. A failure that leaves the frame's fate unknown
// publishes it again (see Client.redeliver); a refusal is returned by the
// next read or sync, and an empty frame of the same number takes its
// place, so that the worker does not wait for it.
func (s *Session) published(m *nats.Msg, err error) {
	replacement := strings.HasSuffix(m.Header.Get(jetstream.MsgIDHeader), "-r")
	if err != nil && (replacement || transient(err)) && s.c.redeliver(m, err) {
		return
	}
	s.c.delivered(m)
	if replacement {
		return
	}
	s.acks.Lock()
	defer s.acks.Unlock()
	s.acks.done++
	if err != nil {
		s.acks.refused = append(s.acks.refused, fmt.Errorf("%w: frame %s of %d bytes on %s: %v", ErrPublish, m.Header.Get(subjects.HeaderFrame), len(m.Data), m.Subject, refusal(err)))
		s.replace(m)
	}
	if s.acks.wake != nil {
		close(s.acks.wake)
		s.acks.wake = nil
	}
}

// replace publishes an empty frame in place of the refused frame m, with
// its number, so that the worker runs the session's later frames (the ops
// that used what m would have made fail with unknown ids).
func (s *Session) replace(m *nats.Msg) {
	data, err := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: []codec.Op{}})
	if err != nil {
		return
	}
	n := m.Header.Get(subjects.HeaderFrame)
	r := &nats.Msg{Subject: m.Subject, Data: data, Header: nats.Header{
		subjects.HeaderReply:  []string{s.inbox},
		subjects.HeaderFrame:  []string{n},
		jetstream.MsgIDHeader: []string{s.subject + "-" + n + "-r"},
	}}
	s.c.redeliverSoon(r)
}

// transient reports whether a publish failure leaves the frame's fate
// unknown or says the stream cannot take it for now (no answer, no
// responders, a lost connection, no leader): publishing it again with the
// same id is then safe and needed.
func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503s other than a store failure (full, over a limit) are the
		// cluster's: no leader, no quorum, not current. A duplicate "in
		// process" is the frame's first publish, not yet committed (a
		// stream without its quorum holds it there).
		return apiErr.Code == 503 && apiErr.ErrorCode != errCodeStoreFailed || apiErr.ErrorCode == errCodeDupInProcess
	}
	return true
}

// JetStream error codes (nats-server's errors.json) that nats.go does not name.
const (
	errCodeStoreFailed  jetstream.ErrorCode = 10077 // JSStreamStoreFailedF: full, over a limit
	errCodeSealed       jetstream.ErrorCode = 10109 // JSStreamSealedErr
	errCodeDupInProcess jetstream.ErrorCode = 10158 // JSStreamDuplicateMessageConflict: the first publish is not committed yet
)

// refusal words a stream's refusal of a frame.
func refusal(err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch d := apiErr.Description; {
	case apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return fmt.Errorf("over the stream's max message size (%w)", err)
	case strings.Contains(d, "maximum bytes") || strings.Contains(d, "maximum messages"):
		return fmt.Errorf("the stream is full, discarding new frames: %w (a checkpoint frees it; or raise its max bytes)", err)
	case apiErr.ErrorCode == errCodeSealed:
		return fmt.Errorf("the stream is sealed (%w)", err)
	}
	return err
}

// settleWait bounds settle: the stream's answers to earlier frames
// normally reach the connection before the worker's answer to a later one,
// so it is only hit when one was lost.
const settleWait = time.Second

// settle waits, at most settleWait, until the stream has answered the
// first n frames published asking for an acknowledgement, so that a
// refusal of a frame published before a call's own is returned by that
// call. It seldom waits: those answers reach the connection before the
// worker's answer to a later frame.
func (s *Session) settle(ctx context.Context, n uint64) {
	var timeout <-chan time.Time
	for {
		s.acks.Lock()
		if s.acks.done >= n {
			s.acks.Unlock()
			return
		}
		if s.acks.wake == nil {
			s.acks.wake = make(chan struct{})
		}
		wake := s.acks.wake
		s.acks.Unlock()
		if timeout == nil {
			t := time.NewTimer(settleWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Flush sends the queued ops now, without waiting for them.
func (s *Session) Flush() {
	s.mu.Lock()
	s.flushLocked()
	s.mu.Unlock()
}

// call queues op (a read, sync or close) with a fresh tag, flushes, and
// waits for its result. Errors recorded here and errors the worker reports
// come back joined.
//
// The frame carrying op is published without asking for the stream's
// acknowledgement (see publishLocked). If no answer has come after the
// frame-check interval, call publishes it again asking for one (the same
// Nats-Msg-Id: stored once): a refusal fails the call with ErrPublish;
// once stored, call checks at growing intervals, up to a second apart
// (half a second while the fabric does not answer), that the stream still
// has a leader and the device a live worker, and publishes op again (its
// answer lost on the way) when this connection reconnected or the worker
// has applied the frame with no answer here. When
// the fabric cannot be reached (no connection, no responders, no leader,
// no quorum) for the fail-fast time, the call fails with ErrUnavailable
// naming the cause, and the frame goes on being published in the
// background until the stream stores it, so that the session carries on
// when the cluster recovers. A ctx without a deadline gets the call
// timeout (WithCallTimeout).
func (s *Session) call(ctx context.Context, op codec.Op) (*codec.Result, error) {
	if _, ok := ctx.Deadline(); !ok && s.c.opts.callTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.c.opts.callTimeout)
		defer cancel()
	}
	ch := make(chan *codec.Result, 1)
	s.mu.Lock()
	if s.record {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: a job cannot %s; name its outputs in Submit", ErrInvalidArgument, op.Op)
	}
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: session %s", ErrClosed, s.id)
	}
	s.nextTag++
	op.Tag = s.nextTag
	s.waiters[op.Tag] = ch
	msg, _ := s.queueLocked(op, true)
	acks := s.acksSent
	if msg == nil {
		delete(s.waiters, op.Tag)
		s.mu.Unlock()
		return nil, s.collect(nil)
	}
	s.mu.Unlock()
	wait := s.c.opts.frameCheck
	check := time.NewTimer(wait)
	defer check.Stop()
	stored := false
	var seq uint64        // the frame's stream sequence, once stored
	var trouble time.Time // since when the fabric has not been reachable
	var down time.Time    // since when the device has had no live worker
	// The answer travels over core NATS: it is lost when this connection
	// is between nodes, or when the inbox overflows (a worker taking the
	// device over answers every read it replays again), or on the
	// worker's side: its connection closed with the answer in flight (its
	// node shut down), or a route between the nodes went down. When this
	// connection reconnected or the inbox dropped answers since the op
	// went out, or the device's registry entry says its worker has applied
	// the frame and no answer came, the op goes out again, with its tag,
	// in a frame of its own: the first answer wins.
	lost := s.answerLoss()
	fail := func(err error) (*codec.Result, error) {
		if r := s.drain(ch); r != nil {
			s.settle(ctx, acks)
			return r, s.collect(r.Errors)
		}
		s.drop(op.Tag)
		if !stored {
			// Its fate unknown: keep publishing it until the stream has
			// it, so that the session's later frames do not wait for it.
			s.c.redeliverSoon(msg)
		}
		return nil, errors.Join(s.collect(nil), fmt.Errorf("client: %s on %s: %w", op.Op, s.device, err))
	}
	for {
		select {
		case r := <-ch:
			s.settle(ctx, acks)
			return r, s.collect(r.Errors)
		case m := <-s.replies:
			s.route(m)
		case <-check.C:
			probed := time.Now()
			err := s.confirm(ctx, msg, &stored, &seq)
			var refused *refusedError
			switch {
			case errors.As(err, &refused):
				if r := s.drain(ch); r != nil {
					s.settle(ctx, acks)
					return r, s.collect(r.Errors)
				}
				s.drop(op.Tag)
				s.replace(msg)
				return nil, errors.Join(s.collect(nil), fmt.Errorf("%w: %s on %s: frame %s: %w", ErrPublish, op.Op, s.device, msg.Header.Get(subjects.HeaderFrame), refused.err))
			case err != nil:
				if trouble.IsZero() {
					trouble = probed
				}
				if time.Since(trouble) >= s.c.opts.failFast {
					return fail(err)
				}
			default:
				trouble = time.Time{}
				// The answer comes when the worker gets to the frame (or a
				// worker taking the device over replays it), unless no
				// worker serves the device any more.
				applied, err := s.deviceGone(ctx, &down)
				if err != nil {
					return fail(err)
				}
				if now := s.answerLoss(); now != lost || seq > 0 && applied >= seq {
					if r := s.drain(ch); r != nil {
						s.settle(ctx, acks)
						return r, s.collect(r.Errors)
					}
					lost = now
					if m := s.again(op); m != nil {
						msg, stored, seq = m, false, 0
					}
				}
			}
			wait = min(2*wait, maxFrameCheck)
			if !trouble.IsZero() {
				wait = min(wait, troubleCheck)
			}
			check.Reset(wait)
		case <-ctx.Done():
			if !stored {
				s.c.redeliverSoon(msg)
			}
			s.drop(op.Tag)
			return nil, fmt.Errorf("client: %s on %s: %w", op.Op, s.device, ctx.Err())
		}
	}
}

// answerLoss counts what can lose an answer: the connection's reconnects
// and the answers the inbox dropped.
func (s *Session) answerLoss() [2]uint64 {
	dropped, _ := s.sub.Dropped()
	return [2]uint64{s.c.nc.Stats().Reconnects, uint64(max(dropped, 0))}
}

// again publishes op (a read, sync or close that keeps its tag) once
// more, in a frame of its own, and returns that frame (nil when it could
// not be published).
func (s *Session) again(op codec.Op) *nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	msg, _ := s.queueLocked(op, true)
	return msg
}

// drain routes the answers that have arrived and returns the one on ch,
// if it was among them.
func (s *Session) drain(ch <-chan *codec.Result) *codec.Result {
	for {
		select {
		case r := <-ch:
			return r
		case m := <-s.replies:
			s.route(m)
		default:
			return nil
		}
	}
}

// maxFrameCheck bounds the wait between two checks of a call: a check
// that finds the fabric unreachable starts the fail-fast clock.
const maxFrameCheck = time.Second

// troubleCheck bounds the wait between two checks of a call while the
// fabric does not answer it: the call goes on within troubleCheck of the
// stream's new leader (elected 1.5 to 3 s after its node died, with the
// broker's raft timers), not within maxFrameCheck.
const troubleCheck = 500 * time.Millisecond

// refusedError is a stream's refusal of a frame.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }

// confirm publishes the frame msg again asking for the stream's
// acknowledgement, until the stream has said it stores it (*stored, at
// stream sequence *seq); after that it asks the stream's leader for an
// answer that stores nothing. It returns a *refusedError when the stream
// refuses the frame, and an error wrapping ErrUnavailable when the fabric
// cannot answer (see diagnose).
func (s *Session) confirm(ctx context.Context, msg *nats.Msg, stored *bool, seq *uint64) error {
	if st := s.c.nc.Status(); st != nats.CONNECTED {
		return s.c.disconnected(st)
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if !*stored {
		ack, err := s.c.js.PublishMsg(ctx, msg, jetstream.WithRetryAttempts(0))
		switch {
		case err == nil:
			// A frame stored already is acknowledged as a duplicate,
			// with the sequence it was stored at.
			*stored, *seq = true, ack.Sequence
			return nil
		case !transient(err):
			return &refusedError{refusal(err)}
		case errors.Is(err, jetstream.ErrNoStreamResponse) && s.c.names.Tenant() == "":
			// (A tenant may not list the streams: its frame's silence says
			// all it may learn.)
			if _, serr := s.c.js.StreamNameBySubject(ctx, s.subject); errors.Is(serr, jetstream.ErrStreamNotFound) {
				return &refusedError{fmt.Errorf("no stream captures %s", s.subject)}
			}
		}
		return s.c.diagnose(ctx, err)
	}
	// The stream's leader answers a publish that expects another stream
	// with an error, storing nothing: proof that the stream has a leader
	// and a quorum.
	probe := &nats.Msg{Subject: s.subject, Header: nats.Header{jetstream.ExpectedStreamHeader: []string{"-"}}}
	_, err := s.c.js.PublishMsg(ctx, probe, jetstream.WithRetryAttempts(0))
	var apiErr *jetstream.APIError
	if err == nil || errors.As(err, &apiErr) && !transient(err) {
		return nil
	}
	return s.c.diagnose(ctx, err)
}

// probeTimeout bounds a check: its requests together. With checks at most
// maxFrameCheck apart, a call fails at most failFast+maxFrameCheck+
// probeTimeout after the fabric stopped answering it (4.5 s by default).
const probeTimeout = 750 * time.Millisecond

// deviceGone reads the device's registry entry and returns the last
// stream sequence its worker applied while it has a live worker (serving,
// with a recent heartbeat; else 0), and an error wrapping ErrNoDevice once
// it has shown none since *down for longer than the device timeout. A
// registry it cannot read says nothing.
func (s *Session) deviceGone(ctx context.Context, down *time.Time) (applied uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	value, err := s.c.deviceEntry(ctx, s.device)
	now := time.Now()
	var d Device
	switch {
	case err == nil && json.Unmarshal(value, &d) == nil && Live(d, now):
		*down = time.Time{}
		return d.Applied, nil
	case err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return 0, nil
	case s.c.opts.deviceTimeout <= 0:
		return 0, nil
	}
	if down.IsZero() {
		*down = now
		return 0, nil
	}
	if gone := now.Sub(*down); gone > s.c.opts.deviceTimeout {
		state := "not registered"
		if d.Name != "" {
			state = fmt.Sprintf("%s, last heartbeat %v ago", d.State, now.Sub(d.Beat).Round(100*time.Millisecond))
		}
		return 0, fmt.Errorf("%w: no worker has served %s for %v (%s); start a worker for it (its frames are answered no_device and removed after the fabric's grace period)", ErrNoDevice, s.device, gone.Round(100*time.Millisecond), state)
	}
	return 0, nil
}

func (s *Session) drop(tag uint64) {
	s.mu.Lock()
	delete(s.waiters, tag)
	s.mu.Unlock()
}

// collect joins local errors (refused frames first) with the worker's.
func (s *Session) collect(remote []codec.Error) error {
	s.acks.Lock()
	errs := s.acks.refused
	s.acks.refused = nil
	s.acks.Unlock()
	s.mu.Lock()
	errs = append(errs, s.errs...)
	s.errs = nil
	s.mu.Unlock()
	for i := range remote {
		switch remote[i].Code {
		case codec.CodeSessionFreed:
			errs = append(errs, fmt.Errorf("%w: %w", ErrSessionFreed, &remote[i]))
			continue
		case codec.CodeNoDevice:
			errs = append(errs, fmt.Errorf("%w: %w", ErrNoDevice, &remote[i]))
			continue
		}
		errs = append(errs, &remote[i])
	}
	return errors.Join(errs...)
}

// Sync waits until every op queued so far has run, and returns the errors
// reported since the last read or sync.
func (s *Session) Sync(ctx context.Context) error {
	_, err := s.call(ctx, codec.Op{Op: "sync"})
	return err
}

// Checkpoint asks the device to checkpoint every session's tensors after
// the ops queued so far, so that a worker taking the device over replays
// from there. Devices also checkpoint on their own timer.
func (s *Session) Checkpoint() {
	s.enqueue(codec.Op{Op: "checkpoint"}, 0)
}

// Seed sets the session's random seed for the ops queued after it.
func (s *Session) Seed(seed uint64) {
	s.enqueue(codec.Op{Op: "seed", Seed: seed}, 0)
}

// Close frees the session's tensors on the worker, waits for it, and
// returns the errors not yet reported.
func (s *Session) Close(ctx context.Context) error {
	_, err := s.call(ctx, codec.Op{Op: "close"})
	s.abandon()
	return err
}

// abandon stops the session locally.
func (s *Session) abandon() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
	s.c.forget(s)
}

// Apply queues any op of the op set with the given attributes on inputs
// and returns its output. Use it for ops without a method; Op, In and Out
// of op are filled in here.
func (s *Session) Apply(op codec.Op, in ...*Tensor) *Tensor {
	op.In, op.Out = nil, nil
	return s.enqueue(op, 1, in...)
}

// ApplyN is Apply for ops with n outputs, such as split: it mints n
// output ids and returns their tensors in order.
func (s *Session) ApplyN(op codec.Op, n int, in ...*Tensor) []*Tensor {
	op.In, op.Out = nil, nil
	if n < 1 {
		s.fail(fmt.Errorf("%w: %s with %d outputs", ErrInvalidArgument, op.Op, n))
		return nil
	}
	first := s.enqueue(op, n, in...)
	out := make([]*Tensor, n)
	for i := range out {
		out[i] = &Tensor{s: s}
		if first.id != 0 {
			out[i].id = first.id + uint64(i)
		}
	}
	return out
}

// Upload sends raw little-endian bytes of dtype with shape. Tensors over
// the inline limit travel through the object store, named by their SHA-256
// so the same bytes are stored once: the write starts at once, the digest
// is computed beside it, and the op goes out as soon as the digest is
// known, so the worker copies the chunks while the rest are written.
func (s *Session) Upload(ctx context.Context, dtype string, shape []int, data []byte) (*Tensor, error) {
	op := codec.Op{Op: "upload", DType: dtype, Shape: append([]int(nil), shape...)}
	// Inline only what fits a frame under the broker's max_payload.
	if len(data) <= s.c.opts.inlineUpload && int64(len(data))+64<<10 <= s.c.nc.MaxPayload() && !s.record {
		op.Data = data
		return s.enqueue(op, 1), nil
	}
	lanes, err := s.c.transferLanes()
	if err != nil {
		return nil, err
	}
	store := lanes[0]
	meta := map[string]string{"dtype": dtype}
	if s.record {
		// A job's inputs must be complete before it is submitted.
		sum := sha256.Sum256(data)
		op.Object = uploadName(sum)
		if info, err := store.Stat(ctx, op.Object); err == nil && info.Size == int64(len(data)) {
			return s.enqueue(op, 1), nil // stored before, by this or another session
		}
		if _, err := store.Put(ctx, op.Object, data, meta, objectstore.WithSHA256(sum)); err != nil {
			return nil, fmt.Errorf("client: upload %d bytes: %w", len(data), err)
		}
		return s.enqueue(op, 1), nil
	}
	return s.uploadWhileWriting(ctx, lanes, op, data, meta)
}

// uploadName names an upload by its content, so the same bytes uploaded
// twice, by any session, are stored once.
func uploadName(sum [sha256.Size]byte) string { return "upload-" + hex.EncodeToString(sum[:]) }

// uploadWhileWriting sends the op at once, naming the object by an alias
// (upload-<chunk subject token>) and its chunk subject, and writes data,
// so the worker copies the chunks while they are written. A large upload
// goes as pieces, one on each lane, written in parallel (the op says how
// many; each piece is an upload of its own to the object store: alias
// <alias>.<i>, chunk subject <token>-<i>).
func (s *Session) uploadWhileWriting(ctx context.Context, lanes objectstore.Lanes, op codec.Op, data []byte, meta map[string]string) (*Tensor, error) {
	op.NUID = objectstore.NewNUID()
	op.Object = "upload-" + op.NUID
	k := lanes.Pieces(len(data), objectstore.MaxPieces)
	if k > 1 {
		op.Pieces = k
	}
	t := s.enqueue(op, 1)
	s.Flush()
	err := lanes.Each(ctx, k, func(ctx context.Context, store *objectstore.Store, i int) error {
		if k == 1 {
			return writeUpload(ctx, store, op.Object, op.NUID, data, meta)
		}
		lo, hi := objectstore.PieceRange(len(data), k, i)
		return writeUpload(ctx, store, objectstore.PieceName(op.Object, i), objectstore.PieceNUID(op.NUID, i), data[lo:hi], meta)
	})
	if err != nil {
		// The worker is following the aliases: tell it why nothing will come.
		reason := "the client's upload failed: " + err.Error()
		if k > 1 {
			lanes.Abort(context.WithoutCancel(ctx), op.Object, op.NUID, k, reason)
		} else {
			_ = lanes[0].Abort(context.WithoutCancel(ctx), op.Object, op.NUID, reason)
		}
		return nil, fmt.Errorf("client: upload %d bytes: %w", len(data), err)
	}
	return t, nil
}

// writeUpload writes data on the chunk subject nuid, hashing it beside
// the write, names the object by its digest and makes alias a link to it.
// Bytes stored before under that name are not stored again: once the
// digest is known the write asks for the name, stops if it finds those
// bytes, purges its chunks and returns the stored object (see
// objectstore.WithNameFromDigest); and an object named by its content is
// never replaced under its readers.
func writeUpload(ctx context.Context, store *objectstore.Store, alias, nuid string, data []byte, meta map[string]string) error {
	info, err := store.Put(ctx, "", data, meta, objectstore.WithNUID(nuid), objectstore.WithNameFromDigest(uploadName))
	if err != nil {
		return err
	}
	_, err = store.Link(ctx, alias, info.Name)
	return err
}
