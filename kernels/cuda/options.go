package cuda

import (
	"fmt"
	"os"
	"path/filepath"
)

// Option configures New.
type Option func(*options) error

type options struct {
	tf32     bool
	cacheDir string
	noDisk   bool
	chains   bool
}

func defaultOptions() options {
	return options{cacheDir: defaultCacheDir(), chains: true}
}

// WithChains sets whether consecutive elementwise ops of one shape are
// launched as one fused kernel that writes every op's output, once that
// kernel has been compiled in the background (see the package
// documentation). On by default; the bits are the same either way.
func WithChains(on bool) Option {
	return func(o *options) error { o.chains = on; return nil }
}

// WithTF32 lets float32 matrix products run on the tensor cores with TF32
// inputs (10-bit mantissas) and float32 accumulation: several times faster,
// with relative errors near 1e-3 instead of 1e-6. Off by default.
func WithTF32(on bool) Option {
	return func(o *options) error { o.tf32 = on; return nil }
}

// WithCacheDir sets the directory where compiled kernels are kept between
// runs. The default is $JETFABRIC_CACHE, else jetfabric/cuda under
// os.UserCacheDir. The empty string keeps compiled kernels in memory only.
func WithCacheDir(dir string) Option {
	return func(o *options) error {
		if dir != "" && !filepath.IsAbs(dir) {
			return fmt.Errorf("%w: cache directory %q is not absolute", ErrInvalidOption, dir)
		}
		o.cacheDir = dir
		o.noDisk = dir == ""
		return nil
	}
}

func defaultCacheDir() string {
	if d := os.Getenv("JETFABRIC_CACHE"); d != "" {
		return d
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "jetfabric", "cuda")
}
