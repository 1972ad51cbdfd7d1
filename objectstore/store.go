package objectstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Store reads and writes objects in one existing object bucket. It is safe
// for concurrent use; each call works on its own subscriptions.
type Store struct {
	js        jetstream.JetStream
	nc        *nats.Conn
	stream    jetstream.Stream
	bucket    string
	directGet string // <api>DIRECT.GET.OBJ_<bucket>
	opts      options
}

// Info describes a stored object.
type Info struct {
	Name   string
	Size   int64
	SHA256 string            // hex
	Meta   map[string]string // caller metadata, e.g. "dtype": "f32", "shape": "2,3"
	// ModTime is when the broker stored the object's meta.
	ModTime time.Time
	// Parts is how many parts a parted object has (see WithParts); 0 for
	// an ordinary object.
	Parts int
}

var validBucket = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// New binds to the object bucket, which must exist (ErrBucketNotFound
// otherwise); looking it up is bounded by WithTimeout. The chunk size must
// fit the connection's max_payload and the bucket's max message size
// (ErrInvalidOption otherwise). The bucket's stream must allow direct gets,
// as every object bucket made by nats.go, the nats CLI or the broker does.
func New(js jetstream.JetStream, bucket string, opts ...Option) (*Store, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidOption)
	}
	if !validBucket.MatchString(bucket) {
		return nil, fmt.Errorf("%w: bucket name %q (allowed: A-Z a-z 0-9 _ -)", ErrInvalidOption, bucket)
	}
	o := defaultOptions()
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	jo := js.Options()
	if o.timeout == 0 {
		o.timeout = jo.DefaultTimeout
		if o.timeout <= 0 {
			o.timeout = 5 * time.Second
		}
	}
	if o.partThreshold < int64(o.chunkSize) {
		return nil, fmt.Errorf("%w: part threshold %d is under the chunk size %d", ErrInvalidOption, o.partThreshold, o.chunkSize)
	}
	nc := js.Conn()
	if mp := nc.MaxPayload(); mp > 0 && int64(o.chunkSize) > mp {
		return nil, fmt.Errorf("%w: chunk size %d is over the connection's max_payload %d", ErrInvalidOption, o.chunkSize, mp)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	name := fmt.Sprintf(streamNameTmpl, bucket)
	stream, err := js.Stream(ctx, name)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("%w: %s (stream %s does not exist)", ErrBucketNotFound, bucket, name)
		}
		return nil, fmt.Errorf("objectstore: bucket %s: %w", bucket, err)
	}
	cfg := stream.CachedInfo().Config
	if !slices.Contains(cfg.Subjects, fmt.Sprintf(chunksAllTmpl, bucket)) {
		return nil, fmt.Errorf("%w: %s (stream %s is not an object bucket: subjects %v)", ErrBucketNotFound, bucket, name, cfg.Subjects)
	}
	if !cfg.AllowDirect {
		return nil, fmt.Errorf("objectstore: bucket %s: stream %s does not allow direct gets, which reads need", bucket, name)
	}
	if cfg.MaxMsgSize > 0 && o.chunkSize > int(cfg.MaxMsgSize) {
		return nil, fmt.Errorf("%w: chunk size %d is over bucket %s's max message size %d", ErrInvalidOption, o.chunkSize, bucket, cfg.MaxMsgSize)
	}
	return &Store{
		js:        js,
		nc:        nc,
		stream:    stream,
		bucket:    bucket,
		directGet: fmt.Sprintf(directGetTmpl, apiPrefix(jo.Domain, jo.APIPrefix), name),
		opts:      o,
	}, nil
}

// Bucket is the name of the bucket the store works on.
func (s *Store) Bucket() string { return s.bucket }

// MaxBytes is the most bytes the bucket's stream holds (-1 or 0: no limit).
func (s *Store) MaxBytes() int64 { return s.stream.CachedInfo().Config.MaxBytes }

// Free is how many more bytes the bucket's stream holds before it refuses
// writes, as the server counts them now (-1: no limit).
func (s *Store) Free(ctx context.Context) (int64, error) {
	max := s.MaxBytes()
	if max <= 0 {
		return -1, nil
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	si, err := s.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("objectstore: %s: %w", s.bucket, err)
	}
	return max - int64(si.State.Bytes), nil
}

// InMemory says whether the bucket's stream keeps its messages in memory.
func (s *Store) InMemory() bool {
	return s.stream.CachedInfo().Config.Storage == jetstream.MemoryStorage
}

