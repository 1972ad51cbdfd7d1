package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

// Transfers move tensors between devices through FABRIC_XFER: the source
// writes the tensor as an object, the target waits for it and reads it.
// Workers never talk to each other.
//
// The writer announces each object in FABRIC_CTRL (key xfer.<object>),
// and its reads are counted in a key of their own (xread.<object>) by
// reader identity (device, frame sequence, op index), so a bounded number
// of ops may read it, and an op replayed after a takeover may read it
// again. A reader deletes an object it read last only after its device's
// next checkpoint commits: until then a replay may need it again.

const (
	opExpose        = "expose"
	opImport        = "import"
	opAllReduce     = "all_reduce"
	opAllGather     = "all_gather"
	opReduceScatter = "reduce_scatter"
	opBroadcast     = "broadcast"

	defaultTimeout = time.Minute
	maxGroupSize   = 1024
)

// readCount is the value of xfer.<object>, the announcement. The writer
// creates it before it writes the object, naming the chunk subject it will
// write (NUID) and the tensor's dtype and shape, so a reader can allocate
// the destination and copy the chunks as the broker stores them
// (objectstore.Follow), and the number of reads it allows (Max).
//
// A tensor of at most inlineMax bytes travels in the value itself (Data),
// with no object: one key-value write and its reads, none of which waits
// behind the chunks of large objects in the transfer bucket (the small
// all_reduce that ends a data-parallel step's backward, while the large one
// of the same step is still moving).
type readCount struct {
	Max    int    `json:"max"`
	Writer string `json:"writer"`
	NUID   string `json:"nuid,omitempty"`
	DType  string `json:"dtype,omitempty"`
	Shape  string `json:"shape,omitempty"`
	// Data is the bytes of an inline transfer, a base64 JSON string: kept
	// encoded, and decoded only into the reader's tensor (decodeInline).
	Data json.RawMessage `json:"data,omitempty"`
}

// readList is the value of xread.<object>: who has read it. The writer
// creates it empty before the announcement, so a reader that saw the
// announcement finds it, and each reader adds itself by compare-and-set.
// It is a key of its own so that counting a read rewrites a few bytes,
// not an inline transfer's data, which every reader of the announcement
// would otherwise fetch, decode and write back, again at every lost race.
type readList struct {
	Readers []string `json:"readers"`
}

// encode is rc as JSON. Data, already JSON, is appended as it is: the
// encoder would scan all of it again.
func (rc readCount) encode() []byte {
	data := rc.Data
	rc.Data = nil
	b, _ := json.Marshal(rc)
	if len(data) == 0 {
		return b
	}
	out := make([]byte, 0, len(b)+len(data)+len(`,"data":`))
	out = append(out, b[:len(b)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	return append(out, '}')
}

// inline reports whether the announcement holds the bytes (a JSON null
// holds none, as an absent field).
func (rc *readCount) inline() bool { return len(rc.Data) > 0 && string(rc.Data) != "null" }

// encodeInline is data as readCount.Data.
func encodeInline(data []byte) json.RawMessage {
	b := make([]byte, 0, base64.StdEncoding.EncodedLen(len(data))+2)
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, data)
	return append(b, '"')
}

// inlineSize is the number of bytes readCount.Data holds, where its length
// tells (it does as encodeInline writes it).
func inlineSize(raw json.RawMessage) (int, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' || bytes.IndexByte(raw, '\\') >= 0 {
		return 0, false
	}
	s := raw[1 : len(raw)-1]
	if len(s)%4 != 0 {
		return 0, false
	}
	return len(s)/4*3 - (len(s) - len(bytes.TrimRight(s, "="))), true
}

// decodeInline decodes readCount.Data into dst, which must be as long as
// the bytes it holds.
func decodeInline(raw json.RawMessage, dst []byte) error {
	var s []byte
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		s = raw[1 : len(raw)-1]
	}
	if s == nil || bytes.IndexByte(s, '\\') >= 0 {
		// Not as encodeInline writes it (another writer's escapes): the
		// JSON decoder's way.
		var b []byte
		if err := json.Unmarshal(raw, &b); err != nil {
			return err
		}
		if len(b) != len(dst) {
			return fmt.Errorf("it holds %d bytes, %d expected", len(b), len(dst))
		}
		copy(dst, b)
		return nil
	}
	if len(s) != base64.StdEncoding.EncodedLen(len(dst)) {
		return fmt.Errorf("it holds %d base64 characters, %d bytes need %d", len(s), len(dst), base64.StdEncoding.EncodedLen(len(dst)))
	}
	if len(s) == 0 {
		return nil
	}
	// All but the last quantum straight into dst; the last, which padding
	// may shorten, through a scratch, so that no input writes past dst.
	head := len(s) - 4
	n, err := base64.StdEncoding.Decode(dst[:head/4*3], s[:head])
	if err != nil {
		return err
	}
	var last [3]byte
	k, err := base64.StdEncoding.Decode(last[:], s[head:])
	if err != nil {
		return err
	}
	if n+k != len(dst) {
		return fmt.Errorf("it holds %d bytes, %d expected", n+k, len(dst))
	}
	copy(dst[n:], last[:k])
	return nil
}

