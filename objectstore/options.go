package objectstore

import (
	"fmt"
	"time"
)

// Defaults; see the package documentation for how they were chosen.
const (
	// DefaultChunkSize is the payload of one chunk message: 256 KiB.
	DefaultChunkSize = 256 << 10
	// DefaultWindow is how many chunks a writer keeps unacknowledged:
	// 16 MiB with the default chunk size.
	DefaultWindow = 64
	// DefaultRetries is how many times a writer or reader starts over
	// from the last good chunk after a refusal, a timeout or a replica
	// that lags.
	DefaultRetries = 8
	// DefaultPartThreshold is the size above which WithParts splits.
	DefaultPartThreshold = 256 << 20
	// DefaultReadAhead bounds the bytes one Get has requested from the
	// broker and not yet received: 4 MiB.
	DefaultReadAhead = 4 << 20
	// DefaultFollowAhead bounds the bytes one Follow holds and has not
	// copied: 32 MiB.
	DefaultFollowAhead = 32 << 20

	maxWindow = 4096
	maxParts  = 64
)

// Option configures a Store. Options validate their argument and return an
// error wrapping ErrInvalidOption.
type Option func(*options) error

type options struct {
	chunkSize     int
	window        int
	parts         int
	partThreshold int64
	retries       int
	readAhead     int
	followAhead   int
	timeout       time.Duration
}

func defaultOptions() options {
	return options{
		chunkSize:     DefaultChunkSize,
		window:        DefaultWindow,
		parts:         1,
		partThreshold: DefaultPartThreshold,
		retries:       DefaultRetries,
		readAhead:     DefaultReadAhead,
		followAhead:   DefaultFollowAhead,
	}
}

// WithChunkSize sets the payload size of the chunks Put writes, 1 byte to
// the connection's max_payload (checked by New). Readers take each
// object's own chunk size from its meta.
func WithChunkSize(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("%w: chunk size %d, want > 0", ErrInvalidOption, n)
		}
		o.chunkSize = n
		return nil
	}
}

// WithWindow sets how many chunks a writer keeps published and not yet
// acknowledged, 1 to 4096. Window times chunk size must stay well under
// the broker's per-stream ingest buffer (jetstream max_buffered_size,
// 128 MiB by default), or the broker answers 429 and the writer backs off.
func WithWindow(n int) Option {
	return func(o *options) error {
		if n < 1 || n > maxWindow {
			return fmt.Errorf("%w: window %d, want 1 to %d", ErrInvalidOption, n, maxWindow)
		}
		o.window = n
		return nil
	}
}

// WithParts splits objects larger than the part threshold (see
// WithPartThreshold) into n parts that move in parallel, 1 to 64; 1, the
// default, never splits. See the package documentation for the format.
func WithParts(n int) Option {
	return func(o *options) error {
		if n < 1 || n > maxParts {
			return fmt.Errorf("%w: parts %d, want 1 to %d", ErrInvalidOption, n, maxParts)
		}
		o.parts = n
		return nil
	}
}

// WithPartThreshold sets the object size above which WithParts splits,
// in bytes, at least one chunk.
func WithPartThreshold(n int64) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("%w: part threshold %d, want > 0", ErrInvalidOption, n)
		}
		o.partThreshold = n
		return nil
	}
}

// WithRetries sets how many times one Put or Get starts over from its last
// good chunk, 0 to 1000.
func WithRetries(n int) Option {
	return func(o *options) error {
		if n < 0 || n > 1000 {
			return fmt.Errorf("%w: retries %d, want 0 to 1000", ErrInvalidOption, n)
		}
		o.retries = n
		return nil
	}
}

// WithReadAhead sets how many bytes one Get keeps requested and not yet
// received, 64 KiB to 48 MiB. It bounds what the broker queues for the
// connection, which it closes past max_pending (64 MiB by default).
func WithReadAhead(n int) Option {
	return func(o *options) error {
		if n < 64<<10 || n > 48<<20 {
			return fmt.Errorf("%w: read-ahead %d, want 64 KiB to 48 MiB", ErrInvalidOption, n)
		}
		o.readAhead = n
		return nil
	}
}

// WithFollowAhead bounds what one Follow holds and has not copied, 64 KiB
// to 48 MiB: its queue of live chunks holds up to twice that (a reader
// that falls further behind drops chunks and reads the rest from the
// stream), and the consumer it then reads through asks for that much at a
// time. Like WithReadAhead it bounds what the broker queues for the
// connection.
func WithFollowAhead(n int) Option {
	return func(o *options) error {
		if n < 64<<10 || n > 48<<20 {
			return fmt.Errorf("%w: follow-ahead %d, want 64 KiB to 48 MiB", ErrInvalidOption, n)
		}
		o.followAhead = n
		return nil
	}
}

// WithTimeout sets how long a writer waits for one chunk's acknowledgement
// and a reader for the next chunk, and bounds calls made with a context
// that has no deadline. The default is the JetStream context's
// DefaultTimeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: timeout %v, want > 0", ErrInvalidOption, d)
		}
		o.timeout = d
		return nil
	}
}
