package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// feed delivers one device's frames to a handler in stream order, from a
// push consumer of the ops stream that it creates and, after a gap in the
// consumer's sequence, missing heartbeats or the consumer's deletion,
// creates again after the last frame handled.
//
// It does what the ordered consumer of nats.go's jetstream package does,
// over a push consumer and with the handler called on the subscription's
// own goroutine: a pull consumer read through an iterator hands every
// frame to another goroutine and answers pull requests, which cost a round
// trip 2 to 3 us in one process and 5 to 7 us across processes (see
// BENCHMARKS.md). A long frame does not count as missing heartbeats: the
// push subscription stops its heartbeat timer while the handler runs. Flow
// control keeps what the server pushes ahead of the handler under 32 MiB
// (and one frame), inside the subscription's 64 MiB pending limit; a frame
// dropped past it would show as a gap and start a new consumer.
type feed struct {
	js      jetstream.JetStream
	device  string
	stream  string
	filters []string
	prefix  string // consumer names: prefix_serial
	handler func(jetstream.Msg, *jetstream.MsgMetadata)
	logf    func(string, ...any)
	m       *metrics // the device's: stalled, renewals, pending

	// lastAt is when a frame last came (or the consumer was created),
	// Unix ns; busy is set while the handler runs (see watch).
	lastAt atomic.Int64
	busy   atomic.Bool
	// asked counts the times watch asked the server about the consumer.
	asked atomic.Int64
	tries int // consumers created, for unique names; loop only
	// again is the consumer a try that timed out asked for, asked for
	// again by the next try; loop only.
	again struct{ name, inbox string }
	// reconnects is the connection's reconnect count when the loop last
	// looked (see moved); loop only.
	reconnects uint64

	// deliver is held while a frame is handled, so that frames from an
	// old consumer and its successor never overlap or cross.
	deliver sync.Mutex

	mu      sync.Mutex
	serial  int    // the current consumer's; older ones' frames are dropped
	dseq    uint64 // its last consumer sequence handled
	sseq    uint64 // the last stream sequence handled, by any consumer
	current jetstream.ConsumeContext
	name    string // the current consumer
	halted  bool   // stopped or lost: no frame is handled any more

	reset chan struct{} // asks the loop for a new consumer (buffered, 1)
	stop  chan struct{}
	once  sync.Once
	done  chan struct{} // closed when the loop has ended and no frame runs
	err   error         // why it ended: nil after Stop, else the consumer lost for good
}

// feedHeartbeat is the consumer's idle heartbeat: a consumer lost with its
// server (a cluster node killed) is noticed after two of them.
const feedHeartbeat = time.Second

// feedStall is how long the feed goes without a frame before it asks the
// server about its consumer (see watch). A consumer that has frames
// pending and delivers none for that long (its flow control stalled:
// nats.go's push consumer does not answer the stalled heartbeat; its node
// cut off without its heartbeats stopping) is created again.
const feedStall = 2 * time.Second

// startFeed creates the first consumer, delivering the frames on filter
// after stream sequence from (all of them when from is 0), and starts the
// loop that re-creates it.
func startFeed(ctx context.Context, js jetstream.JetStream, stream string, filters []string, device string, from uint64, handler func(jetstream.Msg, *jetstream.MsgMetadata), m *metrics, logf func(string, ...any)) (*feed, error) {
	f := &feed{
		js: js, device: device, stream: stream, filters: filters, handler: handler, logf: logf, m: m,
		prefix: device + "_" + randomToken(),
		sseq:   from,
		serial: 1,
		reset:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	f.reconnects = js.Conn().Stats().Reconnects
	if err := f.open(ctx, feedCreateTimeout); err != nil {
		return nil, err
	}
	go f.loop()
	return f, nil
}

// Stop ends the feed without waiting; Done is closed once no frame runs.
func (f *feed) Stop() { f.once.Do(func() { close(f.stop) }) }

// Done is closed when the feed has ended: after Stop, or when its consumer
// could not be created again (Err says why).
func (f *feed) Done() <-chan struct{} { return f.done }

// Err is why the feed ended: nil after Stop. Read it after Done.
func (f *feed) Err() error { return f.err }

// open creates the consumer of the current serial (renew moved it on),
// starting after the last frame handled, and consumes it, giving the
// server timeout to create it.
func (f *feed) open(ctx context.Context, timeout time.Duration) error {
	f.mu.Lock()
	serial, from := f.serial, f.sseq
	f.dseq = 0
	f.mu.Unlock()
	// A name of its own each consumer. A try that timed out may have been
	// made all the same: the next one asks for the same consumer again
	// (name, delivery subject and start), which the server then answers
	// with the one it made, not a second one.
	name, inbox := f.again.name, f.again.inbox
	f.again.name, f.again.inbox = "", ""
	if name == "" {
		f.tries++
		name, inbox = fmt.Sprintf("%s_%d", f.prefix, f.tries), nats.NewInbox()
	}
	cfg := jetstream.ConsumerConfig{
		Name:              name,
		DeliverSubject:    inbox,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FlowControl:       true,
		IdleHeartbeat:     feedHeartbeat,
		InactiveThreshold: 30 * time.Second,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if len(f.filters) == 1 {
		cfg.FilterSubject = f.filters[0]
	} else {
		cfg.FilterSubjects = f.filters
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := f.js.CreateOrUpdatePushConsumer(cctx, f.stream, cfg)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			f.again.name, f.again.inbox = name, inbox
		}
		return fmt.Errorf("consumer %s on %s: %w", cfg.Name, strings.Join(f.filters, " "), err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) { f.handle(serial, m) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				f.renew(serial)
			}
		}))
	if err != nil {
		f.remove(cfg.Name)
		return fmt.Errorf("consume %s on %s: %w", cfg.Name, strings.Join(f.filters, " "), err)
	}
	f.mu.Lock()
	f.current, f.name = cc, cfg.Name
	f.mu.Unlock()
	f.lastAt.Store(time.Now().UnixNano())
	return nil
}

