package objectstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Put writes data as the object name with the caller's metadata, in the
// object store's own format, and returns its Info. The meta, with the
// SHA-256 digest, is written only once every chunk is stored, so readers
// never see a partial object; an object of the same name is replaced at
// that moment and its chunks purged afterwards. On failure the chunks
// written are purged and nothing is visible. Refusals and timeouts are
// retried (WithRetries) from the last good chunk; past that the error
// wraps ErrRefused. PutOptions name the chunk subject in advance
// (WithNUID) or give the digest (WithSHA256).
func (s *Store) Put(ctx context.Context, name string, data []byte, meta map[string]string, opts ...PutOption) (Info, error) {
	var pc putConfig
	for _, o := range opts {
		if o != nil {
			o(&pc)
		}
	}
	switch {
	case pc.nameOf == nil && name == "":
		return Info{}, fmt.Errorf("%w: empty object name", ErrInvalidOption)
	case pc.nameOf != nil && (name != "" || pc.digest != nil):
		return Info{}, fmt.Errorf("%w: a Put named from its digest takes no name and no digest", ErrInvalidOption)
	}
	if pc.nuid != "" {
		if err := ValidNUID(pc.nuid); err != nil {
			return Info{}, err
		}
	}
	if s.opts.parts > 1 && int64(len(data)) > s.opts.partThreshold && pc.nameOf == nil {
		return s.putParts(ctx, name, data, meta)
	}
	oi, err := s.putObject(ctx, name, data, meta, nil, s.opts.window, pc)
	if err != nil {
		return Info{}, err
	}
	return info(oi), nil
}

// newNUID names a new chunk subject: 128 random bits as one subject token.
func newNUID() string { return rand.Text() }

// Chunk states in a writer.
const (
	chunkUnsent uint8 = iota
	chunkInFlight
	chunkAcked
	chunkFailed
)

// hashBlock is how much an unpaced digest hashes between checks for
// cancellation.
const hashBlock = 4 << 20

// leadChunks is how far a paced digest may run ahead of the publisher.
const leadChunks = 4

// digest computes the SHA-256 of data and its CRC-32 (for the meta's
// hdrCRC32) on its own goroutine, so hashing and publishing use two
// cores. A paced digest (for a writer) hashes chunk by chunk and stays at
// most leadChunks ahead of the publisher, which waits in ready until the
// chunk it sends next is hashed: the publisher then copies a chunk that
// is still in cache, and a slow publisher holds the digest back instead
// of racing it through memory. Its owner calls wait or stop before
// returning.
type digest struct {
	data  []byte
	chunk int
	ahead chan struct{} // a token per hashed chunk; nil when unpaced
	taken int           // tokens taken by ready

	stopped atomic.Bool
	wg      sync.WaitGroup
	sum     [sha256.Size]byte
	crc     uint32 // CRC-32 of the data (hdrCRC32), where sum is computed
	given   bool   // sum was given (WithSHA256): nothing is computed

	nameOf func(sum [sha256.Size]byte) string // called on the goroutine when the sum is known
	name   string                             // what nameOf returned; read after wg.Wait or named
	named  chan struct{}                      // closed once name is set (with nameOf)
}

func startDigest(data []byte, chunk int, paced bool, nameOf func([sha256.Size]byte) string) *digest {
	d := &digest{data: data, chunk: chunk, nameOf: nameOf}
	if nameOf != nil {
		d.named = make(chan struct{})
	}
	if paced {
		d.ahead = make(chan struct{}, leadChunks)
	}
	d.wg.Go(func() {
		if d.ahead != nil {
			defer close(d.ahead)
		}
		h := sha256.New()
		var crc uint32
		for off := 0; off < len(data); off += chunk {
			if d.stopped.Load() {
				return
			}
			c := data[off:min(off+chunk, len(data))]
			h.Write(c)
			crc = crc32.Update(crc, crc32.IEEETable, c)
			if d.ahead != nil {
				d.ahead <- struct{}{}
			}
		}
		d.crc = crc
		h.Sum(d.sum[:0])
		if d.nameOf != nil {
			d.name = d.nameOf(d.sum)
			close(d.named)
		}
	})
	return d
}

