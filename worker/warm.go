package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// A standby reads ahead. While another worker holds a device's lease, the
// standby follows the device's committed checkpoints and reads the tensor
// objects they name into memory of its own, and each tensor object as it
// is stored, before its checkpoint is committed, so that a takeover finds
// them there (see restoreTensor) instead of reading them from the object
// store after the owner died, when the frames the new owner replays wait
// for them.

// warmTensor is one tensor object read ahead, by its digest, in host
// memory (8-byte aligned): a backend that can wrap host memory (the CPU)
// adopts it as the tensor's buffer at the takeover; another has it
// uploaded beside the device loop, as it would have the object read.
type warmTensor struct {
	host []byte
	// named: a committed checkpoint named it; else it was read as it was
	// stored, for a checkpoint being written, in read-ahead pass gen.
	named bool
	gen   uint64
}

// bytes is the memory the tensor holds.
func (t *warmTensor) bytes() int64 { return int64(len(t.host)) }

// hostWrapper is a backend that takes host memory over as a buffer.
type hostWrapper interface {
	Wrap(data []byte) (kernels.Buffer, error)
}

// warmRetry is how long the reader waits after a failed read (the object
// store unreachable, an object swept by a newer checkpoint, one that does
// not match its digest) before it reads the device's latest checkpoint
// again; the wait doubles while reads keep failing, up to warmRetryMax.
const (
	warmRetry    = time.Second
	warmRetryMax = 30 * time.Second
)

// warmUp follows the device's committed checkpoints until ctx ends,
// keeping in d.warm the tensors of the latest one, as many as the
// device's memory budget allows (all without a budget). It owns d.warm
// until it returns; the caller waits for it before a takeover reads
// d.warm.
func (d *device) warmUp(ctx context.Context) {
	// Until the first look at the checkpoint, this standby counts as
	// holding none of it (see takeoverLag).
	if d.warmWant.Load() == 0 {
		d.warmWant.Store(-1)
	}
	watcher, err := d.w.ctrl.Watch(ctx, subjects.CheckpointKey(d.cfg.Name))
	if err != nil {
		if ctx.Err() == nil {
			d.w.logf("worker: %s: standby: watch the checkpoints: %v; nothing is read ahead", d.cfg.Name, err)
		}
		return
	}
	defer func() { _ = watcher.Stop() }()
	if d.warm == nil {
		d.warm = map[string]*warmTensor{}
	}
	d.warmMax = d.warmLimit()
	// The tensor objects of a checkpoint being written are read as they
	// are stored, before it is committed. A notice lost (the channel
	// full, the connection down) costs only an early read.
	type stored struct {
		digest string
		n      int64
	}
	notes := make(chan stored, 4096)
	prefix := tensorObject(d.cfg.Name, "")
	if stop, err := d.w.ckpt.Notify(prefix, func(name string, n int64) {
		select {
		case notes <- stored{strings.TrimPrefix(name, prefix), n}:
		default:
		}
	}); err == nil {
		defer stop()
	}
	var retry <-chan time.Time
	wait := warmRetry
	for {
		select {
		case <-ctx.Done():
			return
		case o := <-notes:
			d.readEarly(ctx, o.digest, o.n)
			continue
		case e, ok := <-watcher.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue // the initial values are in
			}
		case <-retry:
		}
		retry = nil
		err := d.warmTo(ctx, watcher)
		for errors.Is(err, errNewer) {
			err = d.warmTo(ctx, watcher)
		}
		switch {
		case err == nil:
			wait = warmRetry
		case ctx.Err() == nil:
			d.w.logf("worker: %s: standby: read ahead: %v; again in %v", d.cfg.Name, err, wait)
			retry = time.After(wait)
			wait = min(2*wait, warmRetryMax)
		}
	}
}

// maxTakeoverLag is how much longer than a standby that holds the whole
// of the device's last checkpoint read ahead one that holds none of it
// leaves a dead holder's lease, or a vacant one (see takeoverLag). A
// variable for tests.
var maxTakeoverLag = 250 * time.Millisecond

// takeoverLag is how much longer this standby leaves a dead or paused
// holder's lease than one that has read the device's last checkpoint
// ahead in full: maxTakeoverLag times the part of it not read yet (all
// of it before the standby has looked at the checkpoint). Of several
// standbys, the one with the most read ahead takes the device over; one
// alone takes it at most maxTakeoverLag later than it would have. 0
// without read-ahead, or with nothing to read.
func (d *device) takeoverLag() time.Duration {
	want := d.warmWant.Load()
	switch {
	case d.w.cfg.NoReadAhead || d.adopting || want == 0:
		return 0
	case want < 0:
		return maxTakeoverLag
	}
	have := min(d.m.warmBytes.Load(), want)
	return time.Duration(float64(maxTakeoverLag) * float64(want-have) / float64(want))
}

// warmLimit bounds the memory of the tensors read ahead (0: none): the
// device's budget, and where the copy is host memory beside the device's
// own (a backend that cannot take host memory over, a GPU's) also the
// share of the host's memory a CPU device of this worker would have.
func (d *device) warmLimit() int64 {
	limit := d.mem.budget
	if _, ok := d.cfg.Backend.(hostWrapper); !ok {
		h := defaultBudget(Device{Kind: "cpu"}, d.w.cfg.MemoryFraction, len(d.w.cfg.Devices))
		if h > 0 && (limit <= 0 || h < limit) {
			limit = h
		}
	}
	return limit
}

