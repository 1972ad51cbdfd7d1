package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// device is one device's loop. Its frames run on the feed's goroutine and
// its housekeeping on run's, one at a time under loop: nothing else
// touches its sessions and its backend.
type device struct {
	w       *Worker
	cfg     Device
	started time.Time

	sessions map[string]*session
	// sessionCount and applied are read by the heartbeat.
	sessionCount atomic.Int64
	applied      atomic.Uint64
	// loopAt is when the loop last came round (unix ns), for health.
	loopAt atomic.Int64
	m      metrics

	// noHostBuffers: the backend failed to lend a host buffer once, for
	// another reason than its size (said in the log); transfers stage
	// through plain memory from then on.
	noHostBuffers atomic.Bool

	// mem accounts tensor memory against the device's budget; sessBytes
	// is each session's share as of the last housekeeping.
	mem       memory
	sessBytes atomic.Pointer[[]sessionBytes]
	// live: the clients' heartbeats (under aliveMu) and the sessions
	// freed as idle (loop only).
	aliveMu sync.Mutex
	live    liveness

	// loop is held while a frame runs and while run keeps house.
	loop sync.Mutex
	// lastCkpt and idleCheck: when the loop last checkpointed on its
	// interval and last looked for idle sessions. Under loop.
	lastCkpt, idleCheck time.Time
	// lastFrame is when the loop last ran a frame; trimmed, whether the
	// backend's cache was trimmed since (see trimIdle). Under loop.
	lastFrame time.Time
	trimmed   bool

	mu    sync.Mutex
	feed  *feed
	lease *lease

	// adopting: the device was taken over from a dead worker (see Adopt);
	// it gives up rather than stand by when another worker holds it.
	adopting bool

	// host runs the ops the backend declines (see hostFallback); fellBack
	// names those ops, to say so once each. Device loop only.
	host     kernels.Backend
	fellBack map[string]bool

	// ck is the checkpoint bookkeeping (checkpoint.go).
	ck ckptState
	// lazy is the background read of the last restore's tensors, nil
	// once done (restore.go); uploadMu serialises its uploads on a
	// backend whose memory the host cannot write. broken: a read failed,
	// the device's state is wrong until it is taken over again. Device
	// loop only, but for what lazyRestore shares with its readers.
	lazy     *lazyRestore
	uploadMu sync.Mutex
	broken   bool
	// warm are the tensors a standby read ahead, by digest (warm.go):
	// warmUp's while the device stands by, the takeover's after it.
	// warmWant is the memory of the tensors warmUp reads ahead for the
	// last checkpoint it saw, -1 before it has looked (takeoverLag reads
	// it).
	warm     map[string]*warmTensor
	warmWant atomic.Int64
	warmGen  uint64 // read-ahead passes (warm.go)
	warmMax  int64  // the most memory read ahead (warmLimit; 0: no bound)
	// consumed are transfer objects this device read last; deleted once a
	// checkpoint covers the ops that read them.
	consumed []string
	// flying are the collectives in flight, oldest first, and flyingBy
	// indexes them by output (collective.go); syncCollectives runs every
	// collective in the loop instead (Config.SyncCollectives, and the job
	// loops'). Device loop only.
	flying          []*flight
	flyingBy        map[*kernels.Tensor]*flight
	syncCollectives bool
	// decoded is the frame run1 decodes into: its ops array (an op is
	// several hundred bytes) is reused frame after frame, up to
	// maxReusedOps, since nothing an op leaves behind refers to the op
	// itself. Device loop only.
	decoded codec.Frame
	// replayOps and replayUses are decoded and uses for replays
	// (replayFused), kept apart from the frame's: a replay runs inside a
	// frame.
	replayOps  []codec.Op
	replayUses map[uint64][]int
	// running is set while the loop runs a frame: a checkpoint's write
	// gives way to it (giveWay).
	running atomic.Bool
	// scratchOp is the kernels.Op compute builds each op in.
	scratchOp kernels.Op
	// uses is the map run1 indexes a frame's tensor ids in (frameUses),
	// emptied after each frame, for frames of up to maxReusedOps ops.
	uses map[uint64][]int
	// replay tracks the catch-up after a takeover, until the device has
	// applied every frame that was in the stream.
	replay struct {
		on         bool
		first      bool // the next frame is the first since the takeover
		start      time.Time
		frames     uint64
		ops0       uint64
		restoredAt uint64
	}
	stopErr error
	// graphs are the validated graphs of replays (see graph.go). Device
	// loop only.
	graphs *graphCache
	// fuseFailed: a fused group failed other than by ErrNotImplemented
	// (logged once).
	fuseFailed bool
	// held counts the frames the sessions hold (see order). Device loop only.
	held int
	// tenantUses is each tenant's use of the device (quota.go). Device
	// loop only. usedAt is when noteUse last ran, useSnap what it found,
	// for the heartbeat.
	tenantUses map[string]*tenantUse
	usedAt     time.Time
	useSnap    atomic.Pointer[map[string]codec.TenantUse]
	// view is the tenants' use of the other devices as the device's last
	// view frame (or its checkpoint) gave it; written by the loop only.
	view atomic.Pointer[codec.QuotaView]
	// viewSent is the view last published into the device's frames, and
	// when. Heartbeat goroutine only.
	viewSent struct {
		ok   bool
		view map[string]codec.TenantUse
		at   time.Time
	}
}

