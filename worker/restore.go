package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// A takeover restores the last checkpoint lazily: the manifest, the
// sessions and the tensors of 64 KiB or less (carried in the manifest) are
// in place before the device serves, and every larger tensor is allocated
// there too, but its bytes are read from its object in the background, by
// restoreReaders goroutines, while the device already runs frames. An op
// that uses a tensor still unread waits for it, reading it itself when no
// reader has started on it, so the first answer after a takeover waits
// only for the tensors it needs (the stall of a device holding gigabytes
// is then the lease TTL plus a few objects, not the whole restore).
//
// A lazily restored tensor is named by its digest in the checkpoint
// bookkeeping, so a checkpoint taken meanwhile names it without reading
// it. Its buffer is pinned while unread: a free waits for the reader (see
// memory.go), and a tensor freed before it is read is not read. A read
// that fails (the object gone or its digest wrong) leaves the device's
// state wrong: the device then sends no more results, takes no checkpoint
// and takes itself over again (restore and replay), as after a lost
// consumer.

// restoreReaders is how many tensor objects a restore reads at once.
const restoreReaders = 4

// lazyTensor is one tensor of a restore still to be read.
type lazyTensor struct {
	t       *kernels.Tensor
	session string // its session's key
	id      uint64
	read    func(ctx context.Context) error
	taken   atomic.Bool // a reader (or the device loop) is on it or done with it
	// dropped: freed before it was read; it need not be.
	dropped atomic.Bool
	done    chan struct{}
	err     error // set before done is closed
	// stop ends a reader's read of it, for the device loop (under
	// lazyRestore.mu; nil when no reader is on it).
	stop context.CancelFunc
	// soon: a frame to replay reads it (under lazyRestore.mu).
	soon bool
}

// lazyKey names a restored tensor: its session's key and its id.
type lazyKey struct {
	session string
	id      uint64
}

// lazyRestore is the background read of a restore's tensors. tensors is
// the device loop's index of the unread ones; the rest is shared with the
// readers.
type lazyRestore struct {
	queue   []*lazyTensor
	tensors map[*kernels.Tensor]*lazyTensor // device loop only
	byKey   map[lazyKey]*lazyTensor         // read-only once started
	failed  atomic.Pointer[lazyFailure]
	left    atomic.Int64 // tensors not yet done
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	// The tensors that the frames to replay read (soon) are read first,
	// in the order the replay reads them (see prefetchReplay). While the
	// device loop waits for a tensor (want, urgent > 0), no reader starts
	// on another unless it is soon, and the reads of others that are not
	// are stopped and put back (again), so that the one it waits for and
	// those it will wait for next have the bandwidth. wake is signalled
	// when urgent goes back to 0, when soon grows and when the readers
	// stop.
	mu     sync.Mutex
	wake   *sync.Cond
	next   int
	again  []*lazyTensor
	soon   []*lazyTensor
	urgent int
	want   *lazyTensor
}

type lazyFailure struct {
	id  uint64
	err error
}

// take returns the next tensor for a reader and the context of its read,
// or nil when none is left or ctx ended: the next one a replayed frame
// reads, else (unless the loop waits) the next in the queue.
func (lr *lazyRestore) take(ctx context.Context) (*lazyTensor, context.Context, context.CancelFunc) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	for {
		if ctx.Err() != nil {
			return nil, nil, nil
		}
		var lt *lazyTensor
		switch {
		case len(lr.soon) > 0:
			lt, lr.soon = lr.soon[0], lr.soon[1:]
		case lr.urgent > 0:
			lr.wake.Wait()
			continue
		case len(lr.again) > 0:
			n := len(lr.again)
			lt, lr.again = lr.again[n-1], lr.again[:n-1]
		case lr.next < len(lr.queue):
			lt = lr.queue[lr.next]
			lr.next++
		default:
			return nil, nil, nil
		}
		if !lt.taken.CompareAndSwap(false, true) {
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		lt.stop = cancel
		return lt, rctx, cancel
	}
}

// prioritize moves lts, the tensors the replay will read in that order,
// ahead of the rest, and returns how many it moved (those not already
// moved or taken).
func (lr *lazyRestore) prioritize(lts []*lazyTensor) int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	n := 0
	for _, lt := range lts {
		if !lt.soon && !lt.taken.Load() {
			lt.soon = true
			lr.soon = append(lr.soon, lt)
			n++
		}
	}
	lr.wake.Broadcast()
	return n
}

// hurry marks the device loop as waiting for want (nil: done waiting).
func (lr *lazyRestore) hurry(want *lazyTensor) {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if want == nil {
		if lr.urgent--; lr.urgent == 0 {
			lr.want = nil
			lr.wake.Broadcast()
		}
		return
	}
	lr.urgent++
	lr.want = want
	for _, lt := range lr.queue {
		if lt != want && lt.stop != nil && !lt.soon {
			lt.stop()
		}
	}
}

