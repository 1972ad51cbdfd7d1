package objectstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Get reads the whole object and checks it against its meta: size, number
// of chunks and CRC-32 or, where the meta has none, SHA-256 digest
// (ErrDigest when they differ; see hdrCRC32). A missing or
// deleted object gives ErrNotFound.
func (s *Store) Get(ctx context.Context, name string) ([]byte, Info, error) {
	oi, err := s.current(ctx, name)
	if err != nil {
		return nil, Info{}, err
	}
	in := info(oi)
	if in.Size < 0 || uint64(in.Size) > math.MaxInt {
		return nil, in, fmt.Errorf("%w: %q in bucket %s: size %d does not fit in memory", ErrDigest, name, s.bucket, in.Size)
	}
	buf := make([]byte, in.Size)
	if err := s.read(ctx, oi, buf); err != nil {
		return nil, in, err
	}
	return buf, in, nil
}

// GetInto reads the object straight into dst, whose length must be the
// object's size (ErrSize otherwise, with nothing read). It checks the data
// as Get does; on error dst holds partial data.
func (s *Store) GetInto(ctx context.Context, name string, dst []byte) (Info, error) {
	oi, err := s.current(ctx, name)
	if err != nil {
		return Info{}, err
	}
	return s.readInto(ctx, name, oi, dst)
}

// readInto reads the object that meta oi of name describes into dst.
func (s *Store) readInto(ctx context.Context, name string, oi *jetstream.ObjectInfo, dst []byte) (Info, error) {
	in := info(oi)
	if int64(len(dst)) != in.Size {
		return in, fmt.Errorf("%w: %q in bucket %s is %d bytes, destination is %d", ErrSize, name, s.bucket, in.Size, len(dst))
	}
	return in, s.read(ctx, oi, dst)
}

// current returns the live meta of name, following a link to an object in
// the same bucket as nats.go does.
func (s *Store) current(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	oi, _, err := s.readMeta(ctx, name)
	if err != nil {
		return nil, err
	}
	if oi.Deleted {
		return nil, fmt.Errorf("%w: %q in bucket %s was deleted", ErrNotFound, name, s.bucket)
	}
	return s.resolveLink(ctx, name, oi)
}

// resolveLink returns the meta of the object that meta oi of name links
// to, or oi itself when it is no link.
func (s *Store) resolveLink(ctx context.Context, name string, oi *jetstream.ObjectInfo) (*jetstream.ObjectInfo, error) {
	if oi.Opts == nil || oi.Opts.Link == nil {
		return oi, nil
	}
	l := oi.Opts.Link
	if l.Name == "" || l.Bucket != s.bucket {
		return nil, fmt.Errorf("objectstore: %s: %q links to bucket %s object %q; only links to objects in the same bucket are followed", s.bucket, name, l.Bucket, l.Name)
	}
	oi, _, err := s.readMeta(ctx, l.Name)
	if err != nil {
		return nil, err
	}
	if oi.Deleted || (oi.Opts != nil && oi.Opts.Link != nil) {
		return nil, fmt.Errorf("%w: link %q in bucket %s points to %q, deleted or a link", ErrNotFound, name, s.bucket, l.Name)
	}
	return oi, nil
}

func (s *Store) read(ctx context.Context, oi *jetstream.ObjectInfo, dst []byte) error {
	prefault(dst)
	if _, ok := partsOf(oi); ok {
		return s.readParts(ctx, oi, dst)
	}
	return s.readChunks(ctx, oi, dst, s.opts.readAhead)
}

// readChunks reads one object's chunks into dst with batched direct gets
// and checks them against the meta. See the package documentation.
// At most readAhead bytes are requested and not yet received.
func (s *Store) readChunks(ctx context.Context, oi *jetstream.ObjectInfo, dst []byte, readAhead int) error {
	h, err := checkOf(oi)
	if err != nil {
		return fmt.Errorf("%w: %q in bucket %s: %v", ErrDigest, oi.Name, s.bucket, err)
	}
	if uint64(len(dst)) != oi.Size {
		return fmt.Errorf("%w: %q in bucket %s is %d bytes, destination is %d", ErrSize, oi.Name, s.bucket, oi.Size, len(dst))
	}
	if oi.Chunks == 0 {
		if oi.Size != 0 {
			return fmt.Errorf("%w: %q in bucket %s: %d bytes in no chunks", ErrDigest, oi.Name, s.bucket, oi.Size)
		}
		if err := verify(oi, h.Sum(nil)); err != nil {
			return fmt.Errorf("%w: %q in bucket %s: empty object: %v", ErrDigest, oi.Name, s.bucket, err)
		}
		return nil
	}
	chunk := int(oi.Size / uint64(oi.Chunks))
	if oi.Opts != nil && oi.Opts.ChunkSize > 0 {
		chunk = max(chunk, int(oi.Opts.ChunkSize))
	}
	r := &reader{
		s:     s,
		name:  oi.Name,
		subj:  chunkSubject(s.bucket, oi.NUID),
		dst:   dst,
		n:     int(oi.Chunks),
		batch: max(1, readAhead/max(chunk, 1)),
	}
	r.batch = min(r.batch, r.n, maxBatch)
	r.work = make(chan *nats.Msg, r.batch+1)
	r.h = h
	r.wg.Go(r.copyLoop)
	err = r.run(ctx)
	if err != nil {
		r.stopped.Store(true)
	}
	close(r.work)
	r.wg.Wait()
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
	if err != nil {
		return err
	}
	if err := verify(oi, r.h.Sum(nil)); err != nil {
		return fmt.Errorf("%w: %q in bucket %s: %v", ErrDigest, oi.Name, s.bucket, err)
	}
	return nil
}

