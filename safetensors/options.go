package safetensors

import "fmt"

// DefaultMaxHeaderSize is the header cap of the reference implementation.
const DefaultMaxHeaderSize = 100_000_000

type options struct {
	maxHeader int
	maxData   int64
}

func defaultOptions() options {
	return options{maxHeader: DefaultMaxHeaderSize, maxData: int64(maxBytes)}
}

// Option adjusts the limits of [Decode] and [Read].
type Option func(*options) error

// WithMaxHeaderSize caps the JSON header at n bytes (n >= 2); a file whose
// header length is larger fails with ErrHeaderTooLarge before anything else
// is read.
func WithMaxHeaderSize(n int) Option {
	return func(o *options) error {
		if n < 2 {
			return fmt.Errorf("%w: max header size %d, want >= 2", ErrInvalidOption, n)
		}
		o.maxHeader = n
		return nil
	}
}

// WithMaxDataSize caps the data buffer at n bytes (n >= 0): a header that
// describes more fails with ErrSize before any data is read.
func WithMaxDataSize(n int64) Option {
	return func(o *options) error {
		if n < 0 {
			return fmt.Errorf("%w: max data size %d, want >= 0", ErrInvalidOption, n)
		}
		o.maxData = n
		return nil
	}
}

func buildOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}