// ready returns once chunk i is hashed (at once when unpaced).
func (d *digest) ready(ctx context.Context, i int) error {
	if d.ahead == nil {
		return nil
	}
	for ; d.taken <= i; d.taken++ {
		select {
		case <-d.ahead:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// wait returns the SHA-256 and the CRC-32 of all the data.
func (d *digest) wait() ([sha256.Size]byte, uint32) {
	d.drain()
	d.wg.Wait()
	return d.sum, d.crc
}

// stop abandons the digest and waits for its goroutine.
func (d *digest) stop() {
	d.stopped.Store(true)
	d.drain()
	d.wg.Wait()
}

func (d *digest) drain() {
	if d.ahead != nil {
		for range d.ahead {
		}
	}
}

// writer publishes one object's chunks with a bounded window.
type writer struct {
	s      *Store
	dig    *digest
	name   string
	data   []byte
	chunk  int
	n      int // chunks
	window int
	yield  func(context.Context) error // before each chunk (WithYield)

	nuid      string
	subj      string
	abandoned []string // NUIDs given up after a timeout; purged again at the end

	inbox string
	acks  chan *nats.Msg
	sub   *nats.Subscription

	state    []uint8
	seqs     []uint64
	sentAt   []time.Time
	next     int // next chunk to send
	lo       int // no chunk below lo is in flight
	inflight int
	acked    int

	failedAt int // lowest refused or timed-out chunk, -1 when none
	timedOut bool
	throttle bool // a 429 was seen: halve the window on rewind
	lastErr  error
	retries  int
	rewound  bool
	metaSent bool // the meta may be stored: a rollback must undo it

	prevAsked bool
	prevDone  bool
	prev      *jetstream.ObjectInfo
	// named: a write named by its content learnt its name while sending
	// (and asked for the object of that name).
	named bool
}

// Reply tokens under the writer's inbox besides chunk indexes.
const (
	replyMeta = "m"
	replyPrev = "p"
)

// putObject writes one ADR-20 object with at most window chunks in flight.
func (s *Store) putObject(ctx context.Context, name string, data []byte, meta map[string]string, hdr nats.Header, window int, pc putConfig) (*jetstream.ObjectInfo, error) {
	chunk := s.opts.chunkSize
	n := (len(data) + chunk - 1) / chunk
	if int64(n) > math.MaxUint32 {
		return nil, fmt.Errorf("%w: %q: %d chunks of %d bytes, at most %d chunks", ErrInvalidOption, name, n, chunk, uint32(math.MaxUint32))
	}
	w := &writer{
		s: s, name: name, data: data, chunk: chunk, n: n,
		window:   min(window, max(n, 1)),
		state:    make([]uint8, n),
		seqs:     make([]uint64, n),
		sentAt:   make([]time.Time, n),
		failedAt: -1,
	}
	w.yield = pc.yield
	w.nuid = pc.nuid
	if w.nuid == "" {
		w.nuid = newNUID()
	}
	w.subj = chunkSubject(s.bucket, w.nuid)
	var dig *digest
	switch {
	case pc.digest != nil:
		// Nothing to compute: ready at once. The meta gets no CRC-32,
		// so readers check the given digest.
		dig = &digest{sum: *pc.digest, given: true}
	case pc.nameOf != nil:
		// Unpaced: the name is wanted as early as possible.
		dig = startDigest(data, chunk, false, pc.nameOf)
		w.name = "(named by its digest, chunks " + w.nuid + ")"
	default:
		dig = startDigest(data, chunk, true, nil)
	}
	w.dig = dig
	if err := w.subscribe(); err != nil {
		dig.stop()
		return nil, err
	}
	defer func() { _ = w.sub.Unsubscribe() }()
	if pc.nameOf == nil {
		w.askPrev()
	}

	err := w.sendAll(ctx)
	var oi *jetstream.ObjectInfo
	var sum [sha256.Size]byte
	var crc uint32
	if err == nil {
		sum, crc = dig.wait()
		if pc.nameOf != nil {
			if name = dig.name; name == "" {
				err = fmt.Errorf("%w: %s: put %s: the name made from the digest is empty", ErrInvalidOption, s.bucket, w.name)
			} else {
				w.name = name
				w.askPrev() // answered before the meta is stored: it goes out first
				// An object named by its content is never replaced by
				// the same content: readers may be copying its chunks.
				w.waitPrev(ctx)
				if w.samePrev(sum, len(data)) {
					err = errStoredBefore
				}
			}
		}
	}
	if errors.Is(err, errStoredBefore) {
		dig.stop()
		w.rollback(ctx)
		return w.prev, nil
	}
	if err == nil {
		oi = &jetstream.ObjectInfo{
			ObjectMeta: jetstream.ObjectMeta{
				Name:    name,
				Headers: hdr,
				Opts:    &jetstream.ObjectMetaOptions{ChunkSize: uint32(chunk)},
			},
			Bucket: s.bucket,
			NUID:   w.nuid,
			Size:   uint64(len(data)),
			Chunks: uint32(n),
			Digest: digestString(sum),
		}
		if len(meta) > 0 {
			oi.Metadata = maps.Clone(meta)
		}
		if !dig.given {
			oi.Headers = withCRC(hdr, crc)
		}
		err = w.writeMeta(ctx, oi)
	}
	if err != nil {
		dig.stop()
		w.rollback(ctx)
		return nil, err
	}
	w.waitPrev(ctx)
	// An object named by its content keeps the chunks of a previous meta
	// of the same content: that meta was stored after this write last
	// looked (its answer came late), and readers may be copying them. The
	// bucket's TTL removes them.
	keepPrev := pc.nameOf != nil && w.samePrev(sum, len(data))
	w.dropOld(ctx, keepPrev)
	return oi, nil
}

func (w *writer) subscribe() error {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
	w.inbox = w.s.nc.NewInbox()
	// Every reply fits: at most window chunk acks, the meta ack and the
	// previous meta are outstanding on one inbox.
	w.acks = make(chan *nats.Msg, w.window+4)
	sub, err := w.s.nc.ChanSubscribe(w.inbox+".*", w.acks)
	if err != nil {
		return fmt.Errorf("objectstore: %s: put %q: subscribe for acks: %w", w.s.bucket, w.name, err)
	}
	w.sub = sub
	return nil
}

// errStoredBefore stops a write named by its content when the object of
// that name holds the same bytes already.
var errStoredBefore = errors.New("objectstore: stored before")

// samePrev reports whether the object the write would replace holds the
// same bytes (size and digest), as a plain object.
func (w *writer) samePrev(sum [sha256.Size]byte, size int) bool {
	p := w.prev
	return p != nil && !p.Deleted && p.Size == uint64(size) && p.Digest == digestString(sum) &&
		(p.Opts == nil || p.Opts.Link == nil) && p.NUID != w.nuid
}

// askPrev asks for the meta the new object replaces, without waiting:
// its chunks are purged once the new meta is in.
func (w *writer) askPrev() {
	if w.prevDone {
		return
	}
	err := w.s.nc.PublishRequest(w.s.directGet+"."+metaSubject(w.s.bucket, w.name), w.inbox+"."+replyPrev, nil)
	w.prevAsked = err == nil
}

func (w *writer) takePrev(m *nats.Msg) {
	w.prevDone = true
	if oi, _, err := decodeMeta(m, w.s.bucket, w.name); err == nil {
		w.prev = oi
	}
}

// sendAll publishes every chunk and returns once all are acknowledged in
// order on one subject.
func (w *writer) sendAll(ctx context.Context) error {
	timer := time.NewTimer(w.s.opts.timeout)
	defer timer.Stop()
	nameKnown := w.dig.named // nil unless the write is named by its content
	for {
		if w.failedAt < 0 {
			for w.next < w.n && w.inflight < w.window {
				if err := w.dig.ready(ctx, w.next); err != nil {
					return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, err)
				}
				if w.yield != nil {
					if err := w.yield(ctx); err != nil {
						return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, err)
					}
				}
				if err := w.send(w.next); err != nil {
					return err
				}
				w.next++
			}
			if w.acked == w.n {
				if !w.rewound {
					return nil
				}
				// After a rewind, check that the subject holds exactly
				// our chunks before the meta makes them visible; if not,
				// start over on a new subject.
				err := w.verifyCount(ctx)
				if err == nil {
					return nil
				}
				w.fail(0, true, err)
				continue
			}
		} else if w.inflight == 0 {
			if err := w.rewind(ctx); err != nil {
				return err
			}
			continue
		}
		if w.inflight == 0 {
			continue
		}
		for w.lo < w.next && w.state[w.lo] != chunkInFlight {
			w.lo++
		}
		timer.Reset(time.Until(w.sentAt[w.lo].Add(w.s.opts.timeout)))
		select {
		case m := <-w.acks:
			if err := w.handle(m); err != nil {
				return err
			}
		case <-nameKnown:
			// Ask at once whether those bytes are stored under that
			// name already: if so, the write stops (see handle).
			nameKnown = nil
			if w.dig.name != "" {
				w.name, w.named = w.dig.name, true
				w.askPrev()
			}
		case now := <-timer.C:
			w.expire(now)
		case <-ctx.Done():
			return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, ctx.Err())
		}
	}
}

