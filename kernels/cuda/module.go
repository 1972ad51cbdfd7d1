//go:build cgo && linux

package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// Compiled images, shared by every Backend of the process and keyed by
// the SHA-256 of NVRTC's version, the options and the source.
// compilations counts NVRTC runs, for tests.
var compilations atomic.Int64

var images = struct {
	sync.Mutex
	m map[string][]byte
}{m: make(map[string][]byte)}

func (b *Backend) compileOptions() []string {
	return []string{
		fmt.Sprintf("--gpu-architecture=sm_%d%d", b.major, b.minor),
		// No contraction into fused multiply-adds: a fused chain then
		// rounds exactly as its ops run one by one, and the random ops
		// exactly as Go computes them.
		"--fmad=false",
	}
}

// function returns kernel key of this backend, generating and compiling
// it on first use on the caller's goroutine, then loading it on the
// device thread. The caller holds mu.
func (b *Backend) function(key string, gen func() (string, error)) (cuFunction, error) {
	if f, ok := b.fns[key]; ok {
		return f, nil
	}
	src, err := gen()
	if err != nil {
		return nil, err
	}
	img, err := image(src, b.compileOptions(), b.opts.cacheDir)
	if err != nil {
		return nil, err
	}
	var f cuFunction
	err = b.call(func() error {
		m, err := moduleLoad(img)
		if err != nil {
			return err
		}
		b.mods = append(b.mods, m)
		f, err = moduleFunction(m, kernelName)
		return err
	})
	if err != nil {
		return nil, err
	}
	b.fns[key] = f
	return f, nil
}

// image returns the cubin of src, from memory, from dir, or from NVRTC.
// Disk errors only cost a compilation.
func image(src string, opts []string, dir string) ([]byte, error) {
	h := sha256.New()
	fmt.Fprintf(h, "nvrtc %d.%d\x00", nvrtcMajor, nvrtcMinor)
	for _, o := range opts {
		fmt.Fprintf(h, "%s\x00", o)
	}
	h.Write([]byte(src))
	key := hex.EncodeToString(h.Sum(nil))

	images.Lock()
	img, ok := images.m[key]
	images.Unlock()
	if ok {
		return img, nil
	}
	path := ""
	if dir != "" {
		path = filepath.Join(dir, key+".cubin")
		if img, err := os.ReadFile(path); err == nil && len(img) > 0 {
			images.Lock()
			images.m[key] = img
			images.Unlock()
			return img, nil
		}
	}
	compilations.Add(1)
	img, err := compileCUBIN(src, opts)
	if err != nil {
		return nil, err
	}
	images.Lock()
	images.m[key] = img
	images.Unlock()
	if path != "" {
		writeCache(path, img)
	}
	return img, nil
}

// writeCache stores an image atomically: a temporary file renamed.
func writeCache(path string, img []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".cubin-*")
	if err != nil {
		return
	}
	_, werr := f.Write(img)
	cerr := f.Close()
	if werr != nil || cerr != nil || os.Rename(f.Name(), path) != nil {
		_ = os.Remove(f.Name())
	}
}
