package worker

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

// A checkpoint is a device's every session at one stream sequence: each
// session's seed, unreported errors, failed ids and tensors, and the
// sessions freed as idle. It is written while the device goes on running
// frames, and incrementally:
//
//   - The device loop takes a snapshot, in O(tensors): tensors are
//     immutable once written, so the snapshot holds references, not
//     copies. Small tensors in host memory are copied into the manifest;
//     a large tensor already in the last committed checkpoint is named by
//     its digest; any other is pinned (a free waits until the writer is
//     done with it, see memory.go), and the writer reads it, from host
//     memory or, on a backend whose memory the host cannot read (a GPU),
//     by a download of its own, beside the loop: a snapshot never waits
//     for the device.
//   - A writer goroutine hashes each new large tensor and writes it as the
//     object ckpt-<device>-t-<sha256> in FABRIC_CKPT, unless an object of
//     that digest is already there; then the manifest as
//     ckpt-<device>-<seq>; then the key ckpt.<device>, fenced on the
//     device lease, naming the manifest. Then the device's frames up to
//     that sequence are purged from FABRIC_OPS, and the previous manifest
//     and the tensor objects it alone named are deleted.
//
// One checkpoint is written at a time. A new owner restores the last
// committed checkpoint and replays the frames after it.

// checkpointRef is the value of ckpt.<device>.
type checkpointRef struct {
	Device string    `json:"device"`
	Seq    uint64    `json:"seq"`
	Object string    `json:"object"`
	SHA256 string    `json:"sha256"`
	Size   int64     `json:"size"`
	Worker string    `json:"worker"`
	Time   time.Time `json:"time"`
}

type ckptManifest struct {
	V        int           `cbor:"v"`
	Device   string        `cbor:"device"`
	Seq      uint64        `cbor:"seq"`
	Sessions []ckptSession `cbor:"sessions"`
	// Freed are the sessions freed as idle (version 2).
	Freed []string `cbor:"freed,omitempty"`
	// View is the device's quota view in effect at Seq, Buckets the
	// tenants' frame quota buckets (quota.go).
	View    *codec.QuotaView      `cbor:"view,omitempty"`
	Buckets map[string]ckptBucket `cbor:"buckets,omitempty"`
}

// ckptBucket is a tenant's frame quota bucket on the device; At is in
// Unix nanoseconds (a replay must refill it exactly as the first run).
type ckptBucket struct {
	Tokens float64 `cbor:"tokens"`
	At     int64   `cbor:"at"`
}

type ckptSession struct {
	ID      string        `cbor:"id"`
	Seed    uint64        `cbor:"seed"`
	Pending []codec.Error `cbor:"pending,omitempty"`
	Tensors []ckptTensor  `cbor:"tensors,omitempty"`
	Failed  []ckptFailed  `cbor:"failed,omitempty"`
	// Frame is the number of the session's last frame run; 0 when it ran
	// none that was numbered, or the checkpoint predates numbers.
	Frame uint64 `cbor:"frame,omitempty"`
}

// ckptTensor is one tensor: in version 1 at Offset in the blob after the
// manifest; in version 2 inline (Data) or in the object of its digest.
type ckptTensor struct {
	ID     uint64 `cbor:"id"`
	DType  uint8  `cbor:"dtype"`
	Shape  []int  `cbor:"shape"`
	Offset int64  `cbor:"off,omitempty"`
	Digest string `cbor:"sha,omitempty"`
	Data   []byte `cbor:"data,omitempty"`
}

type ckptFailed struct {
	ID  uint64      `cbor:"id"`
	Err codec.Error `cbor:"err"`
}

const (
	ckptMagicV1 = "JFCKPT01"
	ckptMagic   = "JFCKPT02"
)

// ckptInline is the largest tensor carried in the manifest itself.
const ckptInline = 64 << 10

