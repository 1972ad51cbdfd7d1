package objectstore

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PutOption adjusts one Put.
type PutOption func(*putConfig)

type putConfig struct {
	nuid   string
	digest *[sha256.Size]byte
	nameOf func(sum [sha256.Size]byte) string
	yield  func(ctx context.Context) error
}

// WithYield has Put call yield before it sends each chunk: a write that
// should give way to other work (a checkpoint beside a device's frames)
// waits in it. An error from yield fails the write.
func WithYield(yield func(ctx context.Context) error) PutOption {
	return func(c *putConfig) { c.yield = yield }
}

// WithNUID has Put write the chunks on the subject of nuid, which the
// caller made with NewNUID and announced to a reader (see Follow) before
// writing. Should the writer have to start over on a new subject (after an
// ack timeout), it does, and a reader that follows nuid reads the object
// again from its meta. A parted Put ignores it.
func WithNUID(nuid string) PutOption {
	return func(c *putConfig) { c.nuid = nuid }
}

// WithSHA256 gives Put the data's SHA-256, computed by the caller, so that
// it is not computed again. Such an object's meta carries no CRC-32 (see
// hdrCRC32), so readers check the digest, and a wrong one makes every read
// of the object fail with ErrDigest.
func WithSHA256(sum [sha256.Size]byte) PutOption {
	return func(c *putConfig) { c.digest = &sum }
}

// WithNameFromDigest has Put name the object by its content: Put is
// called with an empty name, computes the SHA-256 of the data beside the
// write, and names the object nameOf(sum). nameOf runs on the digest's
// goroutine as soon as the digest is known, usually well before the last
// chunk is stored (hashing runs faster than the broker stores), so a
// caller that also gave WithNUID can announce the object to a reader while
// it is written. The name is written with the meta, last; until then the
// chunks are under the nuid alone. A name nameOf gives that is empty fails
// the Put. If that name holds the same bytes already (an object written
// by another Put), the Put stops writing, purges its chunks and returns
// the stored object's Info: an object named by its content is never
// replaced, as readers may be copying its chunks.
func WithNameFromDigest(nameOf func(sum [sha256.Size]byte) string) PutOption {
	return func(c *putConfig) { c.nameOf = nameOf }
}

// NewNUID makes a chunk subject token for WithNUID: 128 random bits.
func NewNUID() string { return newNUID() }

var validNUID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidNUID checks a chunk subject token that came from elsewhere (a
// message, a key-value entry) before it is used to build a subject.
func ValidNUID(nuid string) error {
	if !validNUID.MatchString(nuid) {
		return fmt.Errorf("%w: chunk subject token %q (want 1 to 64 of A-Z a-z 0-9 _ -)", ErrInvalidOption, nuid)
	}
	return nil
}

// hdrError carries a writer's reason in the headers of a delete marker
// written by Abort.
const hdrError = "Jetfabric-Error"

// Abort tells a reader that follows name that its object will not come:
// it writes a delete marker carrying reason, so Follow and Get fail with
// ErrNotFound and the reason. Chunks the writer stored under nuid (if
// any) are purged.
func (s *Store) Abort(ctx context.Context, name, nuid, reason string) error {
	return s.deleteAs(ctx, name, nuid, map[string][]string{hdrError: {reason}})
}

// Discard deletes object name, written on the chunk subject nuid, without
// reading its meta first: for a reader done with an object it followed,
// whose copy of the meta can come before the stream stores it (a
// subscriber gets a message first), when Delete would find nothing to
// delete yet. The delete marker replaces the meta all the same: the stream
// stores the writer's meta before a marker published after it was read.
func (s *Store) Discard(ctx context.Context, name, nuid string) error {
	return s.deleteAs(ctx, name, nuid, nil)
}

// deleteAs publishes a delete marker for name with headers, and purges
// the chunk subject nuid.
func (s *Store) deleteAs(ctx context.Context, name, nuid string, headers map[string][]string) error {
	if name == "" {
		return fmt.Errorf("%w: empty object name", ErrInvalidOption)
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	oi := &jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Headers: headers},
		Bucket:     s.bucket,
		NUID:       nuid,
		Deleted:    true,
	}
	if err := s.publishMeta(ctx, oi); err != nil {
		return fmt.Errorf("objectstore: %s: delete %q: %w", s.bucket, name, err)
	}
	if nuid != "" && ValidNUID(nuid) == nil {
		return s.purge(ctx, nuid)
	}
	return nil
}