// warmFits reports whether n more bytes read ahead stay within warmMax.
func (d *device) warmFits(n int64) bool {
	return d.warmMax <= 0 || d.m.warmBytes.Load()+n <= d.warmMax
}

// errNewer stops a read-ahead pass: a newer checkpoint was committed.
var errNewer = errors.New("a newer checkpoint was committed")

// warmTo reads ahead the tensors of the device's latest committed
// checkpoint and lets go of the ones it no longer names. It stops, for
// the next pass, when the watcher announces a newer checkpoint.
func (d *device) warmTo(ctx context.Context, watcher jetstream.KeyWatcher) (failed error) {
	ref, man, magic, _, err := d.readCheckpoint(ctx)
	if err != nil {
		return err
	}
	if ref == nil || magic != ckptMagic {
		d.warmWant.Store(0) // no checkpoint, or one of version 1: nothing to read ahead
		return nil
	}
	// The tensor objects the checkpoint names, each once.
	want := map[string]int{}
	var order []string
	for _, cs := range man.Sessions {
		for _, ct := range cs.Tensors {
			if ct.Digest == "" {
				continue // inline: in the manifest
			}
			m := kernels.Meta{DType: kernels.DType(ct.DType), Shape: ct.Shape}
			if !m.DType.Valid() || kernels.CheckShape(m.Shape, d.w.cfg.Limits.Tensor) != nil {
				continue // the restore refuses it
			}
			if _, ok := want[ct.Digest]; !ok {
				want[ct.Digest] = m.Bytes()
				order = append(order, ct.Digest)
			}
		}
	}
	// Let go of what this checkpoint does not name, but for tensors read
	// early since the last one (of the next checkpoint, being written).
	d.warmGen++
	for digest, t := range d.warm {
		n, ok := want[digest]
		switch {
		case ok && int64(n) == t.bytes():
			t.named = true
		case ok, t.named, t.gen+1 < d.warmGen:
			d.dropWarm(digest)
		}
	}
	var total int64
	for _, n := range want {
		total += int64(n)
	}
	if b := d.warmMax; b > 0 {
		total = min(total, b)
	}
	d.warmWant.Store(total)
	for _, digest := range order {
		if _, ok := d.warm[digest]; ok {
			continue
		}
		select {
		case e := <-watcher.Updates():
			if e != nil {
				return errNewer
			}
		default:
		}
		n := want[digest]
		if !d.warmFits(int64(n)) {
			continue // read after a takeover, as without a standby
		}
		if err := d.readWarm(ctx, digest, n, true); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// The others are read all the same; this one again later.
			failed = errors.Join(failed, err)
		}
	}
	return failed
}

// earlyWait bounds the wait for a tensor object announced as stored to be
// found in its bucket.
const earlyWait = 2 * time.Second

// readEarly reads the tensor object of digest, of n bytes, just stored
// for a checkpoint being written, into d.warm, if it is not there and the
// device's budget allows. A failure is no news: the object may have been
// swept since, or its checkpoint may never be committed.
func (d *device) readEarly(ctx context.Context, digest string, n int64) {
	if _, ok := d.warm[digest]; ok || n <= 0 || n > int64(d.w.cfg.Limits.Tensor.MaxElements)*8 {
		return
	}
	if !d.warmFits(n) {
		return
	}
	// The notice comes as the meta is published, which the bucket's
	// stream may not have stored yet.
	wctx, cancel := context.WithTimeout(ctx, earlyWait)
	_, err := d.w.ckpt.Wait(wctx, tensorObject(d.cfg.Name, digest))
	cancel()
	if err == nil {
		_ = d.readWarm(ctx, digest, int(n), false)
	}
}

// readWarm reads the object of one tensor of n bytes into d.warm; named:
// the last committed checkpoint names it.
func (d *device) readWarm(ctx context.Context, digest string, n int, named bool) error {
	t := &warmTensor{host: alignedBytes(n), named: named, gen: d.warmGen}
	if err := d.readTensorObject(ctx, digest, t.host); err != nil {
		d.mem.freed.Add(int64(n))
		return fmt.Errorf("tensor %.12s: %w", digest, err)
	}
	d.warm[digest] = t
	d.m.warmBytes.Add(t.bytes())
	return nil
}

// alignedBytes returns n bytes of fresh memory, 8-byte aligned.
func alignedBytes(n int) []byte {
	if n == 0 {
		return []byte{}
	}
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}

// takeWarm hands the restore the tensor of digest read ahead, if any; the
// restore owns it from then on.
func (d *device) takeWarm(digest string, n int) *warmTensor {
	t := d.warm[digest]
	if t == nil || t.bytes() != int64(n) {
		return nil
	}
	delete(d.warm, digest)
	d.m.warmBytes.Add(-t.bytes())
	d.m.warmHits.Add(1)
	return t
}

// dropWarm lets go of the tensor of digest read ahead.
func (d *device) dropWarm(digest string) {
	t := d.warm[digest]
	if t == nil {
		return
	}
	delete(d.warm, digest)
	d.m.warmBytes.Add(-t.bytes())
	d.mem.freed.Add(t.bytes()) // returned to the system by the next reclaim
}

// clearWarm lets go of every tensor read ahead (after a restore took what
// it names, or when the worker stops). No reader may run.
func (d *device) clearWarm() {
	for digest := range d.warm {
		d.dropWarm(digest)
	}
	d.warmWant.Store(0)
}