// maxBatch bounds the chunks of one request (and the buffers sized by it)
// whatever chunk size an object declares.
const maxBatch = 1024

// reader fetches one object's chunks. Its run loop (the caller's
// goroutine) sends the requests and checks each chunk against the meta;
// copyLoop, a goroutine it owns, copies the chunks into dst and hashes
// them (CRC-32 or SHA-256, see checkOf), so checking, copying and hashing overlap.
type reader struct {
	s     *Store
	name  string
	subj  string
	dst   []byte
	n     int // chunks
	batch int // chunks per request

	inbox string
	ch    chan *nats.Msg
	sub   *nats.Subscription

	got     int    // chunks accepted
	off     int    // bytes accepted
	lastSeq uint64 // stream sequence of the last chunk accepted
	pending int    // chunks still due from the newest request
	eobDue  int    // requests whose end-of-batch status has not arrived
	retries int

	work    chan *nats.Msg
	wg      sync.WaitGroup
	stopped atomic.Bool
	h       hash.Hash
}

// copyLoop copies and hashes accepted chunks, in order.
func (r *reader) copyLoop() {
	off := 0
	for m := range r.work {
		if r.stopped.Load() {
			continue
		}
		off += copy(r.dst[off:], m.Data)
		r.h.Write(m.Data)
	}
}

// errInconsistent marks a reply that does not fit the meta; the reader
// starts over from its last good chunk, a bounded number of times (a
// replica that has not caught up answers like this).
var errInconsistent = errors.New("chunks do not match the meta")

func (r *reader) run(ctx context.Context) error {
	if err := r.request(true); err != nil {
		return err
	}
	timer := time.NewTimer(r.s.opts.timeout)
	defer timer.Stop()
	for r.got < r.n {
		timer.Reset(r.s.opts.timeout)
		var err error
		select {
		case m := <-r.ch:
			err = r.take(m)
		case <-timer.C:
			err = fmt.Errorf("%w: no chunk within %v", nats.ErrTimeout, r.s.opts.timeout)
		case <-ctx.Done():
			return fmt.Errorf("objectstore: %s: get %q: %w", r.s.bucket, r.name, ctx.Err())
		}
		if err == nil {
			continue
		}
		var retry *retryable
		if !errors.As(err, &retry) && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		r.retries++
		if r.retries > r.s.opts.retries {
			if errors.Is(err, errInconsistent) {
				return fmt.Errorf("%w: %q in bucket %s: %v (gave up after %d retries)", ErrDigest, r.name, r.s.bucket, err, r.s.opts.retries)
			}
			return fmt.Errorf("objectstore: %s: get %q: %w (gave up after %d retries)", r.s.bucket, r.name, err, r.s.opts.retries)
		}
		if err := sleepCtx(ctx, backoff(r.retries, 2*time.Millisecond)); err != nil {
			return fmt.Errorf("objectstore: %s: get %q: %w", r.s.bucket, r.name, err)
		}
		if err := r.request(true); err != nil {
			return err
		}
	}
	return nil
}

type retryable struct{ err error }

func (e *retryable) Error() string { return e.err.Error() }
func (e *retryable) Unwrap() error { return e.err }

func inconsistent(format string, a ...any) error {
	return &retryable{fmt.Errorf("%w: %s", errInconsistent, fmt.Sprintf(format, a...))}
}