// ckptState is a device's checkpoint bookkeeping, shared by the device
// loop and the checkpoint writer under mu.
type ckptState struct {
	mu sync.Mutex
	// seq and object: the last committed checkpoint and its manifest.
	seq    uint64
	object string
	// digests are the large tensors of the last committed checkpoint,
	// by tensor; objects the digests of the tensor objects it names.
	digests map[*kernels.Tensor]string
	objects map[string]bool
	// done is closed when the writer in flight ends (nil: none).
	done   chan struct{}
	cancel context.CancelFunc
	// wanted: a checkpoint op asked for one (device loop only).
	wanted bool
	// swept: the objects of the device's earlier checkpoints that no
	// committed one names (left by a worker that died while writing)
	// were deleted since this worker took the device (writer only).
	swept bool
}

// ckptSnapshot is what a checkpoint writes, as the device loop saw it.
type ckptSnapshot struct {
	seq      uint64
	lease    *lease
	sessions []snapSession
	freed    []string
	view     *codec.QuotaView
	buckets  map[string]ckptBucket
	consumed []string
	// small holds the bytes of every tensor of ckptInline bytes or less,
	// copied one after another.
	small []byte
	// sweep: the writer runs beside the loop and may take the time to
	// delete stray objects (see sweepCheckpoints).
	sweep bool
}

type snapSession struct {
	ckptSession
	tensors []snapTensor
}

// snapTensor is one live tensor in a snapshot. Its meta is read by the
// writer from t (a tensor's meta never changes); its bytes are small[off:
// off+n], or data, or the object of digest.
type snapTensor struct {
	id     uint64
	t      *kernels.Tensor
	off, n int    // n > 0: small
	digest string // known: in the last committed checkpoint
	// data is a large new tensor's bytes for the writer to hash and
	// store: its host memory (pinned); nil with pinned set, the writer
	// downloads them. A small tensor that is pinned (n > 0) is one the
	// host cannot read: the writer downloads it (downloadSmall) into data,
	// so that the loop does not wait for a download of each (on a GPU, a
	// sync).
	data   []byte
	pinned bool
}