// startLazy starts reading the tensors of a restore in the background.
// Device loop only (or before the device serves); the device holds each
// buffer pinned until its tensor is read.
func (d *device) startLazy(queue []*lazyTensor, bytes int64) {
	if len(queue) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	lr := &lazyRestore{queue: queue, tensors: make(map[*kernels.Tensor]*lazyTensor, len(queue)),
		byKey: make(map[lazyKey]*lazyTensor, len(queue)), cancel: cancel}
	lr.wake = sync.NewCond(&lr.mu)
	stopWake := context.AfterFunc(ctx, func() {
		lr.mu.Lock()
		lr.wake.Broadcast()
		lr.mu.Unlock()
	})
	lr.left.Store(int64(len(queue)))
	d.m.restorePending.Store(bytes)
	for _, lt := range queue {
		lr.tensors[lt.t] = lt
		lr.byKey[lazyKey{lt.session, lt.id}] = lt
		d.mem.pin(lt.t.Buf)
	}
	d.lazy = lr
	lr.ctx = ctx
	start := time.Now()
	for range min(restoreReaders, len(queue)) {
		lr.wg.Go(func() {
			for {
				if testHookLazyRead != nil {
					testHookLazyRead(ctx)
				}
				lt, rctx, stop := lr.take(ctx)
				if lt == nil {
					return
				}
				d.readBackground(ctx, lr, lt, rctx, stop)
			}
		})
	}
	d.w.wg.Go(func() {
		lr.wg.Wait()
		stopWake()
		if lr.left.Load() == 0 && lr.failed.Load() == nil {
			el := time.Since(start)
			d.w.logf("worker: %s: restore: read %d tensors (%d bytes) from their objects beside the device in %v (%.0f MB/s)",
				d.cfg.Name, len(queue), bytes, el.Round(time.Millisecond), float64(bytes)/1e6/el.Seconds())
		}
	})
}

// testHookLazyRead, when set (by tests, before a worker starts), runs in
// a background reader before it takes each tensor.
var testHookLazyRead func(ctx context.Context)

// readBackground reads lt on a reader, which took it. A read stopped for
// the device loop is put back, unless the loop now waits for lt itself.
func (d *device) readBackground(ctx context.Context, lr *lazyRestore, lt *lazyTensor, rctx context.Context, stop context.CancelFunc) {
	for {
		var err error
		if !lt.dropped.Load() {
			err = lt.read(rctx)
		}
		stopped := err != nil && rctx.Err() != nil && ctx.Err() == nil && !lt.dropped.Load()
		stop()
		lr.mu.Lock()
		lt.stop = nil
		switch {
		case stopped && lr.want == lt:
			rctx, stop = context.WithCancel(ctx)
			lt.stop = stop
			lr.mu.Unlock()
			continue
		case stopped:
			lt.taken.Store(false)
			lr.again = append(lr.again, lt)
			lr.mu.Unlock()
			return
		}
		lr.mu.Unlock()
		d.finishLazy(ctx, lr, lt, err)
		return
	}
}

// finishLazy ends lt's read with err.
func (d *device) finishLazy(ctx context.Context, lr *lazyRestore, lt *lazyTensor, err error) {
	if err != nil && !lt.dropped.Load() && ctx.Err() == nil {
		lr.failed.CompareAndSwap(nil, &lazyFailure{id: lt.id, err: err})
	}
	lt.err = err
	close(lt.done)
	lr.left.Add(-1)
	d.m.restorePending.Add(-int64(lt.t.Buf.Bytes()))
	d.mem.unpin(lt.t.Buf)
}

// awaitTensor returns once t's bytes are in place: at once unless it is a
// tensor of a restore still being read. Device loop only. An error means
// that the restore failed and the device is taking itself over again.
func (d *device) awaitTensor(t *kernels.Tensor) error {
	lr := d.lazy
	if lr == nil {
		return nil
	}
	lt := lr.tensors[t]
	if lt == nil {
		return nil
	}
	delete(lr.tensors, t)
	lr.hurry(lt)
	defer lr.hurry(nil)
	if lt.taken.CompareAndSwap(false, true) {
		// The loop reads it itself: no reader is on it.
		ctx, cancel := context.WithCancel(context.Background())
		stop := context.AfterFunc(d.w.ctx, cancel)
		var err error
		if !lt.dropped.Load() {
			err = lt.read(ctx)
		}
		d.finishLazy(ctx, lr, lt, err)
		stop()
		cancel()
	} else {
		<-lt.done
	}
	if lt.err != nil {
		d.restoreFailed(lt.err)
		return errRestoreFailed
	}
	return nil
}

// dropLazy notes that t was freed: if it is still to be read, it need
// not be. Device loop only.
func (d *device) dropLazy(t *kernels.Tensor) {
	if lr := d.lazy; lr != nil {
		if lt := lr.tensors[t]; lt != nil {
			lt.dropped.Store(true)
			delete(lr.tensors, t)
		}
	}
}

