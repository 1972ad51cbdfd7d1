//go:build cgo && linux

package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
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

	// mu serialises the callers. It guards closed, rec, the allocator,
	// fns, plans, keyBuf and the chain's fields: the caller holding it
	// uses them, and the device thread touches them only inside a call
	// (see call), while that caller waits. Lock order: mu, then qmu or
	// bgMu; the device thread and the background compilers take only
	// qmu and bgMu, never two at once.
	mu     sync.Mutex
	closed bool
	// rec holds the device calls of the Exec in progress, queued as one
	// item when it returns (see record).
	rec    []func() error
	mem    allocator
	fns    map[string]cuFunction
	plans  map[string]*planned
	keyBuf []byte
	chain  chain
	spare  chain // an empty chain with room
	chains map[string]*chainPlan
	// fusedChains counts the chains launched as one kernel, chainForms
	// the chain forms planned; for tests.
	fusedChains, chainForms int
	// recording is the program being recorded, if any (see program.go).
	recording *recording
	// graphs counts the programs captured as CUDA graphs (device thread;
	// for tests).
	graphs int

	// Kernels compiled in the background (see compileAsync): bgDone holds
	// those loaded, under bgMu; bg waits for the compilers.
	bgMu   sync.Mutex
	bgDone map[string]loadedFn
	bg     sync.WaitGroup

	// The queue to the device thread: items in order, counted by qn so
	// that the polling thread reads an atomic, not the lock. parked says
	// the thread waits on wake.
	qmu    sync.Mutex
	q      []item
	qn     atomic.Int64
	parked atomic.Bool
	wake   chan struct{}
	res    chan error
	wg     sync.WaitGroup

	// Owned by the device thread.
	dev      cuDevice
	ctx      cuContext
	stream   cuStream
	syncEv   cuEvent
	stage    stager
	hosts    hostBufs
	mods     []cuModule
	blas     blasState
	asyncErr *AsyncError // the first failure of queued work, not yet reported
}

// item is one entry of the device thread's queue: the device calls of
// one op (run, named by op), queued without waiting; or a call whose
// caller waits for its error on res; or work of the backend's own (bg),
// which reports nothing; or the end.
type item struct {
	run  []func() error
	op   string
	call func() error
	bg   func()
	stop bool
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
		wake:    make(chan struct{}, 1),
		res:     make(chan error, 1),
		fns:     make(map[string]cuFunction),
		plans:   make(map[string]*planned),
		chains:  make(map[string]*chainPlan),
		bgDone:  make(map[string]loadedFn),
	}
	ready := make(chan error, 1)
	b.wg.Go(func() { b.loop(ready) })
	if err := <-ready; err != nil {
		b.wg.Wait()
		return nil, err
	}
	return b, nil
}

// loop is the device thread: it owns the context and runs every item of
// the queue, in order.
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
	var batch []item
	for {
		batch = b.next(batch)
		for i := range batch {
			it := batch[i]
			batch[i] = item{}
			switch {
			case it.stop:
				b.release()
				return
			case it.call != nil:
				b.res <- b.run(it.call)
			case it.bg != nil:
				_ = b.run(func() error { it.bg(); return nil })
			default:
				b.runQueued(it.run, it.op)
			}
		}
	}
}

// spin is how long each side of a call polls before it blocks. Waking a
// parked thread costs 85 to 300 us on some machines (an H200 host, 2026),
// far more than a kernel launch, so a worker's calls, and its frames a
// round trip apart, pass without any: with 50 us, an alloc, an add, a
// 4-byte download and a free after 200 us idle took 540 us; with 1 ms,
// 107 us. An idle device thread stops polling 1 ms after its last item.
const spin = time.Millisecond

// next waits for queued items and returns them in order, in a slice
// that takes the place of batch (whose items were all run).
func (b *Backend) next(batch []item) []item {
	start := time.Now()
	for i := 0; ; i++ {
		if b.qn.Load() > 0 {
			b.qmu.Lock()
			batch, b.q = b.q, batch[:0]
			b.qn.Store(0)
			b.qmu.Unlock()
			return batch
		}
		if i&63 == 63 && time.Since(start) > spin {
			// Parked is set before the queue is looked at again, and push
			// counts an item before it looks at parked: one of the two sees
			// the other.
			b.parked.Store(true)
			if b.qn.Load() == 0 {
				<-b.wake
			}
			b.parked.Store(false)
			start, i = time.Now(), 0
		}
	}
}

// push queues it for the device thread.
func (b *Backend) push(it item) {
	b.qmu.Lock()
	b.q = append(b.q, it)
	b.qn.Add(1)
	b.qmu.Unlock()
	if b.parked.Load() {
		select {
		case b.wake <- struct{}{}:
		default:
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

// runQueued issues the device calls of op that Exec queued. The first
// failure of queued work is kept for the next call that waits for the
// stream (see takeAsync); the rest of that op's calls are skipped.
func (b *Backend) runQueued(calls []func() error, op string) {
	for _, f := range calls {
		if err := b.run(f); err != nil {
			if b.asyncErr == nil {
				b.asyncErr = &AsyncError{Op: op, Err: err}
			}
			return
		}
	}
}

// takeAsync returns and clears the failure of queued work not yet
// reported, if any. Device thread only.
func (b *Backend) takeAsync() error {
	if e := b.asyncErr; e != nil {
		b.asyncErr = nil
		return e
	}
	return nil
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
	b.hosts.close()
	b.mem.close()
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

// call runs f on the device thread, after every item queued before it
// and the pending chain, and returns its error. The caller holds mu.
func (b *Backend) call(f func() error) error {
	b.flushChain()
	b.push(item{call: f})
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

// do runs f on the device thread and returns its error, or ErrClosed.
func (b *Backend) do(f func() error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	return b.call(f)
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
	err := b.call(b.sync)
	b.closed = true
	b.mu.Unlock()
	b.bg.Wait() // their loads are queued before the end
	b.push(item{stop: true})
	b.wg.Wait()
	return err
}

// Name is the device's name, e.g. "NVIDIA H100 80GB HBM3".
func (b *Backend) Name() string { return b.name }

// ComputeCapability is the device's major and minor version.
func (b *Backend) ComputeCapability() (major, minor int) { return b.major, b.minor }

// Sync waits until all work queued so far is done. Errors from earlier
// asynchronous work surface here: a queued op that failed to launch as an
// *AsyncError naming it.
func (b *Backend) Sync() error { return b.do(b.sync) }

func (b *Backend) sync() error {
	if err := eventRecord(b.syncEv, b.stream); err != nil {
		return err
	}
	err := eventSync(b.syncEv)
	if aerr := b.takeAsync(); aerr != nil {
		return aerr
	}
	return err
}
