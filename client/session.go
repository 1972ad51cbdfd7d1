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
// sync or close) is published at once, in a frame whose number and size
// are returned (see publishLocked); any other is published when the frame
// is full or on the timer.
func (s *Session) queueLocked(op codec.Op, waited bool) (frame uint64, size int) {
	if s.record {
		s.queued = append(s.queued, op)
		return 0, 0
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
		return 0, 0
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(s.c.opts.flushDelay, s.flushTimer)
	}
	return 0, 0
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

// publishLocked publishes the queued ops as one frame and returns its
// number and size, or 0 when nothing was published (the reason is in
// s.errs).
//
// A frame that no call waits on is published asking for the stream's
// acknowledgement (asynchronously, up to the publish window in flight):
// that is how a refusal of it is learnt (see published). A frame that a
// call waits on (waited) carries its read, sync or close, and the worker's
// answer confirms that the stream stored it; it goes out as a plain core
// publish, which JetStream stores all the same, without an acknowledgement
// that would wake this process while the worker works. If the answer is
// late, call checks that the stream holds the frame (see check). Both kinds
// go out on the one connection, so the stream stores them in the order they
// were published.
func (s *Session) publishLocked(waited bool) (frame uint64, size int) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if len(s.queued) == 0 || s.record {
		return 0, 0
	}
	data, err := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: s.queued})
	s.queued = s.queued[:0]
	s.qbytes = 0
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("client: encode frame: %w", err))
		return 0, 0
	}
	n := s.frames + 1
	msg := &nats.Msg{Subject: s.subject, Data: data, Header: nats.Header{
		subjects.HeaderReply: []string{s.inbox},
		subjects.HeaderFrame: []string{strconv.FormatUint(n, 10)},
	}}
	if waited {
		err = s.c.nc.PublishMsg(msg)
	} else {
		_, err = s.c.js.PublishMsgAsync(msg)
	}
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("%w: frame %d of %d bytes on %s: %v", ErrPublish, n, len(data), s.subject, err))
		return 0, 0
	}
	s.frames = n
	if !waited {
		s.acksSent++
	}
	// The size the stream's limits apply to: the data and the headers
	// ("NATS/1.0\r\n", "key: value\r\n" each, "\r\n").
	hdr := 12 + 4 + len(subjects.HeaderReply) + len(s.inbox) + 4 + len(subjects.HeaderFrame) + len(msg.Header[subjects.HeaderFrame][0])
	return n, len(data) + hdr
}

