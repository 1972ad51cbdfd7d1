// Package sweep answers and removes the op frames that no worker will
// ever run, so that no frame waits in FABRIC_OPS for ever:
//
//   - frames on a subject whose device or session token is not valid
//     (say fabric.ops.cpu!0.s: NATS allows the character, the fabric does
//     not), answered at once with error code invalid_subject;
//   - frames to a device that no worker has served for the grace period
//     (no consumer of the device on the stream, and its registry entry
//     missing or not serving with a recent heartbeat), answered with
//     error code no_device. The grace starts again after passes failed
//     or paused (a cluster that lost its quorum).
//
// Each such frame's read, sync and close ops get an answer carrying their
// tag, on the frame's Fabric-Reply subject, so the client's waiting call
// returns with the error; then the frames answered are purged from the
// stream (by subject, up to the last one answered, so a frame stored
// meanwhile waits for the next pass). The stream's subjects only take
// op subjects of the right shape (fabric.ops.*.*, and fabric.t.*.ops.*.* with
// tenants; a tenant's frame is answered only under its inbox), so frames with a token
// too many never reach it.
//
// A fabric runs one sweeper at a time: the broker runs it on the node that
// is JetStream's meta leader (Config.Active).
package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// Config is a sweeper's assembled configuration.
type Config struct {
	// Names are the fabric's subject and bucket names.
	Names subjects.Names
	// Grace is how long a device goes unserved before its frames are
	// answered no_device and removed: longer than a worker's restart.
	Grace time.Duration
	// Interval is the time between two passes.
	Interval time.Duration
	// Active reports whether this process should sweep now (nil: always).
	Active func() bool
	// Logf receives what was swept (nil: nothing).
	Logf func(format string, args ...any)
}

// DefaultConfig sweeps every 2 s with a 30 s grace.
func DefaultConfig() Config {
	return Config{Names: subjects.Default(), Grace: 30 * time.Second, Interval: 2 * time.Second}
}

// ErrInvalidConfig wraps configuration errors.
var ErrInvalidConfig = errors.New("sweep: invalid config")

