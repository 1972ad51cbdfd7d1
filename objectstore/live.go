package objectstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// followLive reads object name as its writer publishes it. A plain
// subscription to the chunk subject and the meta subject has the broker
// hand each chunk over when it arrives, beside storing it, instead of
// loading it back from the stream for a consumer: the bucket's stream then
// only stores, and its one goroutine, which both stores and delivers, is
// no longer the bottleneck of a transfer (see the package documentation).
//
// The live chunks are a suffix of the object: those the broker took before
// the subscription are read from the stream (backfill) while the rest
// arrive. Each chunk's index is the last token of its reply subject (the
// inbox its ack goes to; Put writes it so). ok is false when the live read
// cannot account for every chunk in order (a chunk dropped because this
// reader fell behind, a writer that rewound after a refusal, a writer that
// names its chunks otherwise): the caller then reads another way.
func (s *Store) followLive(ctx context.Context, name, nuid string, dst []byte) (in Info, ok bool, err error) {
	defer func() {
		if !ok {
			liveStats.fallbacks.Add(1)
		}
	}()
	chunks, meta := chunkSubject(s.bucket, nuid), metaSubject(s.bucket, name)
	// One channel for both subjects keeps their order: the meta, published
	// after the last chunk's ack, comes after every chunk.
	ch := make(chan *nats.Msg, max(16, 2*s.opts.followAhead/s.opts.chunkSize))
	csub, err := s.nc.ChanSubscribe(chunks, ch)
	if err != nil {
		return Info{}, false, nil
	}
	defer func() { _ = csub.Unsubscribe() }()
	msub, err := s.nc.ChanSubscribe(meta, ch)
	if err != nil {
		return Info{}, false, nil
	}
	defer func() { _ = msub.Unsubscribe() }()
	fctx, cancel := s.withTimeout(ctx)
	err = s.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return Info{}, false, nil
	}
	var (
		first    = -1 // index of the first live chunk
		next     int  // index of the next live chunk
		chunkLen int  // length of a full chunk (that of the first live one)
		off      int  // where the next live chunk goes in dst
		back     *backfill
	)
	stop := func() {
		if back != nil {
			back.stop()
		}
	}
	idle := time.NewTimer(s.opts.timeout)
	defer idle.Stop()
	// A meta stored before the subscriptions took effect is not delivered
	// to them: look for it now and, until a chunk arrives live, again at
	// growing intervals (a writer may have finished just before the
	// subscriptions with its meta not yet stored: the broker hands a
	// message to subscribers before its stream stores it). Once a chunk
	// arrives live, the meta, written after it, will too.
	recheck := time.NewTimer(0)
	defer recheck.Stop()
	wait := time.Millisecond
	for {
		var m *nats.Msg
		select {
		case <-recheck.C:
			if first >= 0 {
				continue
			}
			if len(ch) > 0 { // what arrived comes first
				recheck.Reset(wait)
				continue
			}
			if oi, _, err := s.readMeta(ctx, name); err == nil {
				switch {
				case len(ch) > 0:
					// Chunks came in while it looked: the reply came after
					// them on the connection. Take them live.
				case !oi.Deleted:
					in, err := s.GetInto(ctx, name, dst)
					return in, true, err
				case oi.NUID == nuid:
					return Info{}, true, s.deleted(name, oi)
				}
			}
			wait = min(2*wait, 100*time.Millisecond)
			recheck.Reset(wait)
			continue
		case m = <-ch:
		case <-idle.C:
			stop()
			// Quiet for the store's timeout: the meta may have been
			// dropped with a full queue; otherwise the writer stopped.
			if oi, _, err := s.readMeta(ctx, name); err == nil && !oi.Deleted {
				in, err := s.GetInto(ctx, name, dst)
				return in, true, err
			}
			return Info{}, true, fmt.Errorf("objectstore: %s: follow %q: %d of %d bytes read: %w: nothing written for %v", s.bucket, name, off, len(dst), ErrStalled, s.opts.timeout)
		case <-ctx.Done():
			stop()
			return Info{}, true, fmt.Errorf("objectstore: %s: follow %q: %d of %d bytes read: %w", s.bucket, name, off, len(dst), ctx.Err())
		}
		idle.Reset(s.opts.timeout)
		if m.Subject == meta {
			var oi jetstream.ObjectInfo
			if err := json.Unmarshal(m.Data, &oi); err != nil {
				stop()
				return Info{}, false, nil
			}
			if oi.Deleted {
				if oi.NUID == nuid || oi.Headers != nil && oi.Headers.Get(hdrError) != "" {
					stop()
					return Info{}, true, s.deleted(name, &oi)
				}
				continue // an earlier object of that name, deleted
			}
			oi.ModTime = time.Now().UTC()
			var crc uint32
			var berr error
			if back != nil {
				crc, berr = back.finish()
			}
			// The meta may not be stored yet (a subscriber gets a message
			// before its stream stores it), so it is read from here on
			// rather than looked up; what it names was stored before it.
			target, lerr := s.resolveLink(ctx, name, &oi)
			if lerr != nil {
				return Info{}, true, fmt.Errorf("objectstore: %s: follow %q: %w", s.bucket, name, lerr)
			}
			if berr == nil && first >= 0 && target.NUID == nuid && followed(target, crc, dst, off, next) {
				return info(target), true, nil
			}
			// Every chunk was taken before the subscription, or another
			// writer's object won, or the chunks do not match: read the
			// object from the stream.
			in, err := s.readInto(ctx, name, target, dst)
			return in, true, err
		}
		i, err := strconv.Atoi(m.Reply[strings.LastIndexByte(m.Reply, '.')+1:])
		if err != nil || m.Reply == "" {
			stop()
			return Info{}, false, nil
		}
		n := len(m.Data)
		if first < 0 {
			if n == 0 || i < 0 || i*n > len(dst) {
				return Info{}, false, nil
			}
			first, next, chunkLen, off = i, i, n, i*n
			back = startBackfill(ctx, s, chunks, dst, first, chunkLen)
		}
		// In order, full chunks but the last, which ends the object.
		if i != next || off+n > len(dst) || n != chunkLen && off+n != len(dst) {
			stop()
			return Info{}, false, nil
		}
		copy(dst[off:], m.Data)
		liveStats.live.Add(1)
		back.spans <- span{off, n}
		off += n
		next++
	}
}

