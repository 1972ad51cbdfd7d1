//go:build cgo && linux

package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels"
)

// buffer is device memory from the caching allocator.
type buffer struct {
	ptr   uint64
	n     int // bytes asked for
	class int // bytes allocated
	owner *Backend
	freed bool
}

// Bytes is the size asked for.
func (b *buffer) Bytes() int { return b.n }

// Small size classes are carved from slabs of slabBytes, so that a run of
// small allocations with no frees between them (a chain of ops on scalars)
// asks the driver once a slab, not once a block.
const (
	slabBytes = 2 << 20
	slabMax   = 64 << 10 // the largest class carved from slabs
)

// slab is one driver allocation carved into blocks of one class.
type slab struct {
	base  uint64
	class int
}

// allocator keeps freed blocks in per-class free lists. It runs on the
// caller's goroutine under Backend.mu; only when a list is empty does it
// ask the device thread for memory (grow), which allocates a slab for a
// small class and a block of its own for a large one; on failure the
// cached memory is released and the allocation tried once more. Every
// use of a block is ordered on the one stream, and every device call goes
// through the device thread's queue in the order it was made, so a block
// freed while kernels that read it are queued, or not yet issued, can be
// handed out again at once.
type allocator struct {
	free   map[int][]uint64
	slabs  []slab // sorted by base
	cached int    // bytes in the free lists
	live   int    // bytes handed out

	// The driver's allocation and release, replaced in tests.
	memAlloc func(n int) (uint64, error)
	memFree  func(p uint64) error
}

func (a *allocator) init() {
	a.free = make(map[int][]uint64)
	if a.memAlloc == nil {
		a.memAlloc, a.memFree = memAlloc, memFree
	}
}

// take returns a cached block of class c, if there is one.
func (a *allocator) take(c int) (uint64, bool) {
	l := a.free[c]
	if len(l) == 0 {
		return 0, false
	}
	p := l[len(l)-1]
	a.free[c] = l[:len(l)-1]
	a.cached -= c
	a.live += c
	return p, true
}

// grow allocates memory from the driver for a block of class c and
// returns the block; for a small class it carves a slab, caching the
// rest. sync waits for the device's work before cached memory is
// released. Device thread only.
func (a *allocator) grow(c int, sync func() error) (uint64, error) {
	n := c
	if c <= slabMax {
		n = slabBytes
	}
	p, err := a.memAlloc(n)
	if err != nil && errors.Is(err, kernels.ErrOutOfMemory) && a.cached > 0 {
		_ = sync()
		a.trim()
		p, err = a.memAlloc(n)
	}
	if err != nil {
		return 0, err
	}
	if c <= slabMax {
		i, _ := slices.BinarySearchFunc(a.slabs, p, func(s slab, p uint64) int { return cmp.Compare(s.base, p) })
		a.slabs = slices.Insert(a.slabs, i, slab{base: p, class: c})
		// Blocks are handed out from the end of the list: in address
		// order, the first one now.
		k := slabBytes / c
		for j := k - 1; j >= 1; j-- {
			a.free[c] = append(a.free[c], p+uint64(j*c))
		}
		a.cached += (k - 1) * c
	}
	a.live += c
	return p, nil
}

func (a *allocator) put(p uint64, c int) {
	a.free[c] = append(a.free[c], p)
	a.cached += c
	a.live -= c
}

// slabOf returns the index of the slab holding p.
func (a *allocator) slabOf(p uint64) int {
	i, found := slices.BinarySearchFunc(a.slabs, p, func(s slab, p uint64) int { return cmp.Compare(s.base, p) })
	if !found {
		i--
	}
	return i
}

// trim returns cached memory to the driver: every cached large block, and
// every slab all of whose blocks are cached; it returns the bytes given
// back.
func (a *allocator) trim() int64 {
	var released int64
	cachedOf := make([]int, len(a.slabs))
	for c, l := range a.free {
		if c <= slabMax {
			for _, p := range l {
				cachedOf[a.slabOf(p)]++
			}
			continue
		}
		for _, p := range l {
			_ = a.memFree(p)
		}
		released += int64(c * len(l))
		a.cached -= c * len(l)
		delete(a.free, c)
	}
	drop := make([]bool, len(a.slabs))
	kept := a.slabs[:0]
	for i, s := range a.slabs {
		if drop[i] = cachedOf[i] == slabBytes/s.class; drop[i] {
			_ = a.memFree(s.base)
			released += slabBytes
		}
	}
	for c, l := range a.free {
		keep := l[:0]
		for _, p := range l {
			if !drop[a.slabOf(p)] {
				keep = append(keep, p)
			} else {
				a.cached -= c
			}
		}
		if len(keep) == 0 {
			delete(a.free, c)
		} else {
			a.free[c] = keep
		}
	}
	for i, s := range a.slabs {
		if !drop[i] {
			kept = append(kept, s)
		}
	}
	clear(a.slabs[len(kept):])
	a.slabs = kept
	return released
}