func newDevice(w *Worker, cfg Device) *device {
	d := &device{w: w, cfg: cfg, sessions: map[string]*session{}, started: time.Now().UTC(), syncCollectives: w.cfg.SyncCollectives}
	switch {
	case cfg.Budget > 0:
		d.mem.budget = cfg.Budget
	case cfg.Budget == 0:
		host := 0
		for _, c := range w.cfg.Devices {
			if c.Kind != "gpu" {
				host++
			}
		}
		d.mem.budget = defaultBudget(cfg, w.cfg.MemoryFraction, host)
	}
	return d
}

// serve owns the device's lifecycle: take the lease (waiting as a standby
// while another worker holds it), restore and replay, serve until the
// worker stops or the lease is lost, and on a loss go back to standing by.
// It reports on ready once, when the device serves or stands by.
func (d *device) serve(ready chan<- error) {
	w := d.w
	once := sync.OnceFunc(func() { ready <- nil })
	defer once()
	// Heartbeats are recorded whether the device serves or stands by:
	// a standby that takes over knows which clients are alive.
	alive := []string{w.names.AliveDevice(d.cfg.Name)}
	if w.cfg.Tenants {
		alive = append(alive, w.names.TenantAliveDevice(d.cfg.Name))
	}
	for _, subj := range alive {
		if sub, err := w.nc.Subscribe(subj, d.onAlive); err != nil {
			w.logf("worker: %s: subscribe to session heartbeats: %v", d.cfg.Name, err)
		} else {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	for {
		actx, acancel := w.ctx, context.CancelFunc(func() {})
		if d.adopting {
			// The orphan's lease is taken over after one TTL unrenewed;
			// past three, another worker has it.
			actx, acancel = context.WithTimeout(w.ctx, 3*w.cfg.LeaseTTL)
		}
		// While another worker holds the lease, its checkpoints are read
		// ahead for the takeover.
		wctx, wcancel := context.WithCancel(w.ctx)
		var warming sync.WaitGroup
		l, err := acquireLease(actx, w.js, w.ctrl, w.names, d.cfg.Name, leaseValue{Worker: w.cfg.ID, Live: w.live}, w.cfg.LeaseTTL, func(holder string) {
			if !d.adopting {
				w.logf("worker: %s: standby, the lease is held by %s", d.cfg.Name, holder)
				if !w.cfg.NoReadAhead {
					warming.Go(func() { d.warmUp(wctx) })
				}
			}
			once()
		}, d.takeoverLag)
		acancel()
		wcancel()
		warming.Wait()
		if err != nil {
			d.close() // stopped while standing by
			return
		}
		d.mu.Lock()
		d.lease = l
		d.mu.Unlock()
		// The lease is renewed from here on: a restore may take longer
		// than its TTL, and a standby must not take the device meanwhile.
		renewStop := make(chan struct{})
		var renew sync.WaitGroup
		renew.Go(func() { d.renewLoop(l, renewStop) })
		if err := d.takeOver(w.ctx); err != nil {
			close(renewStop)
			renew.Wait()
			if w.ctx.Err() != nil {
				d.stepDown(true)
				d.close()
				return
			}
			w.logf("worker: %s: take over: %v", d.cfg.Name, err)
			d.stepDown(true)
			select {
			case <-w.stop:
				d.close()
				return
			case <-time.After(w.cfg.LeaseTTL):
			}
			continue
		}
		once()
		lost := d.run()
		close(renewStop)
		renew.Wait()
		select {
		case <-w.stop:
			d.stopErr = d.finish()
			return
		default:
		}
		broken := d.broken
		switch {
		case broken:
			// Logged by restoreFailed. A read of the checkpoint failed:
			// after a lease TTL, in which a standby may take the device,
			// it is taken over again.
		case lost:
			// The lease is still ours: taking it again is immediate, and
			// the device resumes from its last checkpoint on a new consumer.
			w.logf("worker: %s: consumer lost; taking the device over again", d.cfg.Name)
		default:
			w.logf("worker: %s: lease lost; stepping down to standby", d.cfg.Name)
		}
		d.stepDown(false)
		if broken {
			select {
			case <-w.stop:
				d.close()
				return
			case <-time.After(w.cfg.LeaseTTL):
			}
		}
		if d.adopting && !lost {
			d.close()
			return
		}
	}
}

// opsFilters are the subjects of the device's frames: the single-user
// sessions', and with tenants every tenant's.
func (d *device) opsFilters() []string {
	if d.w.cfg.Tenants {
		return []string{d.w.names.OpsDevice(d.cfg.Name), d.w.names.TenantOpsDevice(d.cfg.Name)}
	}
	return []string{d.w.names.OpsDevice(d.cfg.Name)}
}

// takeOver restores the last checkpoint and opens the feed after it.
func (d *device) takeOver(ctx context.Context) error {
	w := d.w
	t0 := time.Now()
	from, err := d.restore(ctx)
	d.clearWarm() // what the checkpoint did not name
	if err != nil {
		return err
	}
	d.applied.Store(from)
	now := time.Now()
	// Frames run as soon as the feed is there: they wait for the loop
	// until the device is set up and registered.
	d.loop.Lock()
	d.lastCkpt, d.idleCheck = now, now
	d.loopAt.Store(now.UnixNano())
	// The first frame says whether there are frames to catch up on.
	d.replay.on, d.replay.first, d.replay.restoredAt = false, true, from
	sessions := len(d.sessions)
	f, err := startFeed(ctx, w.js, w.names.OpsStream(), d.opsFilters(), d.cfg.Name, from, d.frame, &d.m, w.logf)
	if err != nil {
		d.loop.Unlock()
		return fmt.Errorf("worker: %s: %w", d.cfg.Name, err)
	}
	d.mu.Lock()
	d.feed = f
	d.mu.Unlock()
	if err := w.register(ctx, d, "serving"); err != nil {
		d.loop.Unlock()
		f.Stop()
		<-f.Done()
		return err
	}
	w.logf("worker: %s: serving (restored %d sessions at sequence %d in %v)", d.cfg.Name, sessions, from, time.Since(t0).Round(time.Millisecond))
	d.loop.Unlock()
	return nil
}

// renewLoop renews the lease four times a TTL until stop; on a loss it
// halts the device loop.
func (d *device) renewLoop(l *lease, stop <-chan struct{}) {
	t := time.NewTicker(d.w.cfg.LeaseTTL / 4)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.w.cfg.LeaseTTL)
		err := l.renew(ctx)
		cancel()
		if errors.Is(err, ErrLeaseLost) {
			d.halt()
			return
		} else if err != nil {
			d.w.logf("worker: %s: %v", d.cfg.Name, err)
		}
	}
}