// inlineMax is the size up to which a transfer's bytes travel in its
// announcement (readCount.Data, base64 in its JSON).
const inlineMax = 128 << 10

// identity names op i of the frame for read counting.
func (x *exec) identity(i int) string {
	return x.d.cfg.Name + "/" + strconv.FormatUint(x.seq, 10) + "/" + strconv.Itoa(i)
}

func (x *exec) timeout(op *codec.Op) time.Duration {
	if op.TimeoutMS > 0 {
		return time.Duration(op.TimeoutMS) * time.Millisecond
	}
	return defaultTimeout
}

// mover moves one op's tensors through the object store. It touches no
// state of the device loop: what it moved and the transfer objects it read
// last are kept on it, under mu (a collective moves its pieces from
// several goroutines), until the loop takes them (exec.moved, or the
// settling of a collective in flight). Its worker's fields are set once.
type mover struct {
	w        *Worker
	mu       sync.Mutex
	io       ioCount
	consumed []string
}

// mover returns a mover for one op of the frame.
func (x *exec) mover() *mover { return &mover{w: x.d.w} }

// moved takes what mv moved into the frame's counts and the objects it
// read last into the device's consumed list. Device loop only, once mv's
// op is done with it.
func (x *exec) moved(mv *mover) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	x.io.add(&mv.io)
	x.d.consumed = append(x.d.consumed, mv.consumed...)
	mv.io, mv.consumed = ioCount{}, nil
}

// publish writes data as object name for reads readers, with the tensor's
// meta. The same op may write it again (a replay after a takeover): an
// object already complete is left as it is, since the op gives the same
// bits; otherwise it is written on a new chunk subject.
func (mv *mover) publish(ctx context.Context, name string, m kernels.Meta, data []byte, reads int, who string) error {
	w := mv.w
	key := subjects.TransferKey(name)
	rc := readCount{Max: reads, Writer: who, DType: m.DType.String(), Shape: shapeString(m.Shape)}
	inline := len(data) > 0 && len(data) <= inlineMax
	if inline {
		rc.Data = encodeInline(data)
	} else {
		rc.NUID = objectstore.NewNUID()
	}
	// The read list first: once the announcement is seen, it is there.
	if _, err := w.ctrl.Create(ctx, subjects.TransferReadsKey(name), []byte(`{"readers":[]}`)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return failf(codec.CodeUnavailabe, "transfer %s: read list: %v", name, err)
	}
	if _, err := w.ctrl.Create(ctx, key, rc.encode()); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return failf(codec.CodeUnavailabe, "transfer %s: %v", name, err)
		}
		e, gerr := w.ctrl.Get(ctx, key)
		var prev readCount
		if gerr != nil || json.Unmarshal(e.Value(), &prev) != nil || prev.Writer != who {
			return failf(codec.CodeDuplicate, "transfer %s was already written by another op; transfer ids are never reused", name)
		}
		if inline || prev.inline() {
			return nil // the value holds the bytes: written whole before
		}
		if _, err := w.xfer[0].Stat(ctx, name); err == nil {
			return nil
		}
		prev.NUID, prev.DType, prev.Shape = rc.NUID, rc.DType, rc.Shape
		if _, err := w.ctrl.Update(ctx, key, prev.encode(), e.Revision()); err != nil {
			return failf(codec.CodeUnavailabe, "transfer %s: announce: %v", name, err)
		}
	}
	if inline {
		mv.mu.Lock()
		mv.io.outObject += uint64(len(data))
		mv.mu.Unlock()
		return nil
	}
	if _, err := w.xfer[0].Put(ctx, name, data, map[string]string{"dtype": rc.DType, "shape": rc.Shape}, objectstore.WithNUID(rc.NUID)); err != nil {
		// Readers following the chunks learn at once that none will come.
		_ = w.xfer[0].Abort(context.WithoutCancel(ctx), name, rc.NUID, err.Error())
		return failf(codec.CodeUnavailabe, "transfer %s: %v", name, err)
	}
	mv.mu.Lock()
	mv.io.outObject += uint64(len(data))
	mv.mu.Unlock()
	return nil
}

// fetchObject waits for object name, counts this read by who, checks the
// tensor meta against want (a nil shape or an Invalid dtype accepts any)
// and reads it into a new host buffer.
func (mv *mover) fetchObject(ctx context.Context, name string, who string, want kernels.Meta) (kernels.Meta, []byte, error) {
	var buf []byte
	m, err := mv.fetchInto(ctx, name, who, want, func(m kernels.Meta) ([]byte, error) {
		buf = make([]byte, m.Bytes())
		return buf, nil
	})
	return m, buf, err
}