// close returns the cached blocks and every slab to the driver, small
// blocks in use too; large blocks in use go with the context.
func (a *allocator) close() {
	for c, l := range a.free {
		if c > slabMax {
			for _, p := range l {
				_ = a.memFree(p)
			}
		}
	}
	for _, s := range a.slabs {
		_ = a.memFree(s.base)
	}
	a.free, a.slabs, a.cached = map[int][]uint64{}, nil, 0
}

// Alloc returns a buffer of n bytes. Errors wrap kernels.ErrOutOfMemory.
// It runs on the caller's goroutine, from the cache, and waits for the
// device thread only when the cache has no block of n's class.
func (b *Backend) Alloc(n int) (kernels.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: allocation of %d bytes", kernels.ErrAttr, n)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	buf, err := b.alloc(n)
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// alloc is Alloc with mu held.
func (b *Backend) alloc(n int) (*buffer, error) {
	c := sizeClass(n)
	r := b.recording
	if r != nil {
		if l := r.pool[c]; len(l) > 0 {
			p := l[len(l)-1]
			r.pool[c] = l[:len(l)-1]
			return &buffer{ptr: p, n: n, class: c, owner: b}, nil
		}
	}
	p, ok := b.mem.take(c)
	if !ok {
		err := b.call(func() error {
			var err error
			p, err = b.mem.grow(c, func() error { return streamSync(b.stream) })
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %d bytes: %w", kernels.ErrOutOfMemory, n, err)
		}
	}
	if r != nil {
		r.blocks[p] = c
	}
	return &buffer{ptr: p, n: n, class: c, owner: b}, nil
}

// Free returns buf to the cache, at once: work queued that still uses it
// runs before any work queued later (see allocator). Freeing nil, a
// foreign buffer or a freed one does nothing.
func (b *Backend) Free(buf kernels.Buffer) {
	d, ok := buf.(*buffer)
	if !ok || d == nil || d.owner != b {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.free(d)
	}
}

// free is Free with mu held.
func (b *Backend) free(d *buffer) {
	if d.freed {
		return
	}
	d.freed = true
	if r := b.recording; r != nil {
		if c, ok := r.blocks[d.ptr]; ok { // the recording's: reused only within it
			r.pool[c] = append(r.pool[c], d.ptr)
			return
		}
	}
	b.mem.put(d.ptr, d.class)
}

// own checks that buf is a live buffer of b holding at least n bytes.
func (b *Backend) own(buf kernels.Buffer, n int) (*buffer, error) {
	d, ok := buf.(*buffer)
	if !ok || d == nil || d.owner != b || d.freed {
		return nil, ErrBuffer
	}
	if n > d.n {
		return nil, fmt.Errorf("%w: %d bytes into a buffer of %d", kernels.ErrShape, n, d.n)
	}
	return d, nil
}

// Staging: pinned host buffers through which Upload and Download copy,
// used round-robin; each records an event when its copy is queued, and is
// reused only once that event has completed.

const (
	stageBytes = 8 << 20
	stageCount = 4
)

type stage struct {
	host unsafe.Pointer
	ev   cuEvent
	busy bool
}

type stager struct {
	st   []stage
	next int
}

func (s *stager) take() (*stage, error) {
	if s.st == nil {
		s.st = make([]stage, stageCount)
		for i := range s.st {
			var err error
			if s.st[i].host, err = hostAlloc(stageBytes); err != nil {
				s.close()
				return nil, err
			}
			if s.st[i].ev, err = eventCreate(false); err != nil {
				s.close()
				return nil, err
			}
		}
	}
	st := &s.st[s.next]
	s.next = (s.next + 1) % len(s.st)
	if st.busy {
		if err := eventSync(st.ev); err != nil {
			return nil, err
		}
		st.busy = false
	}
	return st, nil
}

func (s *stager) close() {
	for _, st := range s.st {
		if st.host != nil {
			_ = hostFree(st.host)
		}
		if st.ev != nil {
			_ = eventDestroy(st.ev)
		}
	}
	s.st, s.next = nil, 0
}

func (st *stage) bytes(n int) []byte { return unsafe.Slice((*byte)(st.host), n) }

// Upload copies src into dst. It returns once the copy is queued: src may
// be reused at once, later work on the stream sees the data.
func (b *Backend) Upload(dst kernels.Buffer, src []byte) error {
	return b.do(func() error {
		b.notRecordable("an upload")
		d, err := b.own(dst, len(src))
		if err != nil {
			return err
		}
		if hb := b.hosts.find(src); hb != nil {
			// Pinned already: one copy from it, which the buffer's
			// reuse waits for.
			if err := memcpyHtoD(d.ptr, unsafe.Pointer(unsafe.SliceData(src)), len(src), b.stream); err != nil {
				return err
			}
			if err := eventRecord(hb.ev, b.stream); err != nil {
				return err
			}
			hb.busy = true
			return nil
		}
		for off := 0; off < len(src); off += stageBytes {
			n := min(stageBytes, len(src)-off)
			st, err := b.stage.take()
			if err != nil {
				return err
			}
			copy(st.bytes(n), src[off:off+n])
			if err := memcpyHtoD(d.ptr+uint64(off), st.host, n, b.stream); err != nil {
				return err
			}
			if err := eventRecord(st.ev, b.stream); err != nil {
				return err
			}
			st.busy = true
		}
		return nil
	})
}

// Download copies the first len(dst) bytes of src into dst, after all
// work queued before it. A queued op that failed to launch, and was not
// reported yet, fails it with an *AsyncError naming that op.
func (b *Backend) Download(dst []byte, src kernels.Buffer) error {
	return b.do(func() error {
		b.notRecordable("a download")
		if err := b.takeAsync(); err != nil {
			return err
		}
		d, err := b.own(src, len(dst))
		if err != nil {
			return err
		}
		if hb := b.hosts.find(dst); hb != nil {
			if err := memcpyDtoH(unsafe.Pointer(unsafe.SliceData(dst)), d.ptr, len(dst), b.stream); err != nil {
				return err
			}
			if err := eventRecord(hb.ev, b.stream); err != nil {
				return err
			}
			return eventSync(hb.ev)
		}
		type piece struct {
			st     *stage
			off, n int
		}
		var q []piece
		off := 0
		issue := func() error {
			n := min(stageBytes, len(dst)-off)
			st, err := b.stage.take()
			if err != nil {
				return err
			}
			if err := memcpyDtoH(st.host, d.ptr+uint64(off), n, b.stream); err != nil {
				return err
			}
			if err := eventRecord(st.ev, b.stream); err != nil {
				return err
			}
			st.busy = true
			q = append(q, piece{st, off, n})
			off += n
			return nil
		}
		for off < len(dst) && len(q) < stageCount {
			if err := issue(); err != nil {
				return err
			}
		}
		for len(q) > 0 {
			p := q[0]
			q = q[1:]
			if err := eventSync(p.st.ev); err != nil {
				return err
			}
			p.st.busy = false
			copy(dst[p.off:p.off+p.n], p.st.bytes(p.n))
			if off < len(dst) {
				if err := issue(); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// DownloadMany copies the first len(dsts[i]) bytes of srcs[i] into dsts[i]
// for every i, after all work queued before it, as Download does for one;
// copies of up to stageBytes are packed together into the staging buffers
// and waited for once a buffer is full, not once each, so that many small
// tensors come back in a few syncs. A dst over stageBytes is refused with
// an error wrapping kernels.ErrShape, before anything is copied.
func (b *Backend) DownloadMany(dsts [][]byte, srcs []kernels.Buffer) error {
	if len(dsts) != len(srcs) {
		return fmt.Errorf("cuda: download many: %d destinations for %d buffers: %w", len(dsts), len(srcs), kernels.ErrShape)
	}
	for i, dst := range dsts {
		if len(dst) > stageBytes {
			return fmt.Errorf("cuda: download many: destination %d is %d bytes, over %d: %w", i, len(dst), stageBytes, kernels.ErrShape)
		}
	}
	return b.do(func() error {
		b.notRecordable("a download")
		if err := b.takeAsync(); err != nil {
			return err
		}
		type packed struct{ i, off int }
		var (
			st   *stage
			pend []packed
			used int
		)
		flush := func() error {
			if st == nil || len(pend) == 0 {
				return nil
			}
			if err := eventRecord(st.ev, b.stream); err != nil {
				return err
			}
			if err := eventSync(st.ev); err != nil {
				return err
			}
			for _, p := range pend {
				copy(dsts[p.i], st.bytes(p.off + len(dsts[p.i]))[p.off:])
			}
			pend, used = pend[:0], 0
			return nil
		}
		// On a failure, copies already queued into the stage must land
		// before another transfer takes it.
		fail := func(err error) error {
			if st != nil && len(pend) > 0 && eventRecord(st.ev, b.stream) == nil {
				_ = eventSync(st.ev)
			}
			return err
		}
		for i, dst := range dsts {
			if len(dst) == 0 {
				continue
			}
			d, err := b.own(srcs[i], len(dst))
			if err != nil {
				return fail(err)
			}
			if st == nil || used+len(dst) > stageBytes {
				if err := flush(); err != nil {
					return fail(err)
				}
				if st, err = b.stage.take(); err != nil {
					return err
				}
			}
			if err := memcpyDtoH(unsafe.Add(st.host, used), d.ptr, len(dst), b.stream); err != nil {
				return fail(err)
			}
			pend = append(pend, packed{i, used})
			used += (len(dst) + 255) &^ 255
		}
		return flush()
	})
}

// Trim gives the driver back the device memory cached for reuse (every
// cached large block, and every slab none of whose blocks is in use) and
// returns how many bytes that was; it also frees the pinned host buffers
// kept for reuse (see HostBuffer), which it does not count. It waits for
// the work queued before it, which may still read blocks freed into the
// cache.
func (b *Backend) Trim() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0
	}
	var n int64
	_ = b.call(func() error {
		if err := streamSync(b.stream); err != nil {
			return err
		}
		n = b.mem.trim()
		b.hosts.trim()
		return nil
	})
	return n
}
