package client

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
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
	last   jetstream.PubAckFuture
	// record: a job being built; ops are kept, never sent (see NewJob).
	record bool
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
	s.queueLocked(op)
	return &Tensor{s: s, id: first}
}

func (s *Session) queueLocked(op codec.Op) {
	if s.record {
		s.queued = append(s.queued, op)
		return
	}
	size := 48 + len(op.Data) + 8*(len(op.In)+len(op.Out)+len(op.Shape)+len(op.Axes)+len(op.Perm)+len(op.Values))
	if len(s.queued) > 0 && (len(s.queued) >= s.c.opts.maxFrameOps || s.qbytes+size > s.c.opts.maxFrameBytes) {
		s.flushLocked()
	}
	s.queued = append(s.queued, op)
	s.qbytes += size
	if len(s.queued) >= s.c.opts.maxFrameOps || s.qbytes >= s.c.opts.maxFrameBytes {
		s.flushLocked()
		return
	}
	if s.timer == nil {
		s.timer = time.AfterFunc(s.c.opts.flushDelay, s.flushTimer)
	}
}

func (s *Session) flushTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = nil
	s.flushLocked()
}

// flushLocked publishes the queued ops as one frame.
func (s *Session) flushLocked() {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if len(s.queued) == 0 || s.record {
		return
	}
	data, err := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: s.queued})
	s.queued = s.queued[:0]
	s.qbytes = 0
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("client: encode frame: %w", err))
		return
	}
	msg := &nats.Msg{Subject: s.subject, Data: data, Header: nats.Header{subjects.HeaderReply: []string{s.inbox}}}
	f, err := s.c.js.PublishMsgAsync(msg)
	if err != nil {
		s.errs = append(s.errs, fmt.Errorf("%w: %v", ErrPublish, err))
		return
	}
	s.last = f
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
	s.queueLocked(op)
	s.flushLocked()
	last := s.last
	s.mu.Unlock()
	var ackErr <-chan error
	if last != nil {
		ackErr = last.Err()
	}
	for {
		select {
		case r := <-ch:
			return r, s.collect(r.Errors)
		case m := <-s.replies:
			s.route(m)
		case err := <-ackErr:
			s.drop(op.Tag)
			return nil, errors.Join(s.collect(nil), fmt.Errorf("%w: %v", ErrPublish, err))
		case <-ctx.Done():
			s.drop(op.Tag)
			return nil, fmt.Errorf("client: %s on %s: %w", op.Op, s.device, ctx.Err())
		}
	}
}

func (s *Session) drop(tag uint64) {
	s.mu.Lock()
	delete(s.waiters, tag)
	s.mu.Unlock()
}

// collect joins local errors with the worker's.
func (s *Session) collect(remote []codec.Error) error {
	s.mu.Lock()
	errs := s.errs
	s.errs = nil
	s.mu.Unlock()
	for i := range remote {
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
// so the same bytes are stored once.
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
	sum := sha256.Sum256(data)
	name := "upload-" + hex.EncodeToString(sum[:])
	if info, err := store.Stat(ctx, name); err != nil || info.Size != int64(len(data)) {
		if _, err := store.Put(ctx, name, data, map[string]string{"dtype": dtype}); err != nil {
			return nil, fmt.Errorf("client: upload %d bytes: %w", len(data), err)
		}
	}
	op.Object = name
	return s.enqueue(op, 1), nil
}
