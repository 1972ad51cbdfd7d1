package client

import (
	"fmt"
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
}

func defaultOptions() options {
	return options{
		prefix:        subjects.DefaultPrefix,
		flushDelay:    2 * time.Millisecond,
		maxFrameOps:   4096,
		maxFrameBytes: 1 << 20,
		inlineUpload:  4 << 20,
		window:        256,
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

// WithNATSOptions passes options to nats.Connect (credentials, TLS, name).
func WithNATSOptions(opts ...nats.Option) Option {
	return func(o *options) error {
		o.natsOpts = append(o.natsOpts, opts...)
		return nil
	}
}