// finishTimeout bounds a clean stop's last checkpoint.
var finishTimeout = 30 * time.Second

// finish ends a clean stop: a last checkpoint, the registry entry marked
// stopped, the lease given up. The entry and the release have time of
// their own when the checkpoint ran out the deadline (a broker that
// answered late, or a process that stood still): a standby then takes the
// device over at once rather than after the lease runs out, and the frames
// after the last committed checkpoint stay in the stream for it to replay.
func (d *device) finish() error {
	// The collectives in flight end first, within their own timeouts, as
	// they would have had they held the loop: the checkpoint holds them.
	_ = d.settleAll(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	var errs []error
	// Nothing of a state that a failed restore left is written: the next
	// owner restores the last checkpoint and replays.
	if !d.broken {
		if _, err := d.checkpoint(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// A lease that ran out meanwhile (a standby took the device, or
	// nobody renewed it while the process stood still) leaves nothing to
	// mark or give up: the entry is its next holder's.
	rctx, rcancel := atLeast(ctx, d.w.cfg.Heartbeat)
	if err := d.w.register(rctx, d, "stopped"); err != nil && !errors.Is(err, ErrLeaseLost) {
		errs = append(errs, err)
	}
	rcancel()
	if l := d.currentLease(); l != nil {
		lctx, lcancel := atLeast(ctx, d.w.cfg.LeaseTTL)
		errs = append(errs, l.release(lctx))
		lcancel()
	}
	d.close()
	return errors.Join(errs...)
}

// atLeast returns ctx while span or more is left before its deadline, and
// otherwise a context with ctx's values that ends span from now.
func atLeast(ctx context.Context, span time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) >= span {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), span)
}

// stepDown drops everything the device holds after losing (or failing to
// use) its lease. Nothing is written: the new owner's state is the truth.
func (d *device) stepDown(release bool) {
	d.halt()
	d.mu.Lock()
	l := d.lease
	d.lease, d.feed = nil, nil
	d.mu.Unlock()
	if release && l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), d.w.cfg.LeaseTTL)
		_ = l.release(ctx)
		cancel()
	}
	d.waitCheckpoint(true)
	d.stopFlying()
	d.stopLazy()
	d.drainFrees()
	for id, s := range d.sessions {
		s.freeAll(d)
		delete(d.sessions, id)
	}
	d.held = 0
	d.sessionCount.Store(0)
	d.noteSessions()
	d.tenantUses = nil
	d.view.Store(nil)
	d.noteUse(time.Now())
	d.applied.Store(0)
	d.broken = false
	d.resetCheckpoints()
	d.consumed = nil
	d.live.freed, d.live.order = nil, nil
}

