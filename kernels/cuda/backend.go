//go:build cgo && linux

package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/jetfabric/jetfabric/kernels"
)

var _ kernels.Backend = (*Backend)(nil)

// Device attributes (CUdevice_attribute).
const (
	attrMultiprocessors = 16
	attrCCMajor         = 75
	attrCCMinor         = 76
)

// Backend is one GPU. See the package documentation for its threading.
type Backend struct {
	opts    options
	ordinal int
	name    string
	major   int
	minor   int
	sms     int

	mu     sync.Mutex // serialises calls; guards closed
	closed bool
	calls  chan func() error
	res    chan error
	wg     sync.WaitGroup

	// Owned by the device thread.
	dev    cuDevice
	ctx    cuContext
	stream cuStream
	syncEv cuEvent
	mem    allocator
	stage  stager
	mods   []cuModule
	fns    map[string]cuFunction
	blas   blasState
}

// DeviceCount is the number of CUDA devices, or an error wrapping ErrNoGPU.
func DeviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	n, err := deviceCount()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNoGPU, err)
	}
	return n, nil
}

// New opens device ordinal: it loads the driver and NVRTC, retains the
// device's primary context on a thread of its own and creates a stream.
// Errors wrap ErrNoGPU (no driver, no such device), ErrNoCompiler (no
// NVRTC) or ErrInvalidOption.
func New(ordinal int, opts ...Option) (*Backend, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: device %d of %d", ErrNoGPU, ordinal, n)
	}
	if err := loadNVRTC(); err != nil {
		return nil, err
	}
	b := &Backend{
		opts:    o,
		ordinal: ordinal,
		calls:   make(chan func() error, 1),
		res:     make(chan error, 1),
		fns:     make(map[string]cuFunction),
	}
	ready := make(chan error, 1)
	b.wg.Go(func() { b.loop(ready) })
	if err := <-ready; err != nil {
		b.wg.Wait()
		return nil, err
	}
	return b, nil
}

// loop is the device thread: it owns the context and runs every call.
func (b *Backend) loop(ready chan<- error) {
	// The thread stays locked: when the goroutine ends, the runtime ends
	// the thread and the context binding with it.
	runtime.LockOSThread()
	if err := b.open(); err != nil {
		b.release()
		ready <- err
		return
	}
	ready <- nil
	for {
		f, ok := b.next()
		if !ok {
			break
		}
		b.res <- b.run(f)
	}
	b.release()
}

// spin is how long each side of a call polls before it blocks. Waking a
// parked thread costs 85 to 300 us on some machines (an H200 host, 2026),
// far more than a kernel launch, so a worker's calls, and its frames a
// round trip apart, pass without any: with 50 us, an alloc, an add, a
// 4-byte download and a free after 200 us idle took 540 us; with 1 ms,
// 107 us. An idle device thread stops polling 1 ms after its last call.
const spin = time.Millisecond

// next waits for the next call; ok is false once the backend is closed.
func (b *Backend) next() (f func() error, ok bool) {
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case f, ok = <-b.calls:
			return f, ok
		default:
		}
		if i&63 == 63 && time.Since(start) > spin {
			f, ok = <-b.calls
			return f, ok
		}
	}
}

func (b *Backend) run(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cuda: internal error: %v", p)
		}
	}()
	return f()
}

func (b *Backend) open() error {
	var err error
	if b.dev, err = deviceGet(b.ordinal); err != nil {
		return err
	}
	if b.name, err = deviceName(b.dev); err != nil {
		return err
	}
	for _, a := range []struct {
		attr int
		dst  *int
	}{{attrCCMajor, &b.major}, {attrCCMinor, &b.minor}, {attrMultiprocessors, &b.sms}} {
		if *a.dst, err = deviceAttr(b.dev, a.attr); err != nil {
			return err
		}
	}
	if b.ctx, err = primaryCtxRetain(b.dev); err != nil {
		return err
	}
	if err = ctxSetCurrent(b.ctx); err != nil {
		return err
	}
	if b.stream, err = streamCreate(); err != nil {
		return err
	}
	if b.syncEv, err = eventCreate(false); err != nil {
		return err
	}
	b.mem.init()
	return nil
}

// release frees everything the thread holds; errors are ignored, as the
// context may already be broken.
func (b *Backend) release() {
	if b.ctx == nil {
		return
	}
	if b.stream != nil {
		_ = streamSync(b.stream)
	}
	b.blas.close(b)
	b.stage.close()
	b.mem.trim()
	for _, m := range b.mods {
		_ = moduleUnload(m)
	}
	b.mods = nil
	if b.syncEv != nil {
		_ = eventDestroy(b.syncEv)
	}
	if b.stream != nil {
		_ = streamDestroy(b.stream)
	}
	_ = primaryCtxRelease(b.dev)
	b.ctx = nil
}

// do runs f on the device thread and returns its error.
func (b *Backend) do(f func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.calls <- f
	start := time.Now()
	for i := 0; ; i++ {
		select {
		case err := <-b.res:
			return err
		default:
		}
		if i&63 == 63 && time.Since(start) > spin {
			return <-b.res
		}
	}
}

// Close waits for queued work, releases the device and stops the thread.
// It returns the first error of work still in flight, if any. It is
// idempotent; after it every method returns ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.calls <- b.sync
	err := <-b.res
	b.closed = true
	close(b.calls)
	b.mu.Unlock()
	b.wg.Wait()
	return err
}

// Name is the device's name, e.g. "NVIDIA H100 80GB HBM3".
func (b *Backend) Name() string { return b.name }

// ComputeCapability is the device's major and minor version.
func (b *Backend) ComputeCapability() (major, minor int) { return b.major, b.minor }

// Sync waits until all work queued so far is done. Errors from earlier
// asynchronous work surface here.
func (b *Backend) Sync() error { return b.do(b.sync) }

func (b *Backend) sync() error {
	if err := eventRecord(b.syncEv, b.stream); err != nil {
		return err
	}
	return eventSync(b.syncEv)
}