// startCheckpoint snapshots the device and starts a writer, unless one is
// in flight or nothing ran since the last checkpoint. Device loop only.
// It reports false when a writer is in flight.
func (d *device) startCheckpoint() bool {
	if d.broken {
		return true // the state is wrong: nothing of it is written
	}
	d.ck.mu.Lock()
	busy := d.ck.done != nil
	d.ck.mu.Unlock()
	if busy {
		return false
	}
	snap, err := d.snapshot(context.Background())
	if err != nil || snap == nil {
		if err != nil {
			d.w.logf("worker: %s: %v", d.cfg.Name, err)
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	done := make(chan struct{})
	d.ck.mu.Lock()
	d.ck.done, d.ck.cancel = done, cancel
	d.ck.mu.Unlock()
	d.consumed = nil
	snap.sweep = true
	go func() {
		defer close(done)
		defer cancel()
		if _, err := d.writeCheckpoint(ctx, snap); err != nil {
			d.w.logf("worker: %s: %v", d.cfg.Name, err)
		}
		d.ck.mu.Lock()
		d.ck.done, d.ck.cancel = nil, nil
		d.ck.mu.Unlock()
	}()
	return true
}

// waitCheckpoint waits for the writer in flight, if any; with abandon it
// cancels it first.
func (d *device) waitCheckpoint(abandon bool) {
	d.waitCheckpointCtx(context.Background(), abandon)
}

// waitCheckpointCtx is waitCheckpoint that cancels the writer when ctx
// ends first.
func (d *device) waitCheckpointCtx(ctx context.Context, abandon bool) {
	d.ck.mu.Lock()
	done, cancel := d.ck.done, d.ck.cancel
	d.ck.mu.Unlock()
	if done == nil {
		return
	}
	if abandon {
		cancel()
	}
	select {
	case <-done:
	case <-ctx.Done():
		cancel()
		<-done
	}
}

// checkpoint writes and commits a checkpoint at the last applied sequence
// on the calling goroutine, after the one in flight. It returns the
// reference committed, or nil when nothing was applied since the last
// checkpoint. Device loop only (or after it stopped).
func (d *device) checkpoint(ctx context.Context) (*checkpointRef, error) {
	d.waitCheckpointCtx(ctx, false)
	d.drainFrees()
	if d.broken {
		return nil, errRestoreFailed
	}
	snap, err := d.snapshot(ctx)
	if err != nil || snap == nil {
		return nil, err
	}
	d.consumed = nil
	return d.writeCheckpoint(ctx, snap)
}

// snapshot takes the device's state for a checkpoint: nil when nothing ran
// since the last one. It first waits for the collectives in flight (a
// checkpoint holds no tensor in flight), failing when ctx ends first.
// Device loop only, no writer in flight.
func (d *device) snapshot(ctx context.Context) (*ckptSnapshot, error) {
	t0 := time.Now()
	defer func() { d.m.snapNanos.Add(uint64(time.Since(t0))) }()
	seq := d.applied.Load()
	d.ck.mu.Lock()
	last, digests := d.ck.seq, d.ck.digests
	d.ck.mu.Unlock()
	if seq == 0 || seq == last || d.holding() {
		// While a session holds frames stored ahead of a missing one, the
		// frames up to seq are not all run: a checkpoint there would lose
		// the held ones. Holds last until the missing frame is stored.
		return nil, nil
	}
	if err := d.settleAll(ctx); err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: %w", d.cfg.Name, err)
	}
	snap := &ckptSnapshot{seq: seq, lease: d.currentLease(), consumed: d.consumed}
	if snap.lease == nil {
		return nil, ErrLeaseLost
	}
	snap.freed = append(snap.freed, d.live.order...)
	snap.view = d.view.Load()
	for tn, u := range d.tenantUses {
		if !u.at.IsZero() {
			if snap.buckets == nil {
				snap.buckets = map[string]ckptBucket{}
			}
			snap.buckets[tn] = ckptBucket{Tokens: u.tokens, At: u.at.UnixNano()}
		}
	}
	for _, s := range d.sessions {
		ss := snapSession{ckptSession: ckptSession{ID: s.id, Seed: s.seed, Frame: s.frame, Pending: append([]codec.Error(nil), s.pending...)}}
		ss.tensors = make([]snapTensor, 0, s.tensors.len())
		for id, e := range s.tensors.all() {
			if e.fail != nil {
				ss.Failed = append(ss.Failed, ckptFailed{ID: id, Err: *e.fail})
				continue
			}
			st := snapTensor{id: id, t: e.t}
			n := e.t.Bytes()
			switch dg, known := digests[e.t]; {
			case n <= ckptInline:
				st.n = n
				if h := hostView(e.t); h != nil {
					st.off = len(snap.small)
					snap.small = append(snap.small, h...)
				} else if n > 0 {
					d.mem.pin(e.t.Buf) // downloaded by the writer
					st.pinned = true
				}
			case known:
				st.digest = dg
			default:
				d.mem.pin(e.t.Buf)
				st.data, st.pinned = hostView(e.t), true
			}
			ss.tensors = append(ss.tensors, st)
		}
		snap.sessions = append(snap.sessions, ss)
	}
	return snap, nil
}

// unpinSnapshot releases every tensor the snapshot still pins.
func (d *device) unpinSnapshot(snap *ckptSnapshot) {
	for i := range snap.sessions {
		d.unpinTensors(snap.sessions[i].tensors)
	}
}

func (d *device) unpinTensors(ts []snapTensor) {
	for j := range ts {
		if st := &ts[j]; st.pinned {
			d.mem.unpin(st.t.Buf)
			st.pinned, st.data = false, nil
		}
	}
}

// manyDownloader is a backend that brings many buffers back in one call
// (the CUDA backend: a sync for every few MiB of them, not one each).
type manyDownloader interface {
	DownloadMany(dsts [][]byte, srcs []kernels.Buffer) error
}

// downloadSmall downloads the snapshot's small tensors that the host
// cannot read (pinned by the snapshot) into one block of host memory,
// gives each its slice of it as data, and unpins them. Writer only.
func (d *device) downloadSmall(snap *ckptSnapshot) error {
	var sts []*snapTensor
	total := 0
	for i := range snap.sessions {
		for j := range snap.sessions[i].tensors {
			if st := &snap.sessions[i].tensors[j]; st.pinned && st.n > 0 {
				sts = append(sts, st)
				total += st.n
			}
		}
	}
	if len(sts) == 0 {
		return nil
	}
	block := make([]byte, total)
	dsts, srcs := make([][]byte, len(sts)), make([]kernels.Buffer, len(sts))
	off := 0
	for i, st := range sts {
		dsts[i], srcs[i] = block[off:off+st.n:off+st.n], st.t.Buf
		off += st.n
	}
	if m, ok := d.cfg.Backend.(manyDownloader); ok {
		if err := m.DownloadMany(dsts, srcs); err != nil {
			return fmt.Errorf("download %d small tensors: %w", len(sts), err)
		}
	} else {
		for i, st := range sts {
			if err := d.cfg.Backend.Download(dsts[i], srcs[i]); err != nil {
				return fmt.Errorf("download tensor %d: %w", st.id, err)
			}
		}
	}
	for i, st := range sts {
		d.mem.unpin(st.t.Buf)
		st.pinned, st.data = false, dsts[i]
	}
	return nil
}

// testHookCheckpointWrite, when set (by tests, before a worker starts),
// runs at the start of every checkpoint write.
var testHookCheckpointWrite func(device string)

// tensorObject names the checkpoint object of a tensor by its digest.
func tensorObject(device, digest string) string { return "ckpt-" + device + "-t-" + digest }

// writeCheckpoint writes snap and commits it. It runs on the writer's
// goroutine (or the caller's, see checkpoint) and never takes the device
// loop; what it shares with the loop is under d.ck.mu and d.mem.mu.
func (d *device) writeCheckpoint(ctx context.Context, snap *ckptSnapshot) (ref *checkpointRef, err error) {
	defer d.unpinSnapshot(snap)
	defer func() {
		if err != nil {
			d.m.ckptFailures.Add(1)
		}
	}()
	if testHookCheckpointWrite != nil {
		testHookCheckpointWrite(d.cfg.Name)
	}
	start := time.Now()
	d.ck.mu.Lock()
	have, oldObject := d.ck.objects, d.ck.object
	d.ck.mu.Unlock()
	name := subjects.CheckpointObject(d.cfg.Name, snap.seq)
	man := ckptManifest{V: 2, Device: d.cfg.Name, Seq: snap.seq, Freed: snap.freed, View: snap.view, Buckets: snap.buckets}
	refs := map[string]bool{}
	digests := map[*kernels.Tensor]string{}
	// On failure nothing is deleted here: a tensor object may be named
	// by a checkpoint that another worker committed since (the same
	// content), and a manifest of the same sequence too. The next
	// committed checkpoint sweeps what no committed checkpoint names.
	var written []string // objects this checkpoint wrote
	defer func() {
		if err != nil {
			d.ck.swept = false
		}
	}()
	if err := d.downloadSmall(snap); err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: %w", d.cfg.Name, err)
	}
	var wrote int64
	for i := range snap.sessions {
		ss := &snap.sessions[i]
		cs := ss.ckptSession
		cs.Tensors = make([]ckptTensor, 0, len(ss.tensors))
		for j := range ss.tensors {
			st := &ss.tensors[j]
			ct := ckptTensor{ID: st.id, DType: uint8(st.t.DType), Shape: st.t.Shape, Digest: st.digest}
			switch {
			case st.n > 0 && st.data != nil: // downloaded by downloadSmall
				ct.Data = st.data
			case st.n > 0:
				ct.Data = snap.small[st.off : st.off+st.n]
			}
			if st.pinned { // a large new tensor: the writer stores it
				data, give := st.data, func() {}
				if data == nil {
					// A tensor the host cannot read: downloaded into host
					// memory (pinned where the backend lends it).
					data, give = d.hostBuffer(st.t.Bytes())
					if err := d.cfg.Backend.Download(data, st.t.Buf); err != nil {
						give()
						return nil, fmt.Errorf("worker: checkpoint %s: download tensor %d: %w", d.cfg.Name, st.id, err)
					}
				}
				// The object is named by the digest computed beside the
				// write; bytes stored under that name already (the same
				// content in another tensor) stop the write early.
				info, err := d.w.ckpt.Put(ctx, "", data, map[string]string{"device": d.cfg.Name},
					objectstore.WithNameFromDigest(func(sum [sha256.Size]byte) string {
						return tensorObject(d.cfg.Name, hex.EncodeToString(sum[:]))
					}), objectstore.WithYield(d.giveWay))
				give()
				if err != nil {
					return nil, fmt.Errorf("worker: checkpoint %s: store tensor %d: %w", d.cfg.Name, st.id, err)
				}
				ct.Digest = info.SHA256
				if !have[ct.Digest] && !refs[ct.Digest] {
					written = append(written, info.Name)
					wrote += int64(len(data))
				}
				d.mem.unpin(st.t.Buf)
				st.pinned, st.data = false, nil
			}
			if ct.Digest != "" {
				refs[ct.Digest] = true
				digests[st.t] = ct.Digest
			}
			cs.Tensors = append(cs.Tensors, ct)
		}
		man.Sessions = append(man.Sessions, cs)
	}
	mb, err := codec.Marshal(codec.CBOR, &man)
	if err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: manifest: %w", d.cfg.Name, err)
	}
	blob := make([]byte, 0, len(ckptMagic)+8+len(mb))
	blob = append(blob, ckptMagic...)
	blob = binary.LittleEndian.AppendUint64(blob, uint64(len(mb)))
	blob = append(blob, mb...)
	info, err := d.w.ckpt.Put(ctx, name, blob, map[string]string{"device": d.cfg.Name, "seq": fmt.Sprint(snap.seq)})
	if err != nil {
		return nil, fmt.Errorf("worker: checkpoint %s: store: %w", d.cfg.Name, err)
	}
	written = append(written, name)
	ref = &checkpointRef{Device: d.cfg.Name, Seq: snap.seq, Object: name, SHA256: info.SHA256, Size: info.Size, Worker: d.w.cfg.ID, Time: time.Now().UTC()}
	rb, _ := json.Marshal(ref)
	if err := snap.lease.write(ctx, subjects.CheckpointKey(d.cfg.Name), rb); err != nil {
		return nil, err
	}
	took := time.Since(start)
	// Committed: the frames it covers, the previous manifest and the
	// tensors only that one named can go.
	d.ck.mu.Lock()
	d.ck.seq, d.ck.object, d.ck.digests, d.ck.objects = snap.seq, name, digests, refs
	d.ck.mu.Unlock()
	if stream, err := d.w.js.Stream(ctx, d.w.names.OpsStream()); err == nil {
		for _, filter := range d.opsFilters() {
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(filter), jetstream.WithPurgeSequence(snap.seq+1)); err != nil {
				d.w.logf("worker: %s: purge frames below %d: %v", d.cfg.Name, snap.seq+1, err)
			}
		}
	}
	if oldObject != "" && oldObject != name {
		if err := d.w.ckpt.Delete(ctx, oldObject); err != nil {
			d.w.logf("worker: %s: delete old checkpoint %s: %v", d.cfg.Name, oldObject, err)
		}
	}
	for dg := range have {
		if !refs[dg] {
			if err := d.w.ckpt.Delete(ctx, tensorObject(d.cfg.Name, dg)); err != nil && !errors.Is(err, objectstore.ErrNotFound) {
				d.w.logf("worker: %s: delete old checkpoint tensor %s: %v", d.cfg.Name, dg, err)
			}
		}
	}
	d.dropObjects(ctx, snap.consumed)
	if !d.ck.swept && snap.sweep {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d.ck.swept = d.sweepCheckpoints(sctx, name, refs)
		cancel()
	}
	d.m.checkpoint(took, info.Size+wrote)
	d.w.logf("worker: %s: checkpoint at sequence %d: %d sessions, %d tensor objects (%d bytes written, %d new) in %v",
		d.cfg.Name, snap.seq, len(man.Sessions), len(refs), info.Size+wrote, len(written)-1, took.Round(time.Millisecond))
	return ref, nil
}