func (d *device) currentLease() *lease {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lease
}

// serving reports whether this worker holds the device now.
func (d *device) serving() bool {
	l := d.currentLease()
	return l != nil && l.held()
}

// run keeps house while the feed runs the frames, until halt, or until
// the feed's consumer is lost for good (lost reports that).
func (d *device) run() (lost bool) {
	d.mu.Lock()
	f := d.feed
	d.mu.Unlock()
	if f == nil {
		return false
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	stop := d.w.stop
	for {
		select {
		case <-f.Done():
			if err := f.Err(); err != nil {
				d.w.logf("worker: %s: consumer after sequence %d: %v", d.cfg.Name, d.applied.Load(), err)
				return true
			}
			return d.broken // a failed restore: take the device over again
		case <-stop: // stopped before the feed was there to halt
			f.Stop()
			stop = nil
		case now := <-tick.C:
			d.loop.Lock()
			d.housekeep(now)
			d.loop.Unlock()
		}
	}
}

// frame runs one frame from the feed, then keeps house.
func (d *device) frame(msg jetstream.Msg, md *jetstream.MsgMetadata) {
	d.loop.Lock()
	defer d.loop.Unlock()
	d.running.Store(true)
	d.handle(msg, md)
	d.running.Store(false)
	now := time.Now()
	d.lastFrame, d.trimmed = now, false
	d.m.lastFrame.Store(now.UnixNano())
	d.housekeep(now)
}

// housekeep settles the collectives that are done, checkpoints when an op
// asked for it or the interval is up, and frees idle sessions once a
// second. Under loop.
func (d *device) housekeep(now time.Time) {
	d.settleDone()
	d.drainFrees()
	d.checkLazy()
	if iv := d.w.cfg.CheckpointInterval; d.ck.wanted || (iv > 0 && now.Sub(d.lastCkpt) >= iv) {
		// While a checkpoint is written the device goes on; the next one
		// starts at a housekeeping after it.
		if d.startCheckpoint() {
			d.ck.wanted = false
			d.lastCkpt = now
		}
	}
	if now.Sub(d.idleCheck) >= time.Second {
		d.evictIdle(now)
		d.noteSessions()
		d.noteUse(now)
		d.trimIdle(now)
		d.idleCheck = now
		d.loopAt.Store(now.UnixNano())
	}
}

// halt stops the feed; run returns once no frame runs.
func (d *device) halt() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.feed != nil {
		d.feed.Stop()
	}
}