func (w *writer) send(i int) error {
	a := i * w.chunk
	b := min(a+w.chunk, len(w.data))
	w.state[i] = chunkInFlight
	w.sentAt[i] = time.Now()
	w.inflight++
	if err := w.s.nc.PublishRequest(w.subj, w.inbox+"."+strconv.Itoa(i), w.data[a:b]); err != nil {
		return fmt.Errorf("objectstore: %s: put %q: publish chunk %d: %w", w.s.bucket, w.name, i, err)
	}
	return nil
}

// handle takes one reply off the inbox.
func (w *writer) handle(m *nats.Msg) error {
	tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	if tok == replyPrev {
		w.takePrev(m)
		if w.named && w.samePrev(w.dig.sum, len(w.data)) {
			return errStoredBefore
		}
		return nil
	}
	i, err := strconv.Atoi(tok)
	if err != nil || i < 0 || i >= w.n || w.state[i] != chunkInFlight {
		return nil // the meta's ack, or a chunk given up on
	}
	w.inflight--
	retry, err := ackResult(m)
	switch {
	case err == nil:
		w.state[i] = chunkAcked
		w.acked++
		return nil
	case retry:
		w.state[i] = chunkFailed
		w.fail(i, false, err)
		return nil
	default:
		w.state[i] = chunkFailed
		return fmt.Errorf("%w: %s: put %q: chunk %d: %v", ErrRefused, w.s.bucket, w.name, i, err)
	}
}

