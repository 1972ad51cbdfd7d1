package worker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/natsconn"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

// Worker serves its devices until Stop.
type Worker struct {
	cfg   Config
	names subjects.Names
	nc    *nats.Conn
	js    jetstream.JetStream
	ctrl  jetstream.KeyValue
	ckpt  *objectstore.Store
	// xfer is the transfer bucket on every transfer lane; xfer[0] moves
	// whole objects. results is the results bucket (FABRIC_RESULTS, in the
	// broker's memory) on every lane, nil when the broker has none.
	xfer, results objectstore.Lanes
	// laneJS are the transfer lanes' JetStreams (Config.Lanes), on the
	// connections laneNC; ckptNC is ckpt's connection (see dial).
	laneJS []jetstream.JetStream
	laneNC []*nats.Conn
	ckptNC *nats.Conn

	devices []*device
	jobs    []*jobLoop

	adoptMu sync.Mutex
	adopted []*device // devices taken over from dead workers (see Adopt)
	// adoptErrs are the clean-stop errors of adopted devices.
	adoptErrs []error
	svc       micro.Service // see micro.go
	// live is the token of the worker's liveness subject, named in its
	// leases; liveSub answers it (see answerLive).
	live    string
	liveSub *nats.Subscription
	// tn: the tenants' records and use (Config.Tenants only).
	tn tenants

	stopOnce sync.Once
	stop     chan struct{}
	ctx      context.Context // cancelled by Stop; bounds lease waits
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// New checks cfg and prepares a worker on nc; Start runs it. The worker does
// not own nc: the caller closes it after Stop.
func New(nc *nats.Conn, cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	names, _ := subjects.New(cfg.Prefix)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	w := &Worker{cfg: cfg, names: names, nc: nc, js: js, stop: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	for _, d := range cfg.Devices {
		w.devices = append(w.devices, newDevice(w, d))
	}
	return w, nil
}

// Start waits for the fabric's stream and buckets, then starts every
// device: each takes its device's lease, restores the last checkpoint,
// replays the frames after it and serves; a device whose lease another live
// worker holds waits as a standby and takes over when that worker stops
// renewing it. Start returns once every device is serving or standing by.
func (w *Worker) Start(ctx context.Context) error {
	if err := waitProvisioned(ctx, w.js, w.names); err != nil {
		return err
	}
	var err error
	if w.ctrl, err = w.js.KeyValue(ctx, w.names.CtrlBucket()); err != nil {
		return fmt.Errorf("worker: bucket %s: %w", w.names.CtrlBucket(), err)
	}
	var ckptJS jetstream.JetStream
	w.laneJS = make([]jetstream.JetStream, w.cfg.Lanes)
	for i := range w.laneJS {
		var nc *nats.Conn
		if nc, w.laneJS[i] = w.dial(fmt.Sprintf("transfers %d", i+1)); nc != nil {
			w.laneNC = append(w.laneNC, nc)
		}
	}
	w.ckptNC, ckptJS = w.dial("checkpoints")
	if w.xfer, err = w.openLanes(w.names.XferBucket()); err == nil {
		w.ckpt, err = objectstore.New(ckptJS, w.names.CkptBucket(), objectstore.WithTimeout(w.cfg.ObjectTimeout))
	}
	if err == nil {
		if w.results, err = w.openLanes(w.names.ResultsBucket()); errors.Is(err, objectstore.ErrBucketNotFound) {
			w.logf("worker: no bucket %s (a broker before it): large results go to %s", w.names.ResultsBucket(), w.names.XferBucket())
			w.results, err = nil, nil
		}
	}
	if err != nil {
		w.closeSecond()
		return fmt.Errorf("worker: %w", err)
	}
	if w.cfg.Tenants {
		if err := w.watchTenants(ctx); err == nil {
			err = w.watchUse()
		}
		if err != nil {
			w.closeSecond()
			return err
		}
	}
	if err := w.answerLive(); err != nil {
		w.closeSecond()
		return err
	}
	tuneGC(w)
	ready := make(chan error, len(w.devices))
	for _, d := range w.devices {
		w.wg.Go(func() { d.serve(ready) })
	}
	for range w.devices {
		select {
		case err := <-ready:
			if err != nil {
				w.Stop(context.Background())
				return err
			}
		case <-ctx.Done():
			w.Stop(context.Background())
			return fmt.Errorf("worker: start: %w", ctx.Err())
		}
	}
	for _, j := range w.cfg.Jobs {
		l, err := w.startJobs(ctx, j)
		if err != nil {
			w.Stop(context.Background())
			return err
		}
		w.jobs = append(w.jobs, l)
		w.wg.Go(l.run)
	}
	w.wg.Go(w.heartbeat)
	w.wg.Go(w.reclaimLoop)
	if w.cfg.Adopt != nil {
		w.wg.Go(w.adoptLoop)
	}
	if w.cfg.TelemetryInterval > 0 && slices.ContainsFunc(w.devices, func(d *device) bool { return d.cfg.Telemetry != nil }) {
		w.wg.Go(w.telemetry)
	}
	if err := w.startService(); err != nil {
		w.Stop(context.Background())
		return err
	}
	return nil
}

// waitProvisioned polls until the ops stream and both buckets exist.
func waitProvisioned(ctx context.Context, js jetstream.JetStream, names subjects.Names) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Stream(cctx, names.OpsStream())
		if err == nil {
			_, err = js.KeyValue(cctx, names.CtrlBucket())
		}
		if err == nil {
			_, err = js.ObjectStore(cctx, names.XferBucket())
		}
		if err == nil {
			_, err = js.ObjectStore(cctx, names.CkptBucket())
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worker: fabric not provisioned (is the broker up?): %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop ends every device loop. A device that is serving writes a final
// checkpoint, is marked stopped in the registry and gives its lease up, so
// a standby takes over at once. Stop waits for the worker's goroutines, or
// for ctx. Safe to call twice.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() {
		w.stopService()
		close(w.stop)
		w.cancel()
		for _, d := range w.allDevices() {
			d.halt()
		}
		for _, j := range w.jobs {
			j.stop()
		}
		untuneGC(w)
	})
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("worker: stop: %w", ctx.Err())
	}
	if w.liveSub != nil {
		_ = w.liveSub.Unsubscribe()
	}
	w.closeSecond()
	var errs []error
	for _, d := range w.devices {
		errs = append(errs, d.stopErr)
	}
	w.adoptMu.Lock()
	errs = append(errs, w.adoptErrs...)
	w.adoptMu.Unlock()
	return errors.Join(errs...)
}