// close frees every session and closes the backend. Called after run returned.
func (d *device) close() {
	d.clearWarm()
	d.waitCheckpoint(true)
	d.stopFlying()
	d.stopLazy()
	d.drainFrees()
	for id, s := range d.sessions {
		s.freeAll(d)
		delete(d.sessions, id)
	}
	d.held = 0
	d.sessionCount.Store(0)
	d.noteSessions()
	if c, ok := d.cfg.Backend.(io.Closer); ok {
		_ = c.Close()
	}
}

func (d *device) evictIdle(now time.Time) {
	limit := d.w.cfg.IdleTimeout
	if limit == 0 {
		return
	}
	for id, s := range d.sessions {
		if seen := d.lastSeen(s); now.Sub(seen) > limit {
			d.w.logf("worker: %s: session %s idle for %v, freeing %d tensors", d.cfg.Name, id, now.Sub(seen).Round(time.Second), s.tensors.len())
			s.freeAll(d)
			d.dropHeld(s)
			delete(d.sessions, id)
			d.noteFreed(id, now)
		}
	}
	d.forgetBeats(now, limit)
	d.sessionCount.Store(int64(len(d.sessions)))
}

// handle executes one frame, delivered with md (the feed checked it).
// Nothing in it may panic on wire input.
func (d *device) handle(msg jetstream.Msg, md *jetstream.MsgMetadata) {
	seq := md.Sequence.Stream
	d.m.pending.Store(md.NumPending)
	if d.replay.first {
		// Time the catch-up only when there are frames to catch up on.
		d.replay.first = false
		if md.NumPending > 0 {
			d.replay.on, d.replay.start, d.replay.frames, d.replay.ops0 = true, time.Now(), 0, d.m.ops.Load()
		}
	}
	if d.replay.on {
		d.replay.frames++
		if md.NumPending == 0 {
			defer d.replayed()
		}
	}
	if seq <= d.applied.Load() {
		return // already applied
	}
	defer d.applied.Store(seq)
	if d.w.cfg.Tenants && msg.Subject() == d.w.names.QuotaView(d.cfg.Name) {
		d.applyView(msg.Data(), seq)
		return
	}
	hdr := msg.Headers()
	reply := hdr.Get(subjects.HeaderReply)
	enc, encErr := codec.EncodingOf(hdr.Get(subjects.HeaderContentType))
	tn, sid, err := d.parseFrame(msg.Subject())
	if err != nil {
		if d.w.cfg.Tenants {
			reply, _ = d.tenantReply(d.w.names.SubjectTenant(msg.Subject()), reply)
		}
		d.failFrame(seq, reply, enc, codec.CodeMalformed, "%v", err)
		return
	}
	var st *tenantState
	if tn != "" {
		reply, _ = d.tenantReply(tn, reply)
		var rec *codec.Tenant
		refuse := func(code, format string, args ...any) {
			d.m.frames.Add(1)
			d.refuseFrame(msg.Data(), seq, reply, enc, encErr, codec.Error{Seq: seq, Code: code, Message: fmt.Sprintf(format, args...)})
		}
		if st, rec, err = d.w.tenant(tn); err != nil {
			refuse(codec.CodePermission, "%v", err)
			return
		}
		// Rated by the time the stream stored the frame, with the
		// bucket a checkpoint keeps: a replay decides as the first run.
		u := d.useOf(tn)
		if !d.allowFrame(u, tn, rec, md.Timestamp) {
			refuse(codec.CodeQuota, "tenant %s's frame quota: over %g frames per second on all devices (%g a second on others); the frame was not run",
				tn, rec.FPS, d.elsewhere(tn).FPS)
			return
		}
		if _, ok := d.sessions[sid]; !ok {
			if err := d.quotaSessions(tn, rec); err != nil {
				refuse(codec.CodeQuota, "%s", err.msg)
				return
			}
		}
		u.frames++
	}
	s, ok := d.sessions[sid]
	if !ok {
		if at, freed := d.wasFreed(sid); freed {
			d.m.frames.Add(1)
			d.refuseFreed(msg.Data(), seq, reply, enc, encErr, sid, at)
			return
		}
		if len(d.sessions) >= d.w.cfg.Limits.MaxSessions {
			d.failFrame(seq, reply, enc, codec.CodeLimit, "device %s has %d sessions, the limit", d.cfg.Name, len(d.sessions))
			return
		}
		s = newSession(sid)
		s.tenant, s.st = tn, st
		if tn != "" {
			s.use = d.useOf(tn)
		}
		d.sessions[sid] = s
		d.sessionCount.Store(int64(len(d.sessions)))
	}
	s.last = time.Now()
	n, numbered := frameNumber(hdr)
	if !numbered {
		d.run1(s, msg, seq)
		return
	}
	d.order(s, msg, seq, n)
}