// withTimeout bounds ctx by the store's timeout when it has no deadline.
func (s *Store) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.opts.timeout)
}

// cleanupContext outlives a cancelled caller: rollbacks still run.
func (s *Store) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.opts.timeout)
}

// readMeta returns the object's current meta (deleted ones included), or
// ErrNotFound when the name has none.
func (s *Store) readMeta(ctx context.Context, name string) (*jetstream.ObjectInfo, nats.Header, error) {
	if name == "" {
		return nil, nil, fmt.Errorf("%w: empty name", ErrNotFound)
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	m, err := s.nc.RequestWithContext(ctx, s.directGet+"."+metaSubject(s.bucket, name), nil)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, nil, fmt.Errorf("objectstore: %s: read meta of %q: bucket stream unavailable: %w", s.bucket, name, err)
		}
		return nil, nil, fmt.Errorf("objectstore: %s: read meta of %q: %w", s.bucket, name, err)
	}
	return decodeMeta(m, s.bucket, name)
}

func decodeMeta(m *nats.Msg, bucket, name string) (*jetstream.ObjectInfo, nats.Header, error) {
	switch st := status(m); st {
	case "":
	case statusNotFound:
		return nil, nil, fmt.Errorf("%w: %q in bucket %s", ErrNotFound, name, bucket)
	default:
		return nil, nil, fmt.Errorf("objectstore: %s: read meta of %q: status %s %s", bucket, name, st, m.Header.Get(hdrDesc))
	}
	var oi jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &oi); err != nil {
		return nil, nil, fmt.Errorf("%w: %q in bucket %s: meta is not ObjectInfo JSON: %v", ErrDigest, name, bucket, err)
	}
	if ts := m.Header.Get(hdrTimeStamp); ts != "" {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			oi.ModTime = t
		}
	}
	return &oi, m.Header, nil
}

// info turns a meta into the caller's view; for a manifest the size and
// digest are the whole object's.
func info(oi *jetstream.ObjectInfo) Info {
	in := Info{
		Name:    oi.Name,
		Size:    int64(oi.Size),
		SHA256:  hexDigest(oi.Digest),
		ModTime: oi.ModTime,
	}
	if len(oi.Metadata) > 0 {
		in.Meta = maps.Clone(oi.Metadata)
	}
	if n, ok := partsOf(oi); ok {
		in.Parts = n
		in.Size, _ = strconv.ParseInt(oi.Headers.Get(hdrSize), 10, 64)
		in.SHA256 = oi.Headers.Get(hdrSHA256)
	}
	return in
}

// partsOf reports whether oi is a parted object's manifest.
func partsOf(oi *jetstream.ObjectInfo) (int, bool) {
	if oi.Headers == nil {
		return 0, false
	}
	v := oi.Headers.Get(hdrParts)
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// Stat returns the object's Info, or ErrNotFound.
func (s *Store) Stat(ctx context.Context, name string) (Info, error) {
	oi, _, err := s.readMeta(ctx, name)
	if err != nil {
		return Info{}, err
	}
	if oi.Deleted {
		return Info{}, fmt.Errorf("%w: %q in bucket %s was deleted", ErrNotFound, name, s.bucket)
	}
	return info(oi), nil
}

// Wait blocks until the object exists and is complete, and returns its
// Info, or until ctx ends (the context's error, wrapped). A writer
// publishes an object's meta only after every chunk is stored, so Wait
// watches that one meta subject with an ordered consumer; it never lists
// the bucket.
func (s *Store) Wait(ctx context.Context, name string) (Info, error) {
	if name == "" {
		return Info{}, fmt.Errorf("%w: empty name", ErrNotFound)
	}
	// Most waits find the object already written: a direct get of its
	// meta answers in one round trip, with no consumer to create.
	if in, err := s.Stat(ctx, name); err == nil {
		return in, nil
	}
	subj := metaSubject(s.bucket, name)
	cons, err := s.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		// The consumer is deleted when Wait returns; should that fail,
		// the broker drops it soon after.
		InactiveThreshold: waitInactive,
	})
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return Info{}, fmt.Errorf("objectstore: %s: wait for %q: watch meta: %w", s.bucket, name, err)
	}
	defer s.dropConsumer(ctx, cons)
	it, err := cons.Messages()
	if err != nil {
		return Info{}, fmt.Errorf("objectstore: %s: wait for %q: watch meta: %w", s.bucket, name, err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return Info{}, fmt.Errorf("objectstore: %s: wait for %q: %w", s.bucket, name, ctx.Err())
			}
			return Info{}, fmt.Errorf("objectstore: %s: wait for %q: %w", s.bucket, name, err)
		}
		var oi jetstream.ObjectInfo
		if err := json.Unmarshal(msg.Data(), &oi); err != nil || oi.Deleted {
			continue
		}
		if md, err := msg.Metadata(); err == nil {
			oi.ModTime = md.Timestamp
		}
		return info(&oi), nil
	}
}