// published records the stream's answer to a frame published asking for
// an acknowledgement: a refusal is returned by the next read or sync.
func (s *Session) published(m *nats.Msg, err error) {
	s.acks.Lock()
	defer s.acks.Unlock()
	s.acks.done++
	if err != nil {
		s.acks.refused = append(s.acks.refused, fmt.Errorf("%w: frame %s of %d bytes on %s: %v", ErrPublish, m.Header.Get(subjects.HeaderFrame), len(m.Data), m.Subject, err))
	}
	if s.acks.wake != nil {
		close(s.acks.wake)
		s.acks.wake = nil
	}
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
// come back joined. The frame carrying op is published without asking for
// the stream's acknowledgement (see publishLocked); if no answer has come
// after the frame-check interval, call asks the stream whether it holds the
// frame, again at doubling intervals until it does, and fails with
// ErrPublish when it keeps not holding it (see check).
func (s *Session) call(ctx context.Context, op codec.Op) (*codec.Result, error) {
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
	frame, size := s.queueLocked(op, true)
	acks := s.acksSent
	if frame == 0 {
		delete(s.waiters, op.Tag)
		s.mu.Unlock()
		return nil, s.collect(nil)
	}
	s.mu.Unlock()
	wait := s.c.opts.frameCheck
	check := time.NewTimer(wait)
	defer check.Stop()
	start := time.Now()
	misses := 0        // checks that found the frame not in the stream
	var down time.Time // since when the device has had no live worker
	for {
		select {
		case r := <-ch:
			s.settle(ctx, acks)
			return r, s.collect(r.Errors)
		case m := <-s.replies:
			s.route(m)
		case <-check.C:
			state, why := s.check(ctx, frame, size)
			if state == frameStored {
				// The answer comes when the worker gets to the frame (or
				// a worker taking the device over replays it), unless no
				// worker serves the device any more.
				if err := s.deviceGone(ctx, &down); err != nil {
					s.drop(op.Tag)
					return nil, errors.Join(s.collect(nil), fmt.Errorf("client: %s on %s: %w", op.Op, s.device, err))
				}
				wait = min(2*wait, maxFrameCheck, max(s.c.opts.deviceTimeout/2, s.c.opts.frameCheck))
				check.Reset(wait)
				continue
			}
			if state != frameUnknown {
				// A frame purged by a checkpoint is no longer in the
				// stream either, but the worker answered it before the
				// purge, so the answer reached the connection before the
				// check's did: look for it first. Then check again before
				// calling the frame lost (another goroutine may be routing
				// the answer): twice when a limit of the stream explains
				// the absence, five times over about 30 intervals when
				// nothing does (the stream may be slow to store it).
				if r := s.drain(ch); r != nil {
					s.settle(ctx, acks)
					return r, s.collect(r.Errors)
				}
				if misses++; state == frameRefused && misses >= 2 || misses >= 5 {
					s.drop(op.Tag)
					return nil, errors.Join(s.collect(nil), fmt.Errorf("%w: %s on %s: no answer after %v, and %v", ErrPublish, op.Op, s.device, time.Since(start).Round(time.Millisecond), why))
				}
			}
			wait = min(2*wait, maxFrameCheck)
			check.Reset(wait)
		case <-ctx.Done():
			s.drop(op.Tag)
			return nil, fmt.Errorf("client: %s on %s: %w", op.Op, s.device, ctx.Err())
		}
	}
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

// maxFrameCheck bounds the wait between two checks of one frame.
const maxFrameCheck = 10 * time.Second

// frameState is what a check learnt of a frame.
type frameState int

const (
	frameUnknown frameState = iota // the check failed (no JetStream for now)
	frameStored
	frameRefused // not in the stream, and one of its limits says why
	frameMissing // not in the stream, and nothing says why
)

// check asks the stream whether it holds frame n (of size bytes) of the
// session; when it does not, why says so. The stream stores a session's
// frames in the order they were published, so it holds frame n if the
// last frame it holds on the session's subject is n or later.
func (s *Session) check(ctx context.Context, n uint64, size int) (state frameState, why error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.c.opts.frameCheck, 2*time.Second))
	defer cancel()
	js := s.c.js
	name, err := js.StreamNameBySubject(ctx, s.subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return frameRefused, fmt.Errorf("no stream captures %s", s.subject)
	} else if err != nil {
		return frameUnknown, nil
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return frameUnknown, nil
	}
	var last uint64
	m, err := stream.GetLastMsgForSubject(ctx, s.subject)
	switch {
	case err == nil:
		last, _ = strconv.ParseUint(m.Header.Get(subjects.HeaderFrame), 10, 64)
		if last >= n {
			return frameStored, nil
		}
	case errors.Is(err, jetstream.ErrMsgNotFound):
	default:
		return frameUnknown, nil
	}
	info := stream.CachedInfo()
	cfg, st := info.Config, info.State
	what := fmt.Sprintf("stream %s does not hold frame %d (%d bytes) of the session", name, n, size)
	if last > 0 {
		what += fmt.Sprintf(" (the last it holds is frame %d)", last)
	}
	switch {
	case cfg.Sealed:
		return frameRefused, fmt.Errorf("%s: the stream is sealed", what)
	case cfg.MaxMsgSize > 0 && size > int(cfg.MaxMsgSize):
		return frameRefused, fmt.Errorf("%s: over its max message size of %d bytes", what, cfg.MaxMsgSize)
	case cfg.Discard == jetstream.DiscardNew && cfg.MaxBytes > 0 && st.Bytes+uint64(size) > uint64(cfg.MaxBytes):
		return frameRefused, fmt.Errorf("%s: the stream is full (%d of %d bytes, discard new)", what, st.Bytes, cfg.MaxBytes)
	case cfg.Discard == jetstream.DiscardNew && cfg.MaxMsgs > 0 && st.Msgs >= uint64(cfg.MaxMsgs):
		return frameRefused, fmt.Errorf("%s: the stream is full (%d of %d messages, discard new)", what, st.Msgs, cfg.MaxMsgs)
	}
	return frameMissing, fmt.Errorf("%s: it was refused for a reason its limits do not show, lost with a broken connection, or is still not stored", what)
}