// maxHeld bounds the frames, and heldBytes their bytes, that a session
// holds while it waits for a missing one; past either it goes on without
// the missing frames.
const (
	maxHeld   = 4096
	heldBytes = 256 << 20
)

// maxReusedOps bounds the ops array a device keeps between frames (4,096
// ops: about 3.4 MB); a larger frame's array goes with the frame.
const maxReusedOps = 4096

// order runs a session's numbered frames in the order of their numbers.
// The client numbers a session's frames from 1 and publishes each until
// the stream stores it, retrying with the same Nats-Msg-Id, so the stream
// holds each frame once within its duplicate window; but a frame stored on
// a retry (its first publish lost with a stream leader that stepped down)
// lands after frames published later. Frames ahead of a missing one are
// held until it comes; a frame whose number was run already (a retry
// stored past the duplicate window) is dropped. Which frames run, and in
// which order, depends only on the stream's content, so a replay after a
// takeover runs the same. While a session holds frames the device takes
// no checkpoint (see snapshot).
func (d *device) order(s *session, msg jetstream.Msg, seq, n uint64) {
	switch {
	case s.loose:
		s.loose = false
	case n <= s.frame:
		d.m.duplicates.Add(1)
		return // run already
	case n > s.frame+1:
		if _, dup := s.held[n]; dup {
			d.m.duplicates.Add(1)
			return
		}
		if len(s.held) == 0 {
			d.w.logf("worker: %s: session %s: frame %d stored before frame %d; holding it until frame %d comes", d.cfg.Name, s.id, n, s.frame+1, s.frame+1)
		}
		if s.held == nil {
			s.held = map[uint64]heldFrame{}
		}
		s.held[n] = heldFrame{msg: msg, seq: seq}
		s.heldSize += len(msg.Data())
		d.held++
		if len(s.held) <= maxHeld && s.heldSize <= heldBytes {
			return
		}
		// The missing frames are not coming: go on without them.
		lo := n
		for k := range s.held {
			lo = min(lo, k)
		}
		lost := codec.Error{Seq: seq, Code: codec.CodeFrameLost, Message: fmt.Sprintf(
			"frames %d to %d of session %s never reached the stream; %d later frames went on without them", s.frame+1, lo-1, s.id, len(s.held))}
		d.w.logf("worker: %s: %s", d.cfg.Name, lost.Message)
		s.pending = append(s.pending, lost)
		s.frame = lo - 1
		d.release(s)
		return
	}
	s.frame = n
	if !d.run1(s, msg, seq) {
		d.release(s)
	}
}