// ackResult reads a publish reply: nil when stored; otherwise whether a
// retry can succeed.
func ackResult(m *nats.Msg) (retry bool, err error) {
	if st := status(m); st != "" {
		return st == statusNoResponders, fmt.Errorf("status %s %s", st, m.Header.Get(hdrDesc))
	}
	var ack pubAck
	if err := json.Unmarshal(m.Data, &ack); err != nil {
		return false, fmt.Errorf("unreadable ack %q: %v", m.Data, err)
	}
	if ack.Error != nil {
		e := ack.Error
		return e.Code == codeTooManyRequests || e.ErrCode == errClusterNotAvail, e
	}
	if ack.Seq == 0 {
		return false, fmt.Errorf("ack without a sequence: %q", m.Data)
	}
	return false, nil
}

// fail records a retryable failure at chunk i: sending stops, and once
// nothing is in flight the writer rewinds.
func (w *writer) fail(i int, timedOut bool, err error) {
	if w.failedAt < 0 || i < w.failedAt {
		w.failedAt = i
	}
	w.timedOut = w.timedOut || timedOut
	var ae *apiError
	if errors.As(err, &ae) && ae.Code == codeTooManyRequests {
		w.throttle = true
	}
	w.lastErr = err
}

// expire gives up on every chunk whose ack is overdue.
func (w *writer) expire(now time.Time) {
	for i := w.lo; i < w.next; i++ {
		if w.state[i] == chunkInFlight && now.Sub(w.sentAt[i]) >= w.s.opts.timeout {
			w.state[i] = chunkFailed
			w.inflight--
			w.fail(i, true, fmt.Errorf("no ack for chunk %d within %v", i, w.s.opts.timeout))
		}
	}
}