// liveStats counts what live reads did, for tests.
var liveStats struct {
	fallbacks  atomic.Int64 // live reads given up for another way
	backfilled atomic.Int64 // chunks read from the stream before live ones
	live       atomic.Int64 // chunks taken live
}

// deleted is the error for a delete marker that ends a read: with the
// writer's reason when Abort gave one.
func (s *Store) deleted(name string, oi *jetstream.ObjectInfo) error {
	if oi.Headers != nil && oi.Headers.Get(hdrError) != "" {
		return fmt.Errorf("%w: %q in bucket %s: its writer gave up: %s", ErrNotFound, name, s.bucket, oi.Headers.Get(hdrError))
	}
	return fmt.Errorf("%w: %q in bucket %s was deleted", ErrNotFound, name, s.bucket)
}

// span is a range of dst ready to be hashed (CRC-32: the meta, which says
// what to check, comes last; see verifyData).
type span struct{ off, n int }

// backfill reads the chunks the broker took before a live reader
// subscribed, from the stream, into the start of dst, then hashes the
// whole object in order with CRC-32: that prefix as it is read, then the
// live chunks as the reader hands their spans over.
type backfill struct {
	s      *Store
	subj   string
	dst    []byte // the whole object
	chunks int    // chunks in the prefix to read
	chunk  int    // bytes in each of them

	spans  chan span
	cancel context.CancelFunc
	wg     sync.WaitGroup
	h      hash.Hash32
	err    error
}

func startBackfill(ctx context.Context, s *Store, subj string, dst []byte, chunks, chunk int) *backfill {
	// A span per live chunk at most: the channel never blocks the reader.
	spans := len(dst)/chunk + 2
	b := &backfill{s: s, subj: subj, dst: dst, chunks: chunks, chunk: chunk, spans: make(chan span, spans), h: crc32.NewIEEE()}
	ctx, b.cancel = context.WithCancel(ctx)
	b.wg.Go(func() {
		if b.err = b.read(ctx); b.err != nil {
			for range b.spans { // let the reader finish or stop
			}
			return
		}
		for sp := range b.spans {
			b.h.Write(b.dst[sp.off : sp.off+sp.n])
		}
	})
	return b
}

// finish waits for the hashing and returns the object's CRC-32.
func (b *backfill) finish() (uint32, error) {
	close(b.spans)
	b.wg.Wait()
	b.cancel()
	if b.err != nil {
		return 0, b.err
	}
	return b.h.Sum32(), nil
}

// stop abandons the backfill and waits for its goroutine.
func (b *backfill) stop() {
	b.cancel()
	close(b.spans)
	b.wg.Wait()
}

// errShortChunk marks a stored chunk that is not a full one before the
// live chunks: the live reader guessed the chunk size wrong.
var errShortChunk = errors.New("stored chunk shorter than the live ones")

// read fetches the prefix's chunks with batched direct gets, waiting for
// those the broker has taken but not stored yet.
func (b *backfill) read(ctx context.Context) error {
	if b.chunks == 0 {
		return nil
	}
	s := b.s
	inbox := s.nc.NewInbox()
	batch := min(max(1, s.opts.readAhead/b.chunk), maxBatch)
	ch := make(chan *nats.Msg, batch+2)
	sub, err := s.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	var lastSeq uint64
	got, quiet := 0, time.Now()
	for got < b.chunks {
		want := min(batch, b.chunks-got)
		req, _ := json.Marshal(directBatch{Seq: lastSeq + 1, NextFor: b.subj, Batch: want})
		if err := s.nc.PublishRequest(s.directGet, inbox, req); err != nil {
			return err
		}
		before := got
	replies:
		for {
			select {
			case m := <-ch:
				switch st := status(m); st {
				case "":
				case statusEOB, statusNotFound:
					break replies
				default:
					return fmt.Errorf("objectstore: %s: backfill: status %s %s", s.bucket, st, m.Header.Get(hdrDesc))
				}
				seq, err := headerUint(m, hdrSequence)
				if err != nil || seq <= lastSeq || got == b.chunks {
					return fmt.Errorf("objectstore: %s: backfill: chunk at sequence %d after %d: %v", s.bucket, seq, lastSeq, err)
				}
				if len(m.Data) != b.chunk {
					return errShortChunk
				}
				off := got * b.chunk
				copy(b.dst[off:], m.Data)
				b.h.Write(b.dst[off : off+b.chunk])
				got++
				lastSeq = seq
				liveStats.backfilled.Add(1)
			case <-time.After(s.opts.timeout):
				return fmt.Errorf("objectstore: %s: backfill: no reply within %v", s.bucket, s.opts.timeout)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		switch {
		case got > before:
			quiet = time.Now()
		case time.Since(quiet) > s.opts.timeout:
			return fmt.Errorf("objectstore: %s: backfill: %d of %d chunks stored after %v", s.bucket, got, b.chunks, s.opts.timeout)
		default:
			// Taken by the broker but not stored yet: look again shortly.
			if err := sleepCtx(ctx, 200*time.Microsecond); err != nil {
				return err
			}
		}
	}
	return nil
}