// request asks for the next batch of chunks after the last good one, on a
// fresh inbox when starting over, so that stale replies are never read.
func (r *reader) request(fresh bool) error {
	if fresh {
		if r.sub != nil {
			_ = r.sub.Unsubscribe()
		}
		r.inbox = r.s.nc.NewInbox()
		// A request brings at most batch chunks and one status.
		// Two requests overlap (the next is sent before the previous
		// one's status arrives): at most one status of the older and
		// batch chunks and a status of the newer.
		r.ch = make(chan *nats.Msg, r.batch+3)
		sub, err := r.s.nc.ChanSubscribe(r.inbox, r.ch)
		if err != nil {
			return fmt.Errorf("objectstore: %s: get %q: subscribe: %w", r.s.bucket, r.name, err)
		}
		r.sub = sub
		r.eobDue = 0
	}
	r.pending = min(r.batch, r.n-r.got)
	r.eobDue++
	req, _ := json.Marshal(directBatch{Seq: r.lastSeq + 1, NextFor: r.subj, Batch: r.pending})
	if err := r.s.nc.PublishRequest(r.s.directGet, r.inbox, req); err != nil {
		return fmt.Errorf("objectstore: %s: get %q: request chunks: %w", r.s.bucket, r.name, err)
	}
	return nil
}

// directBatch is a batched direct get of the messages on one subject from
// a sequence on.
type directBatch struct {
	Seq     uint64 `json:"seq"`
	NextFor string `json:"next_by_subj"`
	Batch   int    `json:"batch"`
}

// take checks one reply. The broker sends a batch's chunks in stream order,
// each with the number of messages left on the subject after it; for chunk
// i of n that must be n-1-i, which catches missing, extra and stale chunks
// before they are copied. The next batch is requested as soon as the last
// chunk of this one arrives.
func (r *reader) take(m *nats.Msg) error {
	switch st := status(m); st {
	case "":
	case statusEOB:
		// Replies come in request order: this status ends the oldest
		// request, and only the newest can still be short.
		r.eobDue--
		if r.eobDue == 0 && r.pending > 0 {
			return inconsistent("batch ended after chunk %d of %d", r.got, r.n)
		}
		return nil
	case statusNotFound:
		r.eobDue--
		return inconsistent("no chunks after sequence %d, %d of %d read", r.lastSeq, r.got, r.n)
	case statusNoResponders:
		return &retryable{fmt.Errorf("bucket stream unavailable (status %s)", st)}
	default:
		return fmt.Errorf("objectstore: %s: get %q: status %s %s", r.s.bucket, r.name, st, m.Header.Get(hdrDesc))
	}
	if r.pending == 0 {
		return nil // a stray data message after the batch: ignored
	}
	seq, err := headerUint(m, hdrSequence)
	if err != nil {
		return fmt.Errorf("objectstore: %s: get %q: %v", r.s.bucket, r.name, err)
	}
	left, err := headerUint(m, hdrNumPending)
	if err != nil {
		return fmt.Errorf("objectstore: %s: get %q: %v", r.s.bucket, r.name, err)
	}
	switch {
	case seq <= r.lastSeq:
		return inconsistent("chunk at sequence %d after %d", seq, r.lastSeq)
	case left != uint64(r.n-1-r.got):
		return inconsistent("chunk %d of %d has %d more after it on the subject, want %d", r.got, r.n, left, r.n-1-r.got)
	case r.off+len(m.Data) > len(r.dst):
		return inconsistent("chunk %d brings the object past its size %d", r.got, len(r.dst))
	}
	r.work <- m
	r.got++
	r.off += len(m.Data)
	r.lastSeq = seq
	r.pending--
	if r.got == r.n {
		if r.off != len(r.dst) {
			// Every chunk checked out against the subject: the meta is wrong.
			return fmt.Errorf("%w: %q in bucket %s: %d chunks hold %d bytes, meta says %d", ErrDigest, r.name, r.s.bucket, r.n, r.off, len(r.dst))
		}
		return nil
	}
	if r.pending == 0 {
		return r.request(false)
	}
	return nil
}

// readManifest reads and decodes a parted object's manifest.
func (s *Store) readManifest(ctx context.Context, oi *jetstream.ObjectInfo) (manifest, error) {
	var man manifest
	if oi.Size > 16<<20 {
		return man, fmt.Errorf("%w: %q in bucket %s: manifest of %d bytes", ErrDigest, oi.Name, s.bucket, oi.Size)
	}
	buf := make([]byte, oi.Size)
	if err := s.readChunks(ctx, oi, buf, s.opts.readAhead); err != nil {
		return man, err
	}
	if err := json.Unmarshal(buf, &man); err != nil {
		return man, fmt.Errorf("%w: %q in bucket %s: manifest: %v", ErrDigest, oi.Name, s.bucket, err)
	}
	return man, nil
}