// checkLazy looks at the background read at housekeeping: a failure makes
// the device take itself over again, and once every tensor is read the
// bookkeeping goes. Device loop only.
func (d *device) checkLazy() {
	lr := d.lazy
	if lr == nil {
		return
	}
	if f := lr.failed.Load(); f != nil {
		d.restoreFailed(fmt.Errorf("tensor %d: %w", f.id, f.err))
		return
	}
	if lr.left.Load() == 0 {
		lr.cancel() // the readers are done; the replay's scan need not be
		lr.wg.Wait()
		d.lazy = nil
	}
}

// stopLazy abandons the background read and waits for its readers; the
// tensors never read are unpinned. Device loop only, or after it stopped.
func (d *device) stopLazy() {
	lr := d.lazy
	if lr == nil {
		return
	}
	lr.cancel()
	lr.wg.Wait()
	for _, lt := range lr.queue {
		if lt.taken.CompareAndSwap(false, true) {
			lt.err = context.Canceled
			close(lt.done)
			lr.left.Add(-1)
			d.mem.unpin(lt.t.Buf)
		}
	}
	d.lazy = nil
	d.m.restorePending.Store(0)
	d.drainFrees()
}

// restoreFailed marks the device's state as wrong after a failed read of
// a restored tensor: no result is sent and no checkpoint taken from here
// on, and the loop stops so that the device is taken over again. Device
// loop only.
func (d *device) restoreFailed(err error) {
	if d.broken {
		return
	}
	d.broken = true
	d.w.logf("worker: %s: restore: a tensor could not be read (%v); taking the device over again", d.cfg.Name, err)
	d.halt()
}

// errRestoreFailed: a tensor of the last restore could not be read; the
// device is taking itself over again.
var errRestoreFailed = errors.New("worker: a restored tensor could not be read")

// replayScanMax bounds the frames prefetchReplay reads, and replayScanTime
// the time it takes.
const (
	replayScanMax  = 100_000
	replayScanTime = time.Minute
)

// startPrefetch starts prefetchReplay beside the background read, if
// there is one. Device loop only (or before the device serves).
func (d *device) startPrefetch(from uint64) {
	if lr := d.lazy; lr != nil {
		lr.wg.Go(func() { d.prefetchReplay(lr.ctx, lr, from) })
	}
}

// prefetchReplay reads the frames the device replays after a takeover
// (those after sequence from, up to the last when it starts) and moves
// the restored tensors their ops read ahead of the rest of the background
// read, in the order of the replay: the readers fetch them several at
// once ahead of the loop, instead of the loop reading each when it gets
// there. It only reorders the reads: a frame it cannot read or decode
// changes nothing but the order.
func (d *device) prefetchReplay(ctx context.Context, lr *lazyRestore, from uint64) {
	ctx, cancel := context.WithTimeout(ctx, replayScanTime)
	defer cancel()
	w := d.w
	stream, err := w.js.Stream(ctx, w.names.OpsStream())
	if err != nil {
		return
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: d.opsFilters(),
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:    from + 1,
	})
	if err != nil {
		return
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumPending == 0 {
		return
	}
	left := int(min(info.NumPending, replayScanMax))
	frames, tensors := left, 0
	var frame codec.Frame
	for left > 0 {
		batch, err := cons.Fetch(min(left, 256), jetstream.FetchContext(ctx))
		if err != nil {
			return
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if needed := lr.neededBy(w.names, m.Subject(), m.Headers().Get(subjects.HeaderContentType), m.Data(), &frame); len(needed) > 0 {
				tensors += lr.prioritize(needed)
			}
		}
		if batch.Error() != nil || got == 0 {
			return
		}
		left -= got
	}
	w.logf("worker: %s: restore: the %d frames to replay read %d restored tensors: read first", d.cfg.Name, frames, tensors)
}

// neededBy is the restored tensors still to read that the ops of a frame
// read, in order: the frame's subject names its session, its ops' inputs
// the tensors. frame is scratch.
func (lr *lazyRestore) neededBy(names subjects.Names, subject, contentType string, data []byte, frame *codec.Frame) []*lazyTensor {
	tenant, _, session, err := names.ParseFrame(subject)
	if err != nil {
		return nil
	}
	enc, err := codec.EncodingOf(contentType)
	if err != nil || codec.DecodeFrameInto(enc, data, frame) != nil {
		return nil
	}
	key := subjects.SessionKey(tenant, session)
	var needed []*lazyTensor
	seen := map[*lazyTensor]bool{}
	for _, op := range frame.Ops {
		for _, id := range op.In {
			if lt := lr.byKey[lazyKey{key, id}]; lt != nil && !seen[lt] {
				seen[lt] = true
				needed = append(needed, lt)
			}
		}
	}
	return needed
}