// sweepCheckpoints deletes the device's checkpoint objects that neither
// the manifest committed nor its tensors are, and reports whether it could
// list them.
func (d *device) sweepCheckpoints(ctx context.Context, manifest string, refs map[string]bool) bool {
	// The names are read from the subjects of the bucket's metas (each
	// name base64url-encoded), with no consumer.
	bucket := d.w.names.CkptBucket()
	stream, err := d.w.js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return false
	}
	prefix := "$O." + bucket + ".M."
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		d.w.logf("worker: %s: list checkpoint objects: %v", d.cfg.Name, err)
		return false
	}
	tensors, manifests := tensorObject(d.cfg.Name, ""), subjects.CheckpointObject(d.cfg.Name, 0)
	manifests = manifests[:len(manifests)-1]
	for subj := range info.State.Subjects {
		raw, err := base64.URLEncoding.DecodeString(strings.TrimPrefix(subj, prefix))
		if err != nil {
			continue
		}
		name := string(raw)
		dg, isTensor := strings.CutPrefix(name, tensors)
		isTensor = isTensor && len(dg) == 2*sha256.Size && strings.Trim(dg, "0123456789abcdef") == ""
		seq, isManifest := strings.CutPrefix(name, manifests)
		switch {
		case name == manifest:
			continue
		case isTensor && !refs[dg]:
		case !isTensor && isManifest && seq != "" && strings.Trim(seq, "0123456789") == "":
		default:
			continue
		}
		if err := d.w.ckpt.Delete(ctx, name); err != nil && !errors.Is(err, objectstore.ErrNotFound) {
			d.w.logf("worker: %s: delete stray checkpoint object %s: %v", d.cfg.Name, name, err)
		}
	}
	return true
}