// feedCreateTimeout bounds one try at creating a consumer.
const feedCreateTimeout = 3 * time.Second

// feedQuickTry bounds each try at creating the consumer again during
// the first feedQuickFor. A consumer lost with its node is often lost
// with JetStream's meta leader, which creates consumers: a request sent
// before the others have elected a new one (1.5 to 3 s after the node
// died with the broker's raft timers, 4 to 9 s with nats-server's own)
// gets no answer at all, and the next try should go soon after the
// election, not a whole feedCreateTimeout after the request. Later tries
// get feedCreateTimeout, for a meta leader that answers, but slowly (a
// try that timed out is asked for again, so a slow answer does not make
// a consumer for every try).
const (
	feedQuickTry = time.Second
	feedQuickFor = 10 * time.Second
)

// createTimeout bounds a try at creating the consumer again, made
// elapsed after the first.
func createTimeout(elapsed time.Duration) time.Duration {
	if elapsed < feedQuickFor {
		return feedQuickTry
	}
	return feedCreateTimeout
}

// handle runs one frame of consumer serial if it is the next one, handing
// the handler its delivery metadata.
func (f *feed) handle(serial int, m jetstream.Msg) {
	md, err := m.Metadata()
	f.deliver.Lock()
	defer f.deliver.Unlock()
	f.mu.Lock()
	if f.halted || serial != f.serial {
		f.mu.Unlock()
		return
	}
	if err != nil || md.Sequence.Consumer != f.dseq+1 {
		f.mu.Unlock()
		f.renew(serial) // a frame went missing: start again after the last one
		return
	}
	f.dseq, f.sseq = md.Sequence.Consumer, md.Sequence.Stream
	f.mu.Unlock()
	f.busy.Store(true)
	f.m.stalled.Store(false)
	f.handler(m, md)
	f.lastAt.Store(time.Now().UnixNano())
	f.busy.Store(false)
}

// renew asks for a new consumer in place of consumer serial, once.
func (f *feed) renew(serial int) {
	f.mu.Lock()
	current := serial == f.serial
	if current {
		f.serial++ // drop whatever the old consumer still delivers
	}
	f.mu.Unlock()
	if current {
		select {
		case f.reset <- struct{}{}:
		default:
		}
	}
}

// feedRecreate bounds the time the feed tries to create its consumer
// again, with tries from feedRetryMin doubling to feedRetryMax apart (a
// try that timed out waited its part already), riding out a leader
// election of the stream or of JetStream. A device whose consumer cannot
// be created again in that time is taken over again instead.
const (
	feedRecreate  = 30 * time.Second
	feedRetryMin  = 100 * time.Millisecond
	feedRetryMax  = 2 * time.Second
	feedDeleteMax = time.Second
)