// release runs the held frames that follow the session's last one.
func (d *device) release(s *session) {
	for len(s.held) > 0 {
		h, ok := s.held[s.frame+1]
		if !ok {
			return
		}
		delete(s.held, s.frame+1)
		s.heldSize -= len(h.msg.Data())
		d.held--
		s.frame++
		if d.run1(s, h.msg, h.seq) {
			return
		}
	}
}

// dropHeld forgets a session's held frames (the session is gone).
func (d *device) dropHeld(s *session) {
	d.held -= len(s.held)
	s.held, s.heldSize = nil, 0
}

// holding reports whether any session holds frames. Device loop only.
func (d *device) holding() bool { return d.held > 0 }

// frameNumber reads a frame's number (header Fabric-Frame).
func frameNumber(h nats.Header) (uint64, bool) {
	v := h.Get(subjects.HeaderFrame)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	return n, true
}

// failFrame answers a frame that no session takes with one error.
func (d *device) failFrame(seq uint64, reply string, enc codec.Encoding, code, format string, args ...any) codec.Error {
	d.m.countError(code)
	d.m.frames.Add(1)
	e := codec.Error{Seq: seq, Code: code, Message: fmt.Sprintf(format, args...)}
	d.reply(reply, enc, &codec.Result{V: codec.Version, Seq: seq, Errors: []codec.Error{e}})
	return e
}

