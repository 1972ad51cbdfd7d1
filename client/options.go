package client

import (
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/subjects"
)

type options struct {
	prefix        string
	flushDelay    time.Duration
	maxFrameOps   int
	maxFrameBytes int
	inlineUpload  int
	natsOpts      []nats.Option
	window        int
	frameCheck    time.Duration
	objectTimeout time.Duration
	lanes         int
	heartbeat     time.Duration
	deviceTimeout time.Duration
	callTimeout   time.Duration
	failFast      time.Duration
	// creds is the creds file of WithCreds and credsTenant the tenant its
	// JWT names; tenant is WithTenant's.
	creds, credsTenant, tenant string
}

func defaultOptions() options {
	return options{
		prefix:        subjects.DefaultPrefix,
		flushDelay:    2 * time.Millisecond,
		maxFrameOps:   4096,
		maxFrameBytes: 1 << 20,
		inlineUpload:  4 << 20,
		window:        256,
		frameCheck:    200 * time.Millisecond,
		objectTimeout: 5 * time.Second,
		lanes:         min(4, max(1, runtime.NumCPU()/4)),
		heartbeat:     30 * time.Second,
		deviceTimeout: 30 * time.Second,
		callTimeout:   5 * time.Minute,
		failFast:      2750 * time.Millisecond,
	}
}

// WithCallTimeout bounds a read, sync or close whose context has no
// deadline (default 5 minutes; 0: none). It must be longer than the
// longest op the device runs.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: call timeout %v", ErrInvalidOption, d)
		}
		o.callTimeout = d
		return nil
	}
}

// WithFailFast sets how long a read, sync or close goes on while the
// fabric cannot be reached (no connection, no responders, no stream
// leader, no quorum) before it fails with ErrUnavailable naming the cause
// (default 2.75s; the checks are up to a second apart, half a second
// once it cannot, each bounded by 750 ms, so the call fails within 4.5 s
// of the fabric's silence). The leader elections after a cluster node is killed take 1.5
// to 3 s with the broker's raft timers (4 to 9 s with nats-server's own,
// see broker.RaftTimers): raise it above those for calls that ride them
// out.
func WithFailFast(d time.Duration) Option {
	return func(o *options) error {
		if d < 100*time.Millisecond || d > time.Hour {
			return fmt.Errorf("%w: fail-fast time %v, want [100ms, 1h]", ErrInvalidOption, d)
		}
		o.failFast = d
		return nil
	}
}

// WithDeviceTimeout sets how long a read or sync waits for a device that
// no worker serves (no serving registry entry with a recent heartbeat)
// before it fails with ErrNoDevice (default 30s; 0: wait for ctx alone).
// A standby takes a device over within seconds of its worker's death.
func WithDeviceTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: device timeout %v", ErrInvalidOption, d)
		}
		o.deviceTimeout = d
		return nil
	}
}

// WithHeartbeat sets how often the client tells the workers that its open
// sessions are alive (default 30s; 0: never). A worker frees a session
// that sent no frame and no heartbeat for its idle timeout (10 minutes by
// default), so the interval must be well under that timeout.
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return fmt.Errorf("%w: heartbeat %v", ErrInvalidOption, d)
		}
		o.heartbeat = d
		return nil
	}
}

// Option configures a Client.
type Option func(*options) error

// WithPrefix sets the subject prefix (default "fabric").
func WithPrefix(p string) Option {
	return func(o *options) error {
		if err := subjects.ValidateToken(p); err != nil {
			return fmt.Errorf("%w: prefix: %v", ErrInvalidOption, err)
		}
		o.prefix = p
		return nil
	}
}

// WithFlushDelay sets how long queued ops may wait for more before they
// are sent (default 2ms). Reads and syncs always flush at once.
func WithFlushDelay(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 || d > time.Second {
			return fmt.Errorf("%w: flush delay %v, want (0, 1s]", ErrInvalidOption, d)
		}
		o.flushDelay = d
		return nil
	}
}

// WithMaxFrame bounds a frame's ops and bytes (defaults 4096 ops, 1 MiB).
func WithMaxFrame(ops, bytes int) Option {
	return func(o *options) error {
		if ops < 1 || ops > 1<<16 || bytes < 4<<10 || bytes > 8<<20 {
			return fmt.Errorf("%w: frame of %d ops, %d bytes; want 1..65536 ops, 4 KiB..8 MiB", ErrInvalidOption, ops, bytes)
		}
		o.maxFrameOps, o.maxFrameBytes = ops, bytes
		return nil
	}
}

// WithInlineUpload sets the largest upload sent inside a frame (default 4
// MiB); larger ones go through the object store.
func WithInlineUpload(bytes int) Option {
	return func(o *options) error {
		if bytes < 0 || bytes > 7<<20 {
			return fmt.Errorf("%w: inline upload limit %d, want 0..7 MiB", ErrInvalidOption, bytes)
		}
		o.inlineUpload = bytes
		return nil
	}
}

// WithPublishWindow bounds the frames in flight without an acknowledgement
// (default 256).
func WithPublishWindow(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: publish window %d", ErrInvalidOption, n)
		}
		o.window = n
		return nil
	}
}

// WithFrameCheck sets how long a read, sync or close waits for its answer
// before it publishes the frame carrying it again, asking for the stream's
// acknowledgement (default 200ms). Such frames go out without asking for
// it, the answer being proof enough; the frame's Nats-Msg-Id makes the
// stream store it once. A refusal (over the stream's max message size, the
// stream full) fails the call with ErrPublish saying why; once stored, the
// call checks at doubling intervals up to a second apart that the stream
// has a leader and the device a live worker (see WithFailFast and
// WithDeviceTimeout). Checks are made only for calls not answered within d.
func WithFrameCheck(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Millisecond || d > time.Minute {
			return fmt.Errorf("%w: frame check %v, want [1ms, 1m]", ErrInvalidOption, d)
		}
		o.frameCheck = d
		return nil
	}
}

// WithObjectTimeout bounds each step of an object store read or write
// (large uploads and results), and how long a read copying a result while
// the worker writes it waits for the next chunk before it decides that
// the worker stopped and asks again (default 5s).
func WithObjectTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Millisecond || d > time.Hour {
			return fmt.Errorf("%w: object timeout %v, want [1ms, 1h]", ErrInvalidOption, d)
		}
		o.objectTimeout = d
		return nil
	}
}

// WithLanes sets how many connections move a large upload or result as
// pieces in parallel, 1 to 16 (default a lane for every four cores, 1 to
// 4; see objectstore.Lanes), when the transfer bucket is kept in memory. The lanes beside the client's connection are
// dialled, with its options, at the first upload or read that uses them;
// a lane that cannot be dialled is done without. 1 moves every object
// whole on the client's connection.
func WithLanes(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 16 {
			return fmt.Errorf("%w: lanes %d, want 1 to 16", ErrInvalidOption, n)
		}
		o.lanes = n
		return nil
	}
}

// WithNATSOptions passes options to nats.Connect (credentials, TLS, name).
func WithNATSOptions(opts ...nats.Option) Option {
	return func(o *options) error {
		o.natsOpts = append(o.natsOpts, opts...)
		return nil
	}
}