// loop re-creates the consumer when asked, watches it for stalls, and
// ends the feed on Stop or when it cannot be created again.
func (f *feed) loop() {
	defer close(f.done)
	tick := time.NewTicker(feedHeartbeat)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			f.end(nil)
			return
		case <-tick.C:
			f.watch(f.moved())
			continue
		case <-f.reset:
		}
		f.m.renewals.Add(1)
		f.mu.Lock()
		old, name := f.current, f.name
		f.mu.Unlock()
		old.Stop()
		var err error
		wait, start := feedRetryMin, time.Now()
		for try := 1; ; try++ {
			began := time.Now()
			if err = f.open(context.Background(), createTimeout(began.Sub(start))); err == nil {
				if try > 1 {
					f.logf("worker: %s: consumer created again after %d tries in %v", f.device, try, time.Since(start).Round(time.Millisecond))
				}
				// The old consumer goes once the new one runs: its node
				// may be the one that died, and a delete sent there gets
				// no answer before feedDeleteMax.
				f.remove(name)
				break
			}
			if try == 1 || try%5 == 0 {
				f.logf("worker: %s: %v (try %d; trying for %v)", f.device, err, try, feedRecreate)
			}
			if time.Since(start) > feedRecreate {
				f.end(err)
				return
			}
			select {
			case <-f.stop:
				f.end(nil)
				return
			case <-time.After(wait - time.Since(began)):
			}
			wait = min(2*wait, feedRetryMax)
		}
	}
}

// moved reports whether the connection reconnected since the loop last
// looked. Frames the consumer pushed while it moved to another server
// (its server killed) are lost on the way, and nothing else shows it
// before the next frame comes, which the client may not send before its
// read, in the lost frame, is answered.
func (f *feed) moved() bool {
	n := f.js.Conn().Stats().Reconnects
	moved := n != f.reconnects
	f.reconnects = n
	return moved
}

// watch asks the server about the consumer when no frame has come for
// feedStall, or the connection moved, and none is running: one that
// cannot be reached, has frames pending that it does not deliver, or
// delivered frames that never came, is created again after the last
// frame handled.
func (f *feed) watch(moved bool) {
	if f.busy.Load() || !moved && time.Since(time.Unix(0, f.lastAt.Load())) < feedStall {
		return
	}
	f.mu.Lock()
	cc, name, serial, dseq, sseq := f.current, f.name, f.serial, f.dseq, f.sseq
	f.mu.Unlock()
	if cc == nil {
		return
	}
	// After a move the consumer's own server may be the one that died:
	// the question then goes unanswered, and the missing heartbeats call
	// for a new consumer 2 s after the last, which waits for this.
	timeout := 2 * feedHeartbeat
	if moved {
		timeout = feedHeartbeat
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	f.asked.Add(1)
	c, err := f.js.PushConsumer(ctx, f.stream, name)
	var info *jetstream.ConsumerInfo
	if err == nil {
		info = c.CachedInfo()
	}
	switch {
	case err != nil:
		f.logf("worker: %s: consumer %s: %v; creating it again", f.device, name, err)
	// By the consumer's own sequence: its delivered stream sequence moves
	// past the other devices' frames it skips, which never come here.
	case info.NumPending > 0 && info.Delivered.Consumer <= dseq:
		f.m.pending.Store(info.NumPending)
		f.m.stalled.Store(true)
		f.logf("worker: %s: consumer %s has %d frames pending and delivered none for %v; creating it again", f.device, name, info.NumPending, feedStall)
	case info.Delivered.Consumer > dseq:
		f.m.pending.Store(info.NumPending + info.Delivered.Consumer - dseq)
		f.m.stalled.Store(true)
		f.logf("worker: %s: consumer %s delivered %d frames, up to sequence %d, but %d came (the last at sequence %d); creating it again", f.device, name, info.Delivered.Consumer, info.Delivered.Stream, dseq, sseq)
	default:
		f.m.pending.Store(0)
		f.lastAt.Store(time.Now().UnixNano()) // ask again after feedStall
		return
	}
	f.lastAt.Store(time.Now().UnixNano())
	f.renew(serial)
}

// end stops the current consumer and waits for the frame in hand.
func (f *feed) end(err error) {
	f.deliver.Lock() // after the frame in hand, if any
	f.mu.Lock()
	f.halted, f.err = true, err
	cc, name := f.current, f.name
	f.mu.Unlock()
	f.deliver.Unlock()
	if cc != nil {
		cc.Stop()
	}
	f.remove(name)
}

// randomToken tells one feed's consumers from another's.
func randomToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// remove deletes a consumer the feed no longer reads; one that cannot be
// reached now goes by its inactive threshold.
func (f *feed) remove(name string) {
	if name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), feedDeleteMax)
	defer cancel()
	_ = f.js.DeleteConsumer(ctx, f.stream, name)
}