// fetchInto is fetchObject reading into the buffer that dst returns for
// the object's meta. Once the writer has announced the object, the chunks
// are copied as they are stored, while the writer is still writing.
func (mv *mover) fetchInto(ctx context.Context, name string, who string, want kernels.Meta, dst func(kernels.Meta) ([]byte, error)) (kernels.Meta, error) {
	rc, err := mv.awaitTransfer(ctx, name)
	if err != nil {
		return kernels.Meta{}, err
	}
	m, err := mv.announced(ctx, name, rc)
	if err != nil {
		return m, err
	}
	if want.DType != kernels.Invalid && want.DType != m.DType || want.Shape != nil && !slices.Equal(want.Shape, m.Shape) {
		return m, failf(codec.CodeShape, "%s holds %v %v, the op expects %v %v", name, m.DType, m.Shape, want.DType, want.Shape)
	}
	if n, ok := inlineSize(rc.Data); ok && n != m.Bytes() {
		return m, failf(codec.CodeUnavailabe, "%s: its announcement holds %d bytes, %v %v needs %d", name, n, m.DType, m.Shape, m.Bytes())
	}
	// The read is counted while the bytes travel: the count bounds the
	// reads and tells the last reader to delete the object, and need not
	// hold the read up. A read past the bound fails all the same.
	counted := make(chan error, 1)
	go func() { counted <- mv.countRead(ctx, name, who, rc.Max) }()
	m, err = mv.readInto(ctx, name, rc, m, dst)
	if cerr := <-counted; cerr != nil {
		return m, cerr
	}
	return m, err
}

// readInto reads object name, announced as rc with meta m, into the
// buffer dst returns.
func (mv *mover) readInto(ctx context.Context, name string, rc readCount, m kernels.Meta, dst func(kernels.Meta) ([]byte, error)) (kernels.Meta, error) {
	w := mv.w
	buf, err := dst(m)
	if err != nil {
		return m, err
	}
	if rc.inline() {
		if err := decodeInline(rc.Data, buf); err != nil {
			return m, failf(codec.CodeUnavailabe, "%s: its announcement's data, for %v %v: %v", name, m.DType, m.Shape, err)
		}
		mv.mu.Lock()
		mv.io.inObject += uint64(len(buf))
		mv.mu.Unlock()
		return m, nil
	}
	for {
		if rc.NUID == "" {
			_, err = w.xfer[0].GetInto(ctx, name, buf) // a writer that announced no subject
			break
		}
		_, err = w.xfer[0].Follow(ctx, name, rc.NUID, buf)
		if !errors.Is(err, objectstore.ErrStalled) || ctx.Err() != nil {
			break
		}
		// The writer stopped. A worker that takes its device over replays
		// the expose and announces a new chunk subject: follow that one.
		stalled := rc.NUID
		if rc, err = mv.awaitAnnouncement(ctx, name, func(r readCount) bool { return r.NUID != stalled }); err != nil {
			return m, err
		}
		if again, err := mv.announced(ctx, name, rc); err != nil || again.DType != m.DType || !slices.Equal(again.Shape, m.Shape) {
			return m, failf(codec.CodeUnavailabe, "%s was announced again as %v %v, first as %v %v (%v)", name, again.DType, again.Shape, m.DType, m.Shape, err)
		}
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return m, failf(codec.CodeUnavailabe, "%s did not arrive within the timeout (its writer stopped, or runs on a device that is down)", name)
	case errors.Is(err, objectstore.ErrDigest):
		return m, failf(codec.CodeUnavailabe, "%s is corrupt: %v", name, err)
	default:
		return m, failf(codec.CodeUnavailabe, "%s: %v", name, err)
	}
	mv.mu.Lock()
	mv.io.inObject += uint64(len(buf))
	mv.mu.Unlock()
	return m, nil
}

// awaitTransfer returns the writer's announcement of object name, waiting
// for it to appear.
func (mv *mover) awaitTransfer(ctx context.Context, name string) (readCount, error) {
	return mv.awaitAnnouncement(ctx, name, func(readCount) bool { return true })
}

// awaitAnnouncement waits for an announcement of object name that accept
// takes.
func (mv *mover) awaitAnnouncement(ctx context.Context, name string, accept func(readCount) bool) (readCount, error) {
	var rc readCount
	var decodeErr error
	err := mv.awaitKey(ctx, subjects.TransferKey(name), func(v []byte) bool {
		var r readCount
		if decodeErr = json.Unmarshal(v, &r); decodeErr != nil {
			return true
		}
		rc = r
		return accept(r)
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return rc, failf(codec.CodeUnavailabe, "%s did not arrive within the timeout (its writer never ran, or ran on a device that is down)", name)
	case err != nil:
		return rc, failf(codec.CodeUnavailabe, "%s: announcement: %v", name, err)
	case decodeErr != nil:
		return rc, failf(codec.CodeUnavailabe, "%s: announcement: %v", name, decodeErr)
	}
	return rc, nil
}

// awaitKey waits until accept takes a value of key in FABRIC_CTRL, the
// current one or a later put. A key-value put is a message on the key's
// subject, so the wait is a plain subscription to it (made before the
// look, so no put is missed), with no consumer on the broker.
func (mv *mover) awaitKey(ctx context.Context, key string, accept func([]byte) bool) error {
	kv, nc := mv.w.ctrl, mv.w.nc
	current := func() (bool, error) {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		return err == nil && accept(e.Value()), err
	}
	// The subscription goes out before the get, on the same connection:
	// the server takes it first, so a put is seen by one or the other (or
	// by the second look below), with one round trip.
	sub, err := nc.SubscribeSync(mv.w.names.CtrlSubject(key))
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if ok, err := current(); ok || err != nil {
		return err
	}
	// A put that reached the broker before the subscription but that the
	// stream had not yet stored at the second look is in neither place:
	// while nothing arrives, look again, at doubling intervals.
	wait := keyRecheck
	for {
		mctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			if ok, err := current(); ok || err != nil {
				return err
			}
			wait = min(2*wait, maxKeyRecheck)
			continue
		}
		// A put; deletes and purges say so in a header.
		if m.Header.Get(kvOperation) == "" && accept(m.Data) {
			return nil
		}
	}
}