// resetCheckpoints forgets the checkpoint bookkeeping (after a step down:
// the new owner's state is the truth). No writer may be in flight.
func (d *device) resetCheckpoints() {
	d.ck.mu.Lock()
	d.ck.seq, d.ck.object, d.ck.digests, d.ck.objects = 0, "", nil, nil
	d.ck.mu.Unlock()
	d.ck.wanted, d.ck.swept = false, false
}

// readCheckpoint reads the device's committed checkpoint: its reference,
// manifest, format (magic) and, in version 1, the tensor bytes after the
// manifest. A nil ref and no error: no checkpoint is committed.
func (d *device) readCheckpoint(ctx context.Context) (ref *checkpointRef, man *ckptManifest, magic string, data []byte, err error) {
	e, err := d.w.ctrl.Get(ctx, subjects.CheckpointKey(d.cfg.Name))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil, "", nil, nil
	} else if err != nil {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: read checkpoint: %w", d.cfg.Name, err)
	}
	ref = new(checkpointRef)
	if err := json.Unmarshal(e.Value(), ref); err != nil {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint reference: %w", d.cfg.Name, err)
	}
	blob, info, err := d.w.ckpt.Get(ctx, ref.Object)
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint object %s: %w", d.cfg.Name, ref.Object, err)
	}
	if ref.SHA256 != "" && info.SHA256 != ref.SHA256 {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint object %s has digest %s, committed %s", d.cfg.Name, ref.Object, info.SHA256, ref.SHA256)
	}
	if len(blob) < len(ckptMagic)+8 {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint object %s is not a checkpoint", d.cfg.Name, ref.Object)
	}
	magic = string(blob[:len(ckptMagic)])
	if magic != ckptMagic && magic != ckptMagicV1 {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint object %s is not a checkpoint", d.cfg.Name, ref.Object)
	}
	n := binary.LittleEndian.Uint64(blob[len(ckptMagic):])
	body := blob[len(ckptMagic)+8:]
	if n > uint64(len(body)) {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint %s: manifest of %d bytes in %d", d.cfg.Name, ref.Object, n, len(body))
	}
	man = new(ckptManifest)
	if err := codec.Unmarshal(codec.CBOR, body[:n], man); err != nil {
		return nil, nil, "", nil, fmt.Errorf("worker: %s: checkpoint %s: %w", d.cfg.Name, ref.Object, err)
	}
	return ref, man, magic, body[n:], nil
}