// deviceGone reads the device's registry entry and returns an error
// wrapping ErrNoDevice once it has shown no live worker (serving, with a
// recent heartbeat) since *down for longer than the device timeout. A
// registry it cannot read says nothing.
func (s *Session) deviceGone(ctx context.Context, down *time.Time) error {
	if s.c.opts.deviceTimeout <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, max(s.c.opts.frameCheck, 2*time.Second))
	defer cancel()
	kv, err := s.c.js.KeyValue(ctx, s.c.names.CtrlBucket())
	if err != nil {
		return nil
	}
	e, err := kv.Get(ctx, subjects.DeviceKey(s.device))
	now := time.Now()
	var d Device
	switch {
	case err == nil && json.Unmarshal(e.Value(), &d) == nil && Live(d, now):
		*down = time.Time{}
		return nil
	case err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted):
		return nil
	}
	if down.IsZero() {
		*down = now
		return nil
	}
	if gone := now.Sub(*down); gone > s.c.opts.deviceTimeout {
		state := "not registered"
		if d.Name != "" {
			state = fmt.Sprintf("%s, last heartbeat %v ago", d.State, now.Sub(d.Beat).Round(100*time.Millisecond))
		}
		return fmt.Errorf("%w: no worker has served %s for %v (%s); the frame stays in the stream for a worker that takes the device", ErrNoDevice, s.device, gone.Round(100*time.Millisecond), state)
	}
	return nil
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
		if remote[i].Code == codec.CodeSessionFreed {
			errs = append(errs, fmt.Errorf("%w: %w", ErrSessionFreed, &remote[i]))
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
	if len(data) <= s.c.opts.inlineUpload && !s.record {
		op.Data = data
		return s.enqueue(op, 1), nil
	}
	store, err := s.c.objects()
	if err != nil {
		return nil, err
	}
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
	return s.uploadWhileWriting(ctx, store, op, data, meta)
}

// uploadName names an upload by its content, so the same bytes uploaded
// twice, by any session, are stored once.
func uploadName(sum [sha256.Size]byte) string { return "upload-" + hex.EncodeToString(sum[:]) }

// uploadWhileWriting sends the op at once, naming the object by an alias
// (upload-<chunk subject token>) and its chunk subject, and writes data,
// hashing it beside the write, so the worker copies the chunks while they
// are written. The data object is named by its digest; once the digest is
// known, the write either finds those bytes stored before (it stops, its
// chunks are purged) or finishes, and in both cases the client makes the
// alias a link to the object named by the digest.
func (s *Session) uploadWhileWriting(ctx context.Context, store *objectstore.Store, op codec.Op, data []byte, meta map[string]string) (*Tensor, error) {
	op.NUID = objectstore.NewNUID()
	op.Object = "upload-" + op.NUID
	// stored reports whether the digest's object was stored before, by
	// this or another session. When it was, the write goes on under a
	// name of its own (soon abandoned): writing the meta over the stored
	// object would replace it and purge the chunks a worker may be reading.
	type digestName struct {
		name   string
		stored bool
	}
	named := make(chan digestName, 1)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := store.Put(pctx, "", data, meta, objectstore.WithNUID(op.NUID), objectstore.WithNameFromDigest(func(sum [sha256.Size]byte) string {
			name := uploadName(sum)
			info, err := store.Stat(pctx, name)
			stored := err == nil && info.Size == int64(len(data))
			named <- digestName{name, stored}
			if stored {
				return "upload-dup-" + op.NUID
			}
			return name
		}))
		done <- err
	}()
	t := s.enqueue(op, 1)
	s.Flush()
	fail := func(err error) (*Tensor, error) {
		// The worker is following the alias: tell it why nothing will come.
		_ = store.Abort(context.WithoutCancel(ctx), op.Object, op.NUID, "the client's upload failed: "+err.Error())
		return nil, fmt.Errorf("client: upload %d bytes: %w", len(data), err)
	}
	var dn digestName
	select {
	case dn = <-named:
	case err := <-done:
		return fail(err)
	}
	// Two writes of the same bytes at once both find nothing stored: the
	// later one stops when it learns the earlier is, and keeps it (an
	// object named by its content is never replaced under its readers).
	name := dn.name
	if dn.stored {
		// Stored before, by this or another session: stop writing, and
		// drop what was written if the write ended first.
		cancel()
		if err := <-done; err == nil {
			_ = store.Delete(ctx, "upload-dup-"+op.NUID)
		}
	} else if err := <-done; err != nil {
		return fail(err)
	}
	if _, err := store.Link(ctx, op.Object, name); err != nil {
		return fail(err)
	}
	return t, nil
}