// run1 runs one frame of session s, stored at seq; it reports whether the
// frame closed the session.
func (d *device) run1(s *session, msg jetstream.Msg, seq uint64) (closed bool) {
	hdr := msg.Headers()
	reply := hdr.Get(subjects.HeaderReply)
	enc, encErr := codec.EncodingOf(hdr.Get(subjects.HeaderContentType))
	if encErr != nil {
		s.pending = append(s.pending, d.failFrame(seq, reply, enc, codec.CodeMalformed, "%v", encErr))
		return false
	}
	// The next decode zeroes the ops it reuses (their strings and slices
	// are copies, sharing nothing with the message): only an array over
	// maxReusedOps is let go.
	frame := &d.decoded
	defer func() {
		if cap(frame.Ops) > maxReusedOps {
			frame.Ops = nil
		}
	}()
	err := codec.DecodeFrameInto(enc, msg.Data(), frame)
	if err != nil {
		code := codec.CodeMalformed
		switch {
		case errors.Is(err, codec.ErrVersion):
			code = codec.CodeVersion
		case errors.Is(err, codec.ErrTooManyOps):
			code = codec.CodeLimit
		}
		s.pending = append(s.pending, d.failFrame(seq, reply, enc, code, "%v", err))
		return false
	}
	reply, badReply := d.tenantReply(s.tenant, reply)
	x := exec{d: d, s: s, seq: seq, reply: reply, badReply: badReply, enc: enc}
	start, n := time.Now(), 0
	f, _ := d.cfg.Backend.(fuser)
	rl, _ := d.cfg.Backend.(reluer)
	tp, _ := d.cfg.Backend.(transposer)
	ip, _ := d.cfg.Backend.(inPlacer)
	var uses map[uint64][]int
	if f != nil && !d.w.cfg.NoFusion {
		if d.uses == nil && len(frame.Ops) <= maxReusedOps {
			d.uses = make(map[uint64][]int, 2*maxReusedOps)
		}
		if len(frame.Ops) <= maxReusedOps {
			uses = frameUsesInto(frame.Ops, d.uses)
			defer clear(d.uses)
		} else {
			uses = frameUses(frame.Ops)
		}
	}
	for n < len(frame.Ops) && !closed {
		if uses != nil {
			if k := x.fused(f, frame.Ops, uses, n); k > 0 {
				n += k
				continue
			}
			if rl != nil {
				if k := x.withRelu(rl, frame.Ops, uses, n); k > 0 {
					n += k
					continue
				}
			}
			if tp != nil {
				if k := x.withTransposed(tp, frame.Ops, uses, n); k > 0 {
					n += k
					continue
				}
			}
			x.donate = donations(ip, frame.Ops, uses, n)
		}
		closed = x.op(n, &frame.Ops[n])
		x.donate = nil
		n++
	}
	d.m.frameDone(n, time.Since(start), &x.io)
	if closed {
		d.dropHeld(s)
		delete(d.sessions, s.id)
		d.sessionCount.Store(int64(len(d.sessions)))
	}
	return closed
}

// tenantReply returns the subject on which a frame of tenant is answered:
// its Fabric-Reply when that lies under the tenant's inbox, where NATS lets
// no one else subscribe; else none, and the subject refused. Frames of the
// single-user layout (tenant "") are answered where they ask.
func (d *device) tenantReply(tenant, reply string) (answer, refused string) {
	if reply == "" || d.w.names.InTenantInbox(tenant, reply) {
		return reply, ""
	}
	return "", reply
}

// parseFrame returns the tenant ("" for none) and the session key (see
// subjects.SessionKey) of a frame's subject. Without Config.Tenants only
// the single-user layout is accepted.
func (d *device) parseFrame(subject string) (tenant, key string, err error) {
	if !d.w.cfg.Tenants {
		_, sid, err := d.w.names.ParseOps(subject)
		return "", sid, err
	}
	tenant, _, sid, err := d.w.names.ParseFrame(subject)
	return tenant, subjects.SessionKey(tenant, sid), err
}

// replayed ends the catch-up after a takeover: every frame that was in the
// stream has been applied.
func (d *device) replayed() {
	d.replay.on = false
	el := time.Since(d.replay.start)
	ops := d.m.ops.Load() - d.replay.ops0
	d.w.logf("worker: %s: caught up: replayed %d frames (%d ops) after sequence %d in %v (%.0f ops/s)",
		d.cfg.Name, d.replay.frames, ops, d.replay.restoredAt, el.Round(time.Millisecond), float64(ops)/el.Seconds())
}

// reply publishes r on subject; errors are logged, never fatal.
func (d *device) reply(subject string, enc codec.Encoding, r *codec.Result) {
	if subject == "" || d.broken {
		return
	}
	b, err := codec.Marshal(enc, r)
	if err != nil {
		d.w.logf("worker: %s: encode result: %v", d.cfg.Name, err)
		return
	}
	if enc == codec.CBOR {
		// A result without Content-Type is CBOR: no header to encode here
		// or to parse at the client.
		err = d.w.nc.Publish(subject, b)
	} else {
		msg := &nats.Msg{Subject: subject, Data: b, Header: nats.Header{subjects.HeaderContentType: []string{enc.String()}}}
		err = d.w.nc.PublishMsg(msg)
	}
	if err != nil {
		d.w.logf("worker: %s: reply to %s: %v", d.cfg.Name, subject, err)
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