// restore loads the device's last committed checkpoint, if any, and returns
// the sequence it covers.
func (d *device) restore(ctx context.Context) (uint64, error) {
	ref, man, magic, data, err := d.readCheckpoint(ctx)
	if err != nil || ref == nil {
		return 0, err
	}
	now := time.Now()
	digests := map[*kernels.Tensor]string{}
	objects := map[string]bool{}
	// Tensor objects are read in the background once the device serves
	// (see restore.go).
	var lazy []*lazyTensor
	var lazyBytes int64
	for _, cs := range man.Sessions {
		s := newSession(cs.ID)
		s.seed, s.pending, s.last = cs.Seed, cs.Pending, now
		s.frame, s.loose = cs.Frame, cs.Frame == 0
		if s.tenant = subjects.SessionTenant(cs.ID); s.tenant != "" {
			s.st, _, _ = d.w.tenant(s.tenant)
			s.use = d.useOf(s.tenant)
		}
		for _, f := range cs.Failed {
			err := f.Err
			s.tensors.set(f.ID, entry{fail: &err})
		}
		d.sessions[cs.ID] = s
		for _, ct := range cs.Tensors {
			t, read, err := d.restoreTensor(magic, ct, data)
			if err != nil {
				return 0, fmt.Errorf("worker: %s: checkpoint %s: tensor %d: %w", d.cfg.Name, ref.Object, ct.ID, err)
			}
			if read != nil {
				lazy = append(lazy, &lazyTensor{t: t, session: cs.ID, id: ct.ID, read: read, done: make(chan struct{})})
				lazyBytes += int64(t.Buf.Bytes())
			}
			s.tensors.set(ct.ID, entry{t: t})
			s.addBytes(int64(t.Buf.Bytes()))
			if ct.Digest != "" {
				digests[t], objects[ct.Digest] = ct.Digest, true
			}
		}
	}
	if man.View != nil {
		d.view.Store(man.View)
	}
	for tn, b := range man.Buckets {
		if subjects.ValidateTenant(tn) == nil {
			u := d.useOf(tn)
			u.tokens, u.at = b.Tokens, time.Unix(0, b.At)
		}
	}
	d.startLazy(lazy, lazyBytes)
	d.startPrefetch(man.Seq)
	for _, id := range man.Freed {
		d.noteFreed(id, now)
	}
	d.sessionCount.Store(int64(len(d.sessions)))
	d.ck.mu.Lock()
	d.ck.seq, d.ck.object, d.ck.digests, d.ck.objects = man.Seq, ref.Object, digests, objects
	d.ck.mu.Unlock()
	return man.Seq, nil
}

