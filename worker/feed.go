package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
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
	filter  string
	prefix  string // consumer names: prefix_serial
	handler func(jetstream.Msg, *jetstream.MsgMetadata)
	logf    func(string, ...any)

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

// startFeed creates the first consumer, delivering the frames on filter
// after stream sequence from (all of them when from is 0), and starts the
// loop that re-creates it.
func startFeed(ctx context.Context, js jetstream.JetStream, stream, filter, device string, from uint64, handler func(jetstream.Msg, *jetstream.MsgMetadata), logf func(string, ...any)) (*feed, error) {
	f := &feed{
		js: js, device: device, stream: stream, filter: filter, handler: handler, logf: logf,
		prefix: device + "_" + randomToken(),
		sseq:   from,
		serial: 1,
		reset:  make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if err := f.open(ctx); err != nil {
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
// starting after the last frame handled, and consumes it.
func (f *feed) open(ctx context.Context) error {
	f.mu.Lock()
	serial, from := f.serial, f.sseq
	f.dseq = 0
	f.mu.Unlock()
	cfg := jetstream.ConsumerConfig{
		Name:              fmt.Sprintf("%s_%d", f.prefix, serial),
		DeliverSubject:    nats.NewInbox(),
		FilterSubject:     f.filter,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FlowControl:       true,
		IdleHeartbeat:     feedHeartbeat,
		InactiveThreshold: 30 * time.Second,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from+1
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := f.js.CreateOrUpdatePushConsumer(cctx, f.stream, cfg)
	if err != nil {
		return fmt.Errorf("consumer %s on %s: %w", cfg.Name, f.filter, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) { f.handle(serial, m) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerDeleted) {
				f.renew(serial)
			}
		}))
	if err != nil {
		f.remove(cfg.Name)
		return fmt.Errorf("consume %s on %s: %w", cfg.Name, f.filter, err)
	}
	f.mu.Lock()
	f.current, f.name = cc, cfg.Name
	f.mu.Unlock()
	return nil
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
	f.handler(m, md)
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

// feedResets bounds the tries at a new consumer; between them the wait
// doubles from one second. A device whose consumer cannot be created again
// (seen after a stream leader was killed) is taken over again instead.
const feedResets = 3

// loop re-creates the consumer when asked and ends the feed on Stop or
// when that fails feedResets times.
func (f *feed) loop() {
	defer close(f.done)
	for {
		select {
		case <-f.stop:
			f.end(nil)
			return
		case <-f.reset:
		}
		f.mu.Lock()
		old, name := f.current, f.name
		f.mu.Unlock()
		old.Stop()
		f.remove(name)
		var err error
		wait := time.Second
		for try := 1; ; try++ {
			if err = f.open(context.Background()); err == nil {
				break
			}
			f.logf("worker: %s: %v (try %d of %d)", f.device, err, try, feedResets)
			if try == feedResets {
				f.end(err)
				return
			}
			select {
			case <-f.stop:
				f.end(nil)
				return
			case <-time.After(wait):
			}
			wait *= 2
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = f.js.DeleteConsumer(ctx, f.stream, name)
}