// keyRecheck and maxKeyRecheck bound the intervals at which awaitKey looks
// up a key again while its subscription is silent.
const (
	keyRecheck    = 20 * time.Millisecond
	maxKeyRecheck = time.Second
)

// storeLag bounds how long a key may take to be readable after another
// was seen: a core subscriber can get a put before the stream has stored
// it, and a direct get may be answered by a replica that lags.
const storeLag = 2 * time.Second

// kvOperation is the header that marks a key-value delete or purge.
const kvOperation = "KV-Operation"

// announced is the tensor meta a writer announced, checked against the
// limits: it came over the wire.
func (mv *mover) announced(ctx context.Context, name string, rc readCount) (kernels.Meta, error) {
	if rc.DType == "" { // a writer that announced no meta: read it from the object
		info, err := mv.w.xfer[0].Stat(ctx, name)
		if err != nil {
			return kernels.Meta{}, failf(codec.CodeUnavailabe, "%s: %v", name, err)
		}
		m, err := metaOf(info)
		if err != nil {
			return m, failf(codec.CodeUnavailabe, "%s: %v", name, err)
		}
		return m, nil
	}
	if rc.NUID != "" {
		if err := objectstore.ValidNUID(rc.NUID); err != nil {
			return kernels.Meta{}, failf(codec.CodeUnavailabe, "%s: announcement: %v", name, err)
		}
	}
	m, err := parseMeta(rc.DType, rc.Shape)
	if err != nil {
		return m, failf(codec.CodeUnavailabe, "%s: announcement: %v", name, err)
	}
	if err := kernels.CheckShape(m.Shape, mv.w.cfg.Limits.Tensor); err != nil {
		return m, failf(codec.CodeLimit, "%s: %v", name, err)
	}
	return m, nil
}

// countRead records a read of name by who in its read list, refusing
// reads past limit, the announcement's bound.
func (mv *mover) countRead(ctx context.Context, name, who string, limit int) error {
	kv := mv.w.ctrl
	key := subjects.TransferReadsKey(name)
	lag := time.Now().Add(storeLag)
	for wait := 100 * time.Microsecond; ; {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) && time.Now().Before(lag) {
			// The writer stored the list before its announcement, but the
			// server that answers may not have it yet: look again shortly.
			select {
			case <-ctx.Done():
				return failf(codec.CodeUnavailabe, "%s: read list: %v", name, ctx.Err())
			case <-time.After(wait):
			}
			wait = min(2*wait, 10*time.Millisecond)
			continue
		}
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return failf(codec.CodeUnavailabe, "%s is gone: its read list was deleted (read to its limit, or expired), or its writer made none", name)
		}
		if err != nil {
			return failf(codec.CodeUnavailabe, "%s: read list: %v", name, err)
		}
		var rl readList
		if err := json.Unmarshal(e.Value(), &rl); err != nil {
			return failf(codec.CodeUnavailabe, "%s: read list: %v", name, err)
		}
		if slices.Contains(rl.Readers, who) {
			return nil // this op read it before a takeover
		}
		if len(rl.Readers) >= limit {
			return failf(codec.CodeLimit, "%s was already read %d times, its limit", name, limit)
		}
		rl.Readers = append(rl.Readers, who)
		b, _ := json.Marshal(rl)
		if _, err := kv.Update(ctx, key, b, e.Revision()); err == nil {
			if len(rl.Readers) == limit {
				mv.mu.Lock()
				mv.consumed = append(mv.consumed, name)
				mv.mu.Unlock()
			}
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return failf(codec.CodeUnavailabe, "%s: read list: %v", name, err)
		}
	}
}

// dropObjects deletes transfer objects this device read, once a
// checkpoint covers the ops that read them.
func (d *device) dropObjects(ctx context.Context, consumed []string) {
	for _, name := range consumed {
		if err := d.w.xfer[0].Delete(ctx, name); err != nil && !errors.Is(err, objectstore.ErrNotFound) {
			d.w.logf("worker: %s: delete %s: %v", d.cfg.Name, name, err)
		}
		_ = d.w.ctrl.Delete(ctx, subjects.TransferKey(name))
		_ = d.w.ctrl.Delete(ctx, subjects.TransferReadsKey(name))
	}
}

func metaOf(info objectstore.Info) (kernels.Meta, error) {
	m, err := parseMeta(info.Meta["dtype"], info.Meta["shape"])
	if err != nil {
		return m, err
	}
	if int64(m.Bytes()) != info.Size {
		return m, fmt.Errorf("%v %v needs %d bytes, the object holds %d", m.DType, m.Shape, m.Bytes(), info.Size)
	}
	return m, nil
}