// waitInactive is how long the broker keeps a Wait's consumer once its
// client is gone.
const waitInactive = 2 * time.Second

// dropConsumer deletes an ordered consumer's current server-side consumer.
func (s *Store) dropConsumer(ctx context.Context, cons jetstream.Consumer) {
	ci := cons.CachedInfo()
	if ci == nil || ci.Name == "" {
		return
	}
	ctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	_ = s.js.DeleteConsumer(ctx, ci.Stream, ci.Name)
}

// Delete removes the object as nats.go does: a meta marked deleted
// replaces the old one, then the chunks are purged (for a parted object,
// every part too). Deleting a deleted object does nothing; a name that was
// never written gives ErrNotFound.
func (s *Store) Delete(ctx context.Context, name string) error {
	oi, _, err := s.readMeta(ctx, name)
	if err != nil {
		return err
	}
	if oi.Deleted {
		return nil
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	var parts []string
	if _, ok := partsOf(oi); ok {
		// Read the manifest before its chunks go.
		var man manifest
		if man, err = s.readManifest(ctx, oi); err != nil && !errors.Is(err, ErrDigest) {
			return err
		}
		for _, p := range man.Parts {
			parts = append(parts, p.Name)
		}
	}
	if err := s.markDeleted(ctx, oi); err != nil {
		return err
	}
	if err := s.purge(ctx, oi.NUID); err != nil {
		return err
	}
	var errs []error
	for _, p := range parts {
		if err := s.Delete(ctx, p); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// markDeleted publishes the delete marker: the meta with Deleted set and
// no size, chunks or digest, rolled up over the old one.
func (s *Store) markDeleted(ctx context.Context, oi *jetstream.ObjectInfo) error {
	del := *oi
	del.Deleted = true
	del.Size, del.Chunks, del.Digest = 0, 0, ""
	del.ModTime = time.Time{}
	if err := s.publishMeta(ctx, &del); err != nil {
		return fmt.Errorf("objectstore: %s: delete %q: %w", s.bucket, oi.Name, err)
	}
	return nil
}

func (s *Store) publishMeta(ctx context.Context, oi *jetstream.ObjectInfo) error {
	data, err := json.Marshal(oi)
	if err != nil {
		return fmt.Errorf("encode meta: %w", err)
	}
	m := nats.NewMsg(metaSubject(s.bucket, oi.Name))
	m.Header.Set(hdrRollup, rollupSubject)
	m.Data = data
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("write meta: %w", err)
	}
	return nil
}

// purge drops every chunk of the object with this NUID.
func (s *Store) purge(ctx context.Context, nuid string) error {
	if nuid == "" {
		return nil
	}
	subj := chunkSubject(s.bucket, nuid)
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("objectstore: %s: purge %s: %w", s.bucket, subj, err)
	}
	return nil
}

// Link writes name as a link to object target in the same bucket, as
// nats.go's AddLink does: a meta with no chunks that Get, GetInto, Follow
// and the nats CLI resolve to the target. A target that is itself a link
// is resolved first (links to links are not followed). Writing a link over
// an object of that name replaces it; its chunks are not purged.
func (s *Store) Link(ctx context.Context, name, target string) (Info, error) {
	if name == "" || target == "" || name == target {
		return Info{}, fmt.Errorf("%w: link %q to %q", ErrInvalidOption, name, target)
	}
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	to, err := s.current(ctx, target)
	if err != nil {
		return Info{}, fmt.Errorf("objectstore: %s: link %q to %q: %w", s.bucket, name, target, err)
	}
	oi := &jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{Link: &jetstream.ObjectLink{Bucket: s.bucket, Name: to.Name}}},
		Bucket:     s.bucket,
		NUID:       newNUID(),
		ModTime:    time.Now().UTC(),
	}
	if err := s.publishMeta(ctx, oi); err != nil {
		return Info{}, fmt.Errorf("objectstore: %s: link %q to %q: %w", s.bucket, name, to.Name, err)
	}
	return info(to), nil
}