// restoreTensor makes one tensor of a checkpoint: from data at its offset
// (version 1), inline, or from its object (version 2). For an object it
// allocates the tensor and returns read, which reads the object into it.
func (d *device) restoreTensor(magic string, ct ckptTensor, data []byte) (t *kernels.Tensor, read func(context.Context) error, err error) {
	m := kernels.Meta{DType: kernels.DType(ct.DType), Shape: ct.Shape}
	if !m.DType.Valid() {
		return nil, nil, fmt.Errorf("dtype %d", ct.DType)
	}
	if err := kernels.CheckShape(m.Shape, d.w.cfg.Limits.Tensor); err != nil {
		return nil, nil, err
	}
	n := m.Bytes()
	var src []byte
	fromObject := magic == ckptMagic && ct.Digest != ""
	switch {
	case magic == ckptMagicV1:
		end := ct.Offset + int64(n)
		if ct.Offset < 0 || end > int64(len(data)) {
			return nil, nil, errors.New("out of bounds")
		}
		src = data[ct.Offset:end]
	case !fromObject:
		if len(ct.Data) != n {
			return nil, nil, fmt.Errorf("%d bytes inline, %d needed", len(ct.Data), n)
		}
		src = ct.Data
	}
	var warm *warmTensor
	if fromObject {
		warm = d.takeWarm(ct.Digest, n)
	}
	if hw, ok := d.cfg.Backend.(hostWrapper); ok && warm != nil {
		// Read ahead by this worker as a standby, into memory the
		// backend takes over: the tensor is there.
		if buf, err := hw.Wrap(warm.host); err == nil {
			d.mem.held.Add(int64(buf.Bytes()))
			return &kernels.Tensor{Meta: m, Buf: buf}, nil, nil
		}
	}
	alloc := d.cfg.Backend.Alloc
	if u, ok := d.cfg.Backend.(uninitAllocator); ok && fromObject {
		alloc = u.AllocUninit // the read writes every byte
	}
	buf, err := alloc(n)
	if err != nil {
		return nil, nil, err
	}
	d.mem.held.Add(int64(buf.Bytes()))
	t = &kernels.Tensor{Meta: m, Buf: buf}
	if !fromObject {
		if err := d.cfg.Backend.Upload(buf, src); err != nil {
			d.backendFree(buf)
			return nil, nil, err
		}
		return t, nil, nil
	}
	// The tensor is in the session table before it is read (see
	// restore.go): the step down frees it if the read fails.
	if warm != nil {
		// Read ahead into host memory: uploaded beside the loop.
		return t, func(context.Context) error {
			d.uploadMu.Lock()
			defer d.uploadMu.Unlock()
			return d.cfg.Backend.Upload(buf, warm.host)
		}, nil
	}
	return t, func(ctx context.Context) error {
		dst := hostView(t)
		if dst == nil { // read into host memory (pinned where the backend lends it), then upload
			var give func()
			src, give = d.hostBuffer(n)
			defer give()
			dst = src
		}
		if err := d.readTensorObject(ctx, ct.Digest, dst); err != nil || src == nil {
			return err
		}
		d.uploadMu.Lock()
		defer d.uploadMu.Unlock()
		return d.cfg.Backend.Upload(buf, src)
	}, nil
}

// readTensorObject reads the checkpoint's tensor object of digest into
// dst, which it must fill, and checks that the object is the one the
// digest names.
func (d *device) readTensorObject(ctx context.Context, digest string, dst []byte) error {
	name := tensorObject(d.cfg.Name, digest)
	info, err := d.w.ckpt.GetInto(ctx, name, dst)
	if err == nil && info.SHA256 != digest {
		err = fmt.Errorf("object %s has digest %s, the manifest names %s", name, info.SHA256, digest)
	}
	return err
}

// giveWayMax bounds how long a checkpoint's write waits, before one chunk,
// for the frame the device is running.
const giveWayMax = 2 * time.Millisecond

// giveWay has a checkpoint's write wait, before each chunk, while the
// device runs a frame (up to giveWayMax), so that where cores are few
// the frames go first and the checkpoint takes the time between them;
// under frames without end it still writes a chunk every giveWayMax.
func (d *device) giveWay(ctx context.Context) error {
	if err := ctx.Err(); err != nil || !d.running.Load() {
		return err
	}
	t := time.NewTimer(giveWayMax)
	defer t.Stop()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for d.running.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-tick.C:
		}
	}
	return nil
}