// rewind makes the chunk subject hold exactly chunks [0, failedAt) again
// and resumes from failedAt. Chunks accepted after a refused one are
// deleted by sequence. After a timeout the writer cannot know what was
// stored, so it abandons the subject and starts over on a new one.
func (w *writer) rewind(ctx context.Context) error {
	w.retries++
	if w.retries > w.s.opts.retries {
		return fmt.Errorf("%w: %s: put %q: chunk %d: %v (gave up after %d retries)", ErrRefused, w.s.bucket, w.name, w.failedAt, w.lastErr, w.s.opts.retries)
	}
	if err := sleepCtx(ctx, backoff(w.retries, 20*time.Millisecond)); err != nil {
		return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, err)
	}
	if w.throttle {
		w.window = max(1, w.window/2)
		w.throttle = false
	}
	if !w.timedOut {
		for i := w.failedAt; i < w.next; i++ {
			if w.state[i] == chunkAcked {
				if err := w.s.stream.DeleteMsg(ctx, w.seqs[i]); err != nil {
					w.timedOut = true // cannot trim: start over instead
					break
				}
				w.acked--
			}
			w.state[i] = chunkUnsent
		}
	}
	if w.timedOut {
		w.abandoned = append(w.abandoned, w.nuid)
		w.purgeQuietly(ctx, w.nuid)
		w.nuid = newNUID()
		w.subj = chunkSubject(w.s.bucket, w.nuid)
		clear(w.state)
		w.acked, w.failedAt = 0, 0
		// Late acks belong to the old subject: listen on a new inbox.
		if err := w.subscribe(); err != nil {
			return err
		}
		if !w.prevDone {
			w.askPrev()
		}
	}
	w.next, w.lo = w.failedAt, w.failedAt
	w.failedAt, w.timedOut, w.rewound = -1, false, true
	return nil
}

// verifyCount checks that the chunk subject holds exactly n messages.
func (w *writer) verifyCount(ctx context.Context) error {
	si, err := w.s.stream.Info(ctx, jetstream.WithSubjectFilter(w.subj))
	if err != nil {
		return fmt.Errorf("count chunks: %w", err)
	}
	if got := si.State.Subjects[w.subj]; got != uint64(w.n) {
		return fmt.Errorf("%s holds %d messages, want %d", w.subj, got, w.n)
	}
	return nil
}

// writeMeta publishes the meta, rolling up the previous one, and waits for
// its ack; a retryable refusal or a timeout publishes it again.
func (w *writer) writeMeta(ctx context.Context, oi *jetstream.ObjectInfo) error {
	data, err := json.Marshal(oi)
	if err != nil {
		return fmt.Errorf("objectstore: %s: put %q: encode meta: %w", w.s.bucket, w.name, err)
	}
	m := nats.NewMsg(metaSubject(w.s.bucket, w.name))
	m.Header.Set(hdrRollup, rollupSubject)
	m.Data = data
	m.Reply = w.inbox + "." + replyMeta
	timer := time.NewTimer(w.s.opts.timeout)
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if attempt > w.s.opts.retries {
				return fmt.Errorf("%w: %s: put %q: meta: %v (gave up after %d retries)", ErrRefused, w.s.bucket, w.name, w.lastErr, w.s.opts.retries)
			}
			if err := sleepCtx(ctx, backoff(attempt, 20*time.Millisecond)); err != nil {
				return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, err)
			}
		}
		if err := w.s.nc.PublishMsg(m); err != nil {
			return fmt.Errorf("objectstore: %s: put %q: publish meta: %w", w.s.bucket, w.name, err)
		}
		w.metaSent = true
		timer.Reset(w.s.opts.timeout)
	wait:
		for {
			select {
			case r := <-w.acks:
				switch r.Subject[strings.LastIndexByte(r.Subject, '.')+1:] {
				case replyPrev:
					w.takePrev(r)
				case replyMeta:
					retry, err := ackResult(r)
					if err == nil {
						return nil
					}
					if !retry {
						return fmt.Errorf("%w: %s: put %q: meta: %v", ErrRefused, w.s.bucket, w.name, err)
					}
					w.lastErr = err
					break wait
				}
			case <-timer.C:
				w.lastErr = fmt.Errorf("no ack for the meta within %v", w.s.opts.timeout)
				break wait
			case <-ctx.Done():
				return fmt.Errorf("objectstore: %s: put %q: %w", w.s.bucket, w.name, ctx.Err())
			}
		}
	}
}