// Sweeper runs passes on its own goroutine from Start to Stop.
type Sweeper struct {
	cfg Config
	nc  *nats.Conn
	js  jetstream.JetStream

	// unserved: since when each device seen with frames has had no live
	// worker; lastPass: when the last pass ended well. Pass only.
	unserved map[string]time.Time
	lastPass time.Time

	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// New checks cfg and prepares a sweeper on nc (which the caller closes).
func New(nc *nats.Conn, cfg Config) (*Sweeper, error) {
	if cfg.Grace < 0 || cfg.Interval <= 0 {
		return nil, fmt.Errorf("%w: grace %v, interval %v", ErrInvalidConfig, cfg.Grace, cfg.Interval)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	return &Sweeper{cfg: cfg, nc: nc, js: js, unserved: map[string]time.Time{}, stop: make(chan struct{})}, nil
}

// Start runs a pass every Interval until Stop.
func (s *Sweeper) Start() {
	s.wg.Go(func() {
		t := time.NewTicker(s.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			if s.cfg.Active != nil && !s.cfg.Active() {
				clear(s.unserved)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*s.cfg.Interval+10*time.Second)
			if _, err := s.Pass(ctx); err != nil {
				s.logf("sweep: %v", err)
			}
			cancel()
		}
	})
}

// Stop ends the passes and waits for the one under way.
func (s *Sweeper) Stop() {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// Pass looks at every subject of the op stream once, answering and
// removing the frames no worker will run, and returns how many it removed.
// Not safe to run twice at once.
func (s *Sweeper) Pass(ctx context.Context) (int, error) {
	names := s.cfg.Names
	stream, err := s.js.Stream(ctx, names.OpsStream())
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", names.OpsStream(), err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(names.Prefix()+".>"))
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", names.OpsStream(), err)
	}
	kv, err := s.js.KeyValue(ctx, names.CtrlBucket())
	if err != nil {
		return 0, fmt.Errorf("bucket %s: %w", names.CtrlBucket(), err)
	}
	// A device with a consumer on the stream is being served, whatever
	// its registry entry says (heartbeats fail while the control bucket
	// has no leader).
	consuming := map[string]bool{}
	consumers := stream.ConsumerNames(ctx)
	for name := range consumers.Name() {
		if i := strings.LastIndexByte(name, '_'); i > 0 {
			if j := strings.LastIndexByte(name[:i], '_'); j > 0 {
				consuming[name[:j]] = true
			}
		}
	}
	if err := consumers.Err(); err != nil {
		return 0, fmt.Errorf("consumers of %s: %w", names.OpsStream(), err)
	}
	now := time.Now()
	if s.lastPass.IsZero() || now.Sub(s.lastPass) > 3*s.cfg.Interval+10*time.Second {
		// Passes failed or paused (the cluster was down, this node lost
		// the meta leadership): what was unserved then says nothing now.
		clear(s.unserved)
	}
	served := map[string]bool{}
	seen := map[string]bool{}
	removed := 0
	for subject := range info.State.Subjects {
		_, device, _, perr := names.ParseFrame(subject)
		if perr != nil {
			n, err := s.answer(ctx, stream, subject, codec.CodeInvalidSubject,
				fmt.Sprintf("%v: the frame was removed unrun (device and session tokens are 1 to %d of A-Z a-z 0-9 _ -)", perr, subjects.MaxTokenLen))
			removed += n
			if err != nil {
				return removed, err
			}
			continue
		}
		seen[device] = true
		ok, known := served[device]
		if !known {
			ok = consuming[device] || live(ctx, kv, device, now)
			served[device] = ok
		}
		if ok {
			delete(s.unserved, device)
			continue
		}
		since, waiting := s.unserved[device]
		if !waiting {
			s.unserved[device] = now
			continue
		}
		if now.Sub(since) < s.cfg.Grace {
			continue
		}
		n, err := s.answer(ctx, stream, subject, codec.CodeNoDevice,
			fmt.Sprintf("no worker has served device %s for %v; the frame was removed unrun: start a worker serving %s (jetfabric devices lists the devices served)", device, now.Sub(since).Round(time.Second), device))
		removed += n
		if err != nil {
			return removed, err
		}
	}
	for d := range s.unserved {
		if !seen[d] {
			delete(s.unserved, d)
		}
	}
	s.lastPass = time.Now()
	return removed, nil
}

// liveBeat is how recent a serving device's heartbeat must be, as the
// client's Live says.
const liveBeat = 10 * time.Second

// live reports whether the registry shows device served by a worker. A
// registry it cannot read counts as served: nothing is removed on doubt.
func live(ctx context.Context, kv jetstream.KeyValue, device string, now time.Time) bool {
	e, err := kv.Get(ctx, subjects.DeviceKey(device))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return false
	} else if err != nil {
		return true
	}
	var d codec.Device
	if json.Unmarshal(e.Value(), &d) != nil {
		return false
	}
	return d.State == "serving" && now.Sub(d.Beat) < liveBeat
}

// answer answers every frame stored on subject with an error of code and
// message, then purges them.
func (s *Sweeper) answer(ctx context.Context, stream jetstream.Stream, subject, code, message string) (int, error) {
	var last uint64
	n := 0
	for seq := uint64(1); ; n++ {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		} else if err != nil {
			return 0, fmt.Errorf("read %s at %d: %w", subject, seq, err)
		}
		s.reply(m, code, message)
		last, seq = m.Sequence, m.Sequence+1
	}
	if n == 0 {
		return 0, nil
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(last+1)); err != nil {
		return 0, fmt.Errorf("purge %s: %w", subject, err)
	}
	s.logf("sweep: removed %d frames on %s unrun: %s", n, subject, code)
	return n, nil
}

// reply answers the frame m: one answer a tagged op (read, sync, close),
// each carrying its tag so the call waiting on it returns; one answer
// without a tag when it has none or cannot be decoded.
func (s *Sweeper) reply(m *jetstream.RawStreamMsg, code, message string) {
	to := m.Header.Get(subjects.HeaderReply)
	if to == "" {
		return
	}
	// A tenant's frame is answered only under its inbox, where no one
	// else may subscribe.
	if !s.cfg.Names.InTenantInbox(s.cfg.Names.SubjectTenant(m.Subject), to) {
		return
	}
	enc, err := codec.EncodingOf(m.Header.Get(subjects.HeaderContentType))
	if err != nil {
		enc = codec.JSON
	}
	var results []codec.Result
	if f, err := codec.DecodeFrame(enc, m.Data); err == nil {
		for i, op := range f.Ops {
			if op.Tag != 0 {
				results = append(results, codec.Result{V: codec.Version, Seq: m.Sequence, Tag: op.Tag,
					Errors: []codec.Error{{Seq: m.Sequence, Index: i, Op: op.Op, Code: code, Message: message}}})
			}
		}
	}
	if len(results) == 0 {
		results = []codec.Result{{V: codec.Version, Seq: m.Sequence, Errors: []codec.Error{{Seq: m.Sequence, Code: code, Message: message}}}}
	}
	for i := range results {
		b, err := codec.Marshal(enc, &results[i])
		if err != nil {
			continue
		}
		msg := &nats.Msg{Subject: to, Data: b}
		if enc != codec.CBOR {
			msg.Header = nats.Header{subjects.HeaderContentType: []string{enc.String()}}
		}
		if err := s.nc.PublishMsg(msg); err != nil {
			s.logf("sweep: answer on %s: %v", to, err)
		}
	}
}

func (s *Sweeper) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}