// Follow reads object name into dst while its writer may still be writing
// it: the writer announced nuid (Put with WithNUID) and len(dst) is the
// object's size. One ordered consumer delivers the chunk subject and the
// meta subject in stream order, so chunks are copied and hashed as the
// broker stores them, and the meta, which a writer publishes only after
// its last chunk, ends the read. The meta must name nuid and match the
// size and the CRC-32 (or SHA-256) read. If it names another subject (the writer
// started over, or another writer of the same name won), or the chunks do
// not match it, Follow reads the object again from its meta as GetInto
// does. A delete marker ends it with ErrNotFound and the writer's reason
// when Abort gave one. So does a writer that stops: nothing new for the
// store's timeout (WithTimeout) ends it with an error. An object that is
// already complete is read as GetInto reads it, with no consumer.
func (s *Store) Follow(ctx context.Context, name, nuid string, dst []byte) (Info, error) {
	if name == "" {
		return Info{}, fmt.Errorf("%w: empty name", ErrNotFound)
	}
	if err := ValidNUID(nuid); err != nil {
		return Info{}, err
	}
	// An object already complete is read with batched direct gets, which
	// need no consumer on the broker.
	if oi, _, err := s.readMeta(ctx, name); err == nil && !oi.Deleted {
		if oi.NUID != nuid {
			return s.GetInto(ctx, name, dst)
		}
		if int64(len(dst)) != int64(oi.Size) {
			return info(oi), fmt.Errorf("%w: %q in bucket %s is %d bytes, destination is %d", ErrSize, name, s.bucket, oi.Size, len(dst))
		}
		return info(oi), s.read(ctx, oi, dst)
	}
	if in, ok, err := s.followLive(ctx, name, nuid, dst); ok {
		return in, err
	}
	// The live read could not account for every chunk: read the chunk
	// subject from its start, in stream order.
	chunks, meta := chunkSubject(s.bucket, nuid), metaSubject(s.bucket, name)
	cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{chunks, meta},
		InactiveThreshold: waitInactive,
	})
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Info{}, fmt.Errorf("objectstore: %s: follow %q: %w", s.bucket, name, err)
	}
	defer s.dropConsumer(ctx, cons)
	it, err := cons.Messages(jetstream.PullMaxBytes(s.opts.followAhead))
	if err != nil {
		return Info{}, fmt.Errorf("objectstore: %s: follow %q: %w", s.bucket, name, err)
	}
	defer it.Stop()
	// A writer that stops (its process died) must not hold the reader
	// until ctx ends: after the store's timeout with nothing new, the
	// read fails.
	idle, stall := context.WithCancelCause(ctx)
	defer stall(nil)
	errStalled := fmt.Errorf("%w: nothing written for %v", ErrStalled, s.opts.timeout)
	timer := time.AfterFunc(s.opts.timeout, func() { stall(errStalled) })
	defer timer.Stop()
	h := crc32.NewIEEE() // the meta, which says what to check, comes last
	off, n, fits := 0, 0, true
	for {
		msg, err := it.Next(jetstream.NextContext(idle))
		if err != nil {
			switch {
			case ctx.Err() != nil:
				err = ctx.Err()
			case context.Cause(idle) != nil:
				err = context.Cause(idle)
			}
			return Info{}, fmt.Errorf("objectstore: %s: follow %q: %d of %d bytes read: %w", s.bucket, name, off, len(dst), err)
		}
		timer.Reset(s.opts.timeout)
		if msg.Subject() == chunks {
			data := msg.Data()
			if !fits || off+len(data) > len(dst) {
				fits = false // read again from the meta when it comes
				continue
			}
			copy(dst[off:], data)
			h.Write(data)
			off += len(data)
			n++
			continue
		}
		var oi jetstream.ObjectInfo
		if err := json.Unmarshal(msg.Data(), &oi); err != nil {
			return Info{}, fmt.Errorf("%w: %q in bucket %s: meta is not ObjectInfo JSON: %v", ErrDigest, name, s.bucket, err)
		}
		if oi.Deleted {
			if oi.NUID == nuid || oi.Headers != nil && oi.Headers.Get(hdrError) != "" {
				return Info{}, s.deleted(name, &oi)
			}
			continue // an earlier object of that name, deleted
		}
		if md, err := msg.Metadata(); err == nil {
			oi.ModTime = md.Timestamp
		}
		if target, err := s.resolveLink(ctx, name, &oi); err == nil && target.NUID == nuid {
			oi = *target // an alias of the object written on nuid
		}
		if oi.NUID != nuid || !fits || !followed(&oi, h.Sum32(), dst, off, n) {
			return s.GetInto(ctx, name, dst)
		}
		return info(&oi), nil
	}
}

// followed reports whether what a follower read into dst matches the
// meta: size bytes in chunks chunks, whose CRC-32 is crc (see verifyData).
func followed(oi *jetstream.ObjectInfo, crc uint32, dst []byte, size, chunks int) bool {
	if _, parted := partsOf(oi); parted || oi.Opts != nil && oi.Opts.Link != nil {
		return false
	}
	if _, err := parseDigest(oi.Digest); err != nil || oi.Size != uint64(len(dst)) || size != len(dst) || int(oi.Chunks) != chunks {
		return false
	}
	return verifyData(oi, crc, dst) == nil
}