// waitPrev waits (bounded) for the previous meta asked for at the start.
func (w *writer) waitPrev(ctx context.Context) {
	if !w.prevAsked || w.prevDone {
		return
	}
	timer := time.NewTimer(w.s.opts.timeout)
	defer timer.Stop()
	for !w.prevDone {
		select {
		case m := <-w.acks:
			if strings.HasSuffix(m.Subject, "."+replyPrev) {
				w.takePrev(m)
			}
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// dropOld purges what the new object replaced (unless keepPrev): the previous object's
// chunks (or parts) and any subject abandoned after a timeout. Failures
// only leave garbage that the bucket's TTL removes.
func (w *writer) dropOld(ctx context.Context, keepPrev bool) {
	ctx, cancel := w.s.cleanupContext(ctx)
	defer cancel()
	for _, nuid := range w.abandoned {
		w.purgeQuietly(ctx, nuid)
	}
	p := w.prev
	if keepPrev || p == nil || p.Deleted || p.NUID == "" || p.NUID == w.nuid {
		return
	}
	if _, ok := partsOf(p); ok {
		if man, err := w.s.readManifest(ctx, p); err == nil {
			for _, part := range man.Parts {
				_ = w.s.Delete(ctx, part.Name)
			}
		}
	}
	w.purgeQuietly(ctx, p.NUID)
}

// rollback waits briefly for chunks still in flight, undoes the meta if
// it may have been stored, then purges every subject this writer used.
func (w *writer) rollback(ctx context.Context) {
	ctx, cancel := w.s.cleanupContext(ctx)
	defer cancel()
	if w.metaSent {
		w.undoMeta(ctx)
	}
	grace := time.NewTimer(min(w.s.opts.timeout, 2*time.Second))
	defer grace.Stop()
	for w.inflight > 0 {
		select {
		case m := <-w.acks:
			tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < w.n && w.state[i] == chunkInFlight {
				w.state[i] = chunkFailed
				w.inflight--
			}
		case <-grace.C:
			w.inflight = 0
		}
	}
	for _, nuid := range append(w.abandoned, w.nuid) {
		w.purgeQuietly(ctx, nuid)
	}
}

// undoMeta runs when the meta's ack did not come: if the meta was stored
// after all, the previous object's meta is put back, or a delete marker
// when there was none, so that no meta points at purged chunks.
func (w *writer) undoMeta(ctx context.Context) {
	w.waitPrev(ctx)
	cur, _, err := w.s.readMeta(ctx, w.name)
	if err != nil || cur.NUID != w.nuid {
		return
	}
	if p := w.prev; p != nil && !p.Deleted {
		restored := *p
		restored.ModTime = time.Time{}
		_ = w.s.publishMeta(ctx, &restored)
		return
	}
	_ = w.s.markDeleted(ctx, cur)
}

func (w *writer) purgeQuietly(ctx context.Context, nuid string) {
	_ = w.s.purge(ctx, nuid)
}

// backoff is base doubled per attempt, at most a second.
func backoff(attempt int, base time.Duration) time.Duration {
	return min(base<<min(attempt-1, 10), time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