// answerLive subscribes the worker's liveness subject, with a token of
// its own, before any lease names it: while the worker's connection is up
// a request there is answered, and once the connection is gone the server
// answers "no responders", which tells a standby to take the worker's
// leases without waiting out their TTL (see holderGone). The worker asks
// the subject itself first: where its permissions refuse the subject, its
// leases name none (a standby waits out the TTL, as with a worker before
// it), rather than one that would read as gone.
func (w *Worker) answerLive() error {
	live := rand.Text()
	subj := w.names.WorkerLive(live)
	sub, err := w.nc.Subscribe(subj, func(m *nats.Msg) {
		if w.names.Answerable(m.Reply) {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return fmt.Errorf("worker: subscribe to its liveness subject: %w", err)
	}
	if _, err := w.nc.Request(subj, nil, liveCheckTimeout); err != nil {
		_ = sub.Unsubscribe()
		w.logf("worker: its liveness subject %s does not answer (%v): a standby takes its devices after the lease TTL only", subj, err)
		return nil
	}
	w.live, w.liveSub = live, sub
	return nil
}

// liveCheckTimeout bounds answerLive's request to itself.
const liveCheckTimeout = 5 * time.Second

// ID is the worker's id in the registry and in its service metadata.
func (w *Worker) ID() string { return w.cfg.ID }

// Devices lists the names of the devices this worker serves.
func (w *Worker) Devices() []string {
	names := make([]string, len(w.devices))
	for i, d := range w.devices {
		names[i] = d.cfg.Name
	}
	return names
}

func (w *Worker) heartbeat() {
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		for _, d := range w.allDevices() {
			if !d.serving() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Heartbeat)
			if err := w.register(ctx, d, "serving"); err != nil && !errors.Is(err, ErrLeaseLost) {
				w.logf("worker: heartbeat %s: %v", d.cfg.Name, err)
			}
			cancel()
		}
		if w.cfg.Tenants {
			w.publishViews()
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// telemetry samples every device that has a source and publishes the
// samples, until Stop. A device whose sampling fails is reported once,
// until it succeeds again.
func (w *Worker) telemetry() {
	t := time.NewTicker(w.cfg.TelemetryInterval)
	defer t.Stop()
	failing := make([]bool, len(w.devices))
	for {
		for i, d := range w.devices {
			if d.cfg.Telemetry == nil || !d.serving() {
				continue
			}
			s, err := d.cfg.Telemetry()
			if err != nil && !failing[i] {
				w.logf("worker: %s: telemetry: %v", d.cfg.Name, err)
			}
			failing[i] = err != nil
			s.Device = d.cfg.Name
			if s.Time.IsZero() {
				s.Time = time.Now().UTC()
			}
			b, err := json.Marshal(s)
			if err == nil {
				err = w.nc.Publish(w.names.Telemetry(d.cfg.Name), b)
			}
			if err != nil {
				w.logf("worker: %s: publish telemetry: %v", d.cfg.Name, err)
			}
		}
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// register writes the device's registry entry, fenced on its lease.
func (w *Worker) register(ctx context.Context, d *device, state string) error {
	b, err := json.Marshal(w.entry(d, state))
	if err != nil {
		return err
	}
	l := d.currentLease()
	if l == nil {
		return ErrLeaseLost
	}
	if err := l.write(ctx, subjects.DeviceKey(d.cfg.Name), b); err != nil {
		return fmt.Errorf("worker: register %s: %w", d.cfg.Name, err)
	}
	return nil
}

// entry is the device's registry entry as of now.
func (w *Worker) entry(d *device, state string) codec.Device {
	e := codec.Device{
		Name:     d.cfg.Name,
		Kind:     d.cfg.Kind,
		Backend:  d.cfg.Backend.Name(),
		Worker:   w.cfg.ID,
		Host:     hostname(),
		Cores:    d.cfg.Cores,
		Memory:   d.cfg.Memory,
		Props:    d.cfg.Props,
		Started:  d.started,
		Beat:     time.Now().UTC(),
		Sessions: int(d.sessionCount.Load()),
		Applied:  d.applied.Load(),
		State:    state,
		Ops:      d.m.ops.Load(),
		Frames:   d.m.frames.Load(),
		Lag:      d.m.pending.Load(),
		Bytes:    d.mem.held.Load(),
		Budget:   d.mem.budget,
		Stalled:  d.m.stalled.Load(),
		Tenants:  d.used(),
	}
	if at := d.m.lastFrame.Load(); at > 0 {
		e.LastFrame = time.Unix(0, at).UTC()
	}
	return e
}

func (w *Worker) logf(format string, args ...any) {
	if w.cfg.Logf != nil {
		w.cfg.Logf(format, args...)
	}
}

// dial opens another connection of the worker, with the options of its
// first, for the objects of purpose and its JetStream: checkpoint writes
// and restore reads, or transfers (uploads, large results, collective
// pieces). An object of megabytes written or read on the connection that
// carries the frames, the results and the key-value writes would hold them
// back: a result published behind a checkpoint's window of chunks waited
// tens of milliseconds, and the key-value reads and writes of a small
// all_reduce's pieces would queue behind the chunks of a large one still
// moving. On failure, nil and the first connection's JetStream, which
// serves then.
func (w *Worker) dial(purpose string) (*nats.Conn, jetstream.JetStream) {
	nc, err := natsconn.Another(w.nc, strings.TrimSpace(w.nc.Opts.Name+" "+purpose))
	if err != nil {
		w.logf("worker: a connection of its own for %s: %v; they share the worker's", purpose, err)
		return nil, w.js
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		w.logf("worker: a connection of its own for %s: %v; they share the worker's", purpose, err)
		return nil, w.js
	}
	return nc, js
}

// closeSecond closes the connections dial opened.
func (w *Worker) closeSecond() {
	for _, nc := range append(w.laneNC, w.ckptNC) {
		if nc != nil {
			nc.Close()
		}
	}
}

// openLanes opens bucket on every transfer lane.
func (w *Worker) openLanes(bucket string) (objectstore.Lanes, error) {
	return objectstore.NewLanes(w.laneJS, bucket, objectstore.WithTimeout(w.cfg.ObjectTimeout))
}