// parseMeta reads a tensor meta as objects and announcements spell it.
func parseMeta(dtype, shape string) (kernels.Meta, error) {
	dt, err := kernels.ParseDType(dtype)
	if err != nil || dtype == "" {
		return kernels.Meta{}, fmt.Errorf("not a tensor (dtype %q)", dtype)
	}
	dims := []int{}
	if shape != "" {
		for _, p := range strings.Split(shape, ",") {
			d, err := strconv.Atoi(p)
			if err != nil || d < 0 {
				return kernels.Meta{}, fmt.Errorf("shape %q", shape)
			}
			dims = append(dims, d)
		}
	}
	return kernels.Meta{DType: dt, Shape: dims}, nil
}

func (x *exec) download(t *kernels.Tensor) ([]byte, error) {
	buf := make([]byte, t.Bytes())
	if err := x.d.cfg.Backend.Download(buf, t.Buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// hostMemory is a buffer that lives in host memory (the CPU backend's):
// it is read and written in place, with no copy.
type hostMemory interface{ Host() []byte }

// hostView returns t's bytes in place when its buffer is host memory,
// else nil. Tensors are immutable: a view is only read, or filled before
// the tensor is published.
func hostView(t *kernels.Tensor) []byte {
	if h, ok := t.Buf.(hostMemory); ok {
		if b := h.Host(); len(b) >= t.Bytes() {
			return b[:t.Bytes()]
		}
	}
	return nil
}

// bytesOf returns t's bytes to be read: in place, or a host copy.
func (x *exec) bytesOf(t *kernels.Tensor) ([]byte, error) {
	if b := hostView(t); b != nil {
		return b, nil
	}
	return x.download(t)
}

// place makes output id from host bytes.
func (x *exec) place(id uint64, m kernels.Meta, data []byte) error {
	t, err := x.alloc(m)
	if err != nil {
		return err
	}
	if err := x.d.cfg.Backend.Upload(t.Buf, data); err != nil {
		x.release([]*kernels.Tensor{t})
		return err
	}
	x.s.tensors.set(id, entry{t: t})
	return nil
}

// hostBuffers is a backend that lends page-locked host memory (the CUDA
// backend's): a large upload is read from the object store into it and
// copied to the device from there, a large result downloaded into it and
// written from there, with no pass through the backend's own staging.
type hostBuffers interface {
	HostBuffer(n int) ([]byte, func(), error)
}

// hostBufferMin is the size from which a transfer borrows a backend's
// host buffer.
const hostBufferMin = 8 << 20

// hostBuffer returns n bytes of host memory to fill or read, and the
// function that gives them back: the backend's pinned memory where it
// lends some, else a new slice (then give does nothing). Safe from any
// goroutine.
func (d *device) hostBuffer(n int) (b []byte, give func()) {
	if hb, ok := d.cfg.Backend.(hostBuffers); ok && n >= hostBufferMin && !d.noHostBuffers.Load() {
		b, give, err := hb.HostBuffer(n)
		switch {
		case err == nil:
			return b, give
		case !errors.Is(err, kernels.ErrShape): // a size it does not lend is no failure
			d.noHostBuffers.Store(true)
			d.w.logf("worker: %s: a pinned host buffer of %d bytes: %v; large transfers go through the backend's staging from now on", d.cfg.Name, n, err)
		}
	}
	return make([]byte, n), func() {}
}

// receiver allocates a tensor and the host bytes to fill: the tensor's own
// memory when it lives on the host, else a staging buffer that done
// uploads. Every byte is written before the tensor is placed (a failed
// read drops it), so the buffer is not cleared first. Its owner calls
// done, or drop on failure.
type receiver struct {
	x       *exec
	t       *kernels.Tensor
	host    []byte
	staging bool
	give    func() // gives the staging buffer back
}

func (r *receiver) alloc(m kernels.Meta) ([]byte, error) {
	t, err := r.x.allocFilled(m)
	if err != nil {
		return nil, err
	}
	r.t = t
	if r.host = hostView(t); r.host == nil {
		r.host, r.give = r.x.d.hostBuffer(m.Bytes())
		r.staging = true
	}
	return r.host, nil
}

// done places the filled tensor as output id.
func (r *receiver) done(id uint64) error {
	if r.staging {
		err := r.x.d.cfg.Backend.Upload(r.t.Buf, r.host)
		r.giveBack()
		if err != nil {
			r.drop()
			return err
		}
	}
	r.x.s.tensors.set(id, entry{t: r.t})
	return nil
}

func (r *receiver) drop() {
	r.giveBack()
	if r.t != nil {
		r.x.release([]*kernels.Tensor{r.t})
		r.t = nil
	}
}

// giveBack gives the staging buffer back, once.
func (r *receiver) giveBack() {
	if r.give != nil {
		r.give()
		r.give, r.host = nil, nil
	}
}

// expose writes input 0 under the op's transfer id, for op.Reads imports.
func (x *exec) expose(i int, op *codec.Op) error {
	if len(op.In) != 1 || len(op.Out) != 0 {
		return failf(codec.CodeArity, "expose takes 1 tensor and makes none")
	}
	if err := subjects.ValidateID(op.Transfer); err != nil {
		return failf(codec.CodeAttr, "expose: transfer %v", err)
	}
	reads := max(op.Reads, 1)
	t, err := x.input(op.In[0])
	if err != nil {
		return err
	}
	data, err := x.bytesOf(t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.timeout(op))
	defer cancel()
	mv := x.mover()
	defer x.moved(mv)
	return mv.publish(ctx, subjects.TenantObject(x.s.tenant, subjects.TransferObject(op.Transfer)), t.Meta, data, reads, x.identity(i))
}

// importT waits for the op's transfer and places it as output 0.
func (x *exec) importT(i int, op *codec.Op) error {
	if err := x.claim(op, 1); err != nil {
		return err
	}
	if len(op.In) != 0 {
		return failf(codec.CodeArity, "import takes no input tensor")
	}
	if err := subjects.ValidateID(op.Transfer); err != nil {
		return failf(codec.CodeAttr, "import: transfer %v", err)
	}
	var want kernels.Meta
	if op.DType != "" {
		dt, err := kernels.ParseDType(op.DType)
		if err != nil {
			return err
		}
		want.DType = dt
	}
	want.Shape = op.Shape
	ctx, cancel := context.WithTimeout(context.Background(), x.timeout(op))
	defer cancel()
	r := &receiver{x: x}
	mv := x.mover()
	defer x.moved(mv)
	if _, err := mv.fetchInto(ctx, subjects.TenantObject(x.s.tenant, subjects.TransferObject(op.Transfer)), x.identity(i), want, r.alloc); err != nil {
		r.drop()
		return err
	}
	return r.done(op.Out[0])
}

// collective runs this rank's part of a collective op. Pieces travel
// through the object store; every rank reduces in rank order, so every
// rank gets the same bits. What can be checked here is checked here, and
// fails the op at once; then, on a device whose tensors live in host
// memory, the exchange runs beside the loop (startCollective) and the op
// returns with its output in flight; elsewhere it runs to its end here.
func (x *exec) collective(i int, op *codec.Op) error {
	if err := x.claim(op, 1); err != nil {
		return err
	}
	if err := subjects.ValidateID(op.Group); err != nil {
		return failf(codec.CodeAttr, "%s: group %v", op.Op, err)
	}
	n, r := op.Size, op.Rank
	if n < 1 || n > maxGroupSize || r < 0 || r >= n {
		return failf(codec.CodeAttr, "%s: rank %d of %d (want 0 <= rank < size <= %d)", op.Op, r, n, maxGroupSize)
	}
	red := op.Reduce
	if red == "" {
		red = "sum"
	}
	if !slices.Contains([]string{"sum", "mean", "max", "min"}, red) {
		return failf(codec.CodeAttr, "%s: reduce %q (want sum, mean, max or min)", op.Op, red)
	}
	algo := op.Algo
	if !slices.Contains([]string{"", "scatter", "naive", "direct"}, algo) {
		return failf(codec.CodeAttr, "%s: algo %q (want scatter, naive or direct)", op.Op, algo)
	}
	c := &coll{tenant: x.s.tenant, group: op.Group, n: n, r: r, who: x.identity(i)}

	if op.Op == opBroadcast {
		if op.Root < 0 || op.Root >= n {
			return failf(codec.CodeAttr, "broadcast: root %d of %d", op.Root, n)
		}
		if r != op.Root {
			if len(op.In) != 0 {
				return failf(codec.CodeArity, "broadcast: a rank other than the root takes no tensor")
			}
			// The tensor's meta comes with it: this rank cannot make its
			// output before, so it waits here.
			ctx, cancel := context.WithTimeout(context.Background(), x.timeout(op))
			defer cancel()
			c.ctx, c.mv = ctx, x.mover()
			defer x.moved(c.mv)
			m, data, err := c.get("bc", op.Root, -1, kernels.Meta{})
			if err != nil {
				return err
			}
			return x.place(op.Out[0], m, data)
		}
		if len(op.In) != 1 {
			return failf(codec.CodeArity, "broadcast: the root takes 1 tensor")
		}
	} else if len(op.In) != 1 {
		return failf(codec.CodeArity, "%s takes 1 tensor", op.Op)
	}
	t, err := x.input(op.In[0])
	if err != nil {
		return err
	}
	m := t.Meta
	// work exchanges this rank's bytes, data, and writes its output's into
	// dst; it only reads data.
	var work func(c *coll, data, dst []byte) error
	out := m
	switch op.Op {
	case opBroadcast:
		work = func(c *coll, data, dst []byte) error {
			copy(dst, data)
			return c.put("bc", -1, m, data, n-1)
		}
	case opAllGather:
		if len(m.Shape) == 0 {
			return failf(codec.CodeShape, "all_gather of a scalar; reshape it to [1]")
		}
		out.Shape = slices.Clone(m.Shape)
		out.Shape[0] *= n
		work = func(c *coll, data, dst []byte) error { return c.allGather(m, data, dst) }
	case opReduceScatter:
		if len(m.Shape) == 0 || m.Shape[0]%n != 0 {
			return failf(codec.CodeShape, "reduce_scatter: the first dimension of %v must divide by %d ranks", m.Shape, n)
		}
		if _, err := reducer(m.DType, red); err != nil {
			return err
		}
		out.Shape = slices.Clone(m.Shape)
		out.Shape[0] /= n
		work = func(c *coll, data, dst []byte) error { return c.reduceScatter(m, data, red, dst) }
	default: // all_reduce
		if _, err := reducer(m.DType, red); err != nil {
			return err
		}
		if algo == "" {
			algo = "scatter"
			if n == 2 || m.Bytes() <= directMax {
				algo = "direct"
			}
		}
		switch algo {
		case "naive":
			work = func(c *coll, data, dst []byte) error { return c.naive(m, data, red, dst) }
		case "direct":
			work = func(c *coll, data, dst []byte) error { return c.direct(m, data, red, dst) }
		default:
			work = func(c *coll, data, dst []byte) error { return c.scatterGather(m, data, red, dst) }
		}
	}
	if started, err := x.startCollective(i, op, c, t, out, work); started || err != nil {
		return err
	}
	data, err := x.bytesOf(t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.timeout(op))
	defer cancel()
	c.ctx, c.mv = ctx, x.mover()
	defer x.moved(c.mv)
	res := make([]byte, out.Bytes())
	if err := work(c, data, res); err != nil {
		return err
	}
	return x.place(op.Out[0], out, res)
}

// coll is one rank's view of a collective. It shares nothing with the
// device loop: it may run beside it.
type coll struct {
	mv     *mover
	ctx    context.Context
	tenant string
	group  string
	n, r   int
	who    string
}

func (c *coll) put(phase string, to int, m kernels.Meta, data []byte, reads int) error {
	return c.mv.publish(c.ctx, c.object(phase, c.r, to), m, data, reads, c.who)
}

func (c *coll) object(phase string, from, to int) string {
	return subjects.TenantObject(c.tenant, subjects.CollectiveObject(c.group, phase, from, to))
}

// getInto reads the piece of phase from rank from to rank to (-1: every
// rank) into dst, which has its size.
func (c *coll) getInto(phase string, from, to int, want kernels.Meta, dst []byte) error {
	_, err := c.mv.fetchInto(c.ctx, c.object(phase, from, to), c.who, want, func(m kernels.Meta) ([]byte, error) {
		if m.Bytes() != len(dst) {
			return nil, failf(codec.CodeShape, "rank %d's piece holds %d bytes, %d expected", from, m.Bytes(), len(dst))
		}
		return dst, nil
	})
	return c.waitedFor(from, err)
}

func (c *coll) get(phase string, from, to int, want kernels.Meta) (kernels.Meta, []byte, error) {
	m, data, err := c.mv.fetchObject(c.ctx, c.object(phase, from, to), c.who, want)
	return m, data, c.waitedFor(from, err)
}

// waitedFor names the rank whose piece did not come in err.
func (c *coll) waitedFor(from int, err error) error {
	var oe *opError
	if errors.As(err, &oe) && oe.code == codec.CodeUnavailabe {
		oe.msg = fmt.Sprintf("rank %d of group %s, waiting for rank %d: %s", c.r, c.group, from, oe.msg)
	}
	return err
}

// allGather: every rank writes its tensor once and reads every other
// rank's into its place in dst, in rank order.
func (c *coll) allGather(m kernels.Meta, data, dst []byte) error {
	if err := c.put("ag", -1, m, data, c.n-1); err != nil {
		return err
	}
	for j := range c.n {
		at := dst[j*len(data) : (j+1)*len(data)]
		if j == c.r {
			copy(at, data)
			continue
		}
		if err := c.getInto("ag", j, -1, m, at); err != nil {
			return err
		}
	}
	return nil
}

// bounds splits n elements into c.n slices.
func (c *coll) bounds(n int) []int {
	b := make([]int, c.n+1)
	for j := range b {
		b[j] = j * n / c.n
	}
	return b
}

// reduceScatter: every rank sends slice j to rank j and reduces its own
// slice over the ranks, in rank order, into dst (the slice's size).
func (c *coll) reduceScatter(m kernels.Meta, data []byte, red string, dst []byte) error {
	es := m.DType.Size()
	b := c.bounds(m.Numel())
	want := kernels.Meta{DType: m.DType, Shape: []int{b[c.r+1] - b[c.r]}}
	pieces := make([][]byte, c.n)
	// The pieces this rank sends and those it receives travel at once:
	// every rank writes before it waits for the others' writes. The
	// first rank's piece is read into dst, where the sum is taken.
	var wg sync.WaitGroup
	errs := make([]error, 2*c.n)
	for j := range c.n {
		if j == c.r {
			pieces[j] = data[b[j]*es : b[j+1]*es]
			if j == 0 {
				copy(dst, pieces[j])
			}
			continue
		}
		piece := kernels.Meta{DType: m.DType, Shape: []int{b[j+1] - b[j]}}
		wg.Go(func() { errs[j] = c.put("rs", j, piece, data[b[j]*es:b[j+1]*es], 1) })
		if j == 0 {
			wg.Go(func() { errs[c.n+j] = c.getInto("rs", j, c.r, want, dst) })
			continue
		}
		wg.Go(func() { _, pieces[j], errs[c.n+j] = c.get("rs", j, c.r, want) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f, err := reducer(m.DType, red)
	if err != nil {
		return err
	}
	for j := 1; j < c.n; j++ {
		f(dst, pieces[j])
	}
	return nil
}

// directMax is the size up to which the default all_reduce of more than
// two ranks is direct: below it the round of the object store saved
// costs more than the extra tensors read.
const directMax = 1 << 20

// direct is the all_reduce in one round of the object store: every rank
// writes its tensor once and reads every other rank's, and reduces them
// all in rank order into dst, as reduceScatter reduces each slice, so both
// give the same bits. Each rank reads n-1 tensors: with two ranks as many
// bytes as scatterGather moves, in half the round trips.
func (c *coll) direct(m kernels.Meta, data []byte, red string, dst []byte) error {
	f, err := reducer(m.DType, red)
	if err != nil {
		return err
	}
	pieces := make([][]byte, c.n)
	errs := make([]error, c.n)
	var wg sync.WaitGroup
	for j := range c.n {
		switch {
		case j == c.r:
			pieces[j] = data
			if j == 0 {
				copy(dst, data)
			}
			wg.Go(func() { errs[j] = c.put("ar", -1, m, data, c.n-1) })
		case j == 0:
			wg.Go(func() { errs[j] = c.getInto("ar", j, -1, m, dst) })
		default:
			wg.Go(func() { _, pieces[j], errs[j] = c.get("ar", j, -1, m) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for j := 1; j < c.n; j++ {
		f(dst, pieces[j])
	}
	if red == "mean" {
		divide(m.DType, dst, c.n)
	}
	return nil
}

// scatterGather is the all_reduce for a broker in the middle: reduce-
// scatter, then every rank gathers the reduced slices into their places
// in dst. Each rank writes about one tensor's bytes and reads about two,
// whatever the rank count.
func (c *coll) scatterGather(m kernels.Meta, data []byte, red string, dst []byte) error {
	es := m.DType.Size()
	b := c.bounds(m.Numel())
	mine := dst[b[c.r]*es : b[c.r+1]*es]
	if err := c.reduceScatter(m, data, red, mine); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, c.n)
	for j := range c.n {
		if j == c.r {
			wg.Go(func() {
				errs[j] = c.put("ag", -1, kernels.Meta{DType: m.DType, Shape: []int{len(mine) / es}}, mine, c.n-1)
			})
			continue
		}
		wg.Go(func() {
			errs[j] = c.getInto("ag", j, -1, kernels.Meta{DType: m.DType, Shape: []int{b[j+1] - b[j]}}, dst[b[j]*es:b[j+1]*es])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if red == "mean" {
		divide(m.DType, dst, c.n)
	}
	return nil
}

// naive gathers every tensor on rank 0, reduces there, and every other
// rank fetches the result: rank 0 moves about 2(n-1) tensors.
func (c *coll) naive(m kernels.Meta, data []byte, red string, dst []byte) error {
	if c.r != 0 {
		if err := c.put("nv", 0, m, data, 1); err != nil {
			return err
		}
		return c.getInto("nvr", 0, -1, m, dst)
	}
	f, err := reducer(m.DType, red)
	if err != nil {
		return err
	}
	copy(dst, data)
	for j := 1; j < c.n; j++ {
		_, piece, err := c.get("nv", j, 0, m)
		if err != nil {
			return err
		}
		f(dst, piece)
	}
	if red == "mean" {
		divide(m.DType, dst, c.n)
	}
	return c.put("nvr", -1, m, dst, c.n-1)
}

// reducer returns acc[i] = acc[i] (op) b[i] over little-endian bytes.
func reducer(dt kernels.DType, red string) (func(acc, b []byte), error) {
	switch dt {
	case kernels.Float32:
		return reduceFn[float32](red), nil
	case kernels.Float64:
		return reduceFn[float64](red), nil
	case kernels.Int32:
		return reduceFn[int32](red), nil
	case kernels.Int64:
		return reduceFn[int64](red), nil
	}
	return nil, fmt.Errorf("%w: collectives reduce f32, f64, i32 and i64, not %v", kernels.ErrDType, dt)
}

type number interface {
	~float32 | ~float64 | ~int32 | ~int64
}

func view[T number](b []byte) []T {
	var z T
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

func reduceFn[T number](red string) func(acc, b []byte) {
	return func(accB, bB []byte) {
		acc, b := view[T](accB), view[T](bB)
		switch red {
		case "sum", "mean":
			for i := range acc {
				acc[i] += b[i]
			}
		case "max":
			for i := range acc {
				if b[i] > acc[i] || b[i] != b[i] {
					acc[i] = b[i]
				}
			}
		case "min":
			for i := range acc {
				if b[i] < acc[i] || b[i] != b[i] {
					acc[i] = b[i]
				}
			}
		}
	}
}

func divide(dt kernels.DType, b []byte, n int) {
	switch dt {
	case kernels.Float32:
		for i, v := range view[float32](b) {
			view[float32](b)[i] = v / float32(n)
		}
	case kernels.Float64:
		for i, v := range view[float64](b) {
			view[float64](b)[i] = v / float64(n)
		}
	case kernels.Int32:
		for i, v := range view[int32](b) {
			view[int32](b)[i] = v / int32(n)
		}
	case kernels.Int64:
		for i, v := range view[int64](b) {
			view[int64](b)[i] = v / int64(n)
		}
	}
}
