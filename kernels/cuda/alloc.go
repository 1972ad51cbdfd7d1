//go:build cgo && linux

package cuda

import (
	"errors"
	"fmt"
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

// allocator keeps freed blocks in per-class free lists; cuMemAlloc runs
// only when a list is empty, and on failure the lists are released and
// the allocation tried once more. Every use of a block is ordered on the
// one stream, so a block freed while kernels that read it are queued can
// be handed out again at once.
type allocator struct {
	free   map[int][]uint64
	cached int // bytes in the free lists
	live   int // bytes handed out
}

func (a *allocator) init() { a.free = make(map[int][]uint64) }

func (a *allocator) get(b *Backend, n int) (uint64, int, error) {
	c := sizeClass(n)
	if l := a.free[c]; len(l) > 0 {
		p := l[len(l)-1]
		a.free[c] = l[:len(l)-1]
		a.cached -= c
		a.live += c
		return p, c, nil
	}
	p, err := memAlloc(c)
	if err != nil && errors.Is(err, kernels.ErrOutOfMemory) && a.cached > 0 {
		_ = streamSync(b.stream)
		a.trim()
		p, err = memAlloc(c)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %d bytes: %w", kernels.ErrOutOfMemory, n, err)
	}
	a.live += c
	return p, c, nil
}

func (a *allocator) put(p uint64, c int) {
	a.free[c] = append(a.free[c], p)
	a.cached += c
	a.live -= c
}

// trim returns every cached block to the driver.
func (a *allocator) trim() {
	for c, l := range a.free {
		for _, p := range l {
			_ = memFree(p)
		}
		delete(a.free, c)
	}
	a.cached = 0
}

// Alloc returns a buffer of n bytes. Errors wrap kernels.ErrOutOfMemory.
func (b *Backend) Alloc(n int) (kernels.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: allocation of %d bytes", kernels.ErrAttr, n)
	}
	var buf *buffer
	err := b.do(func() error {
		var err error
		buf, err = b.alloc(n)
		return err
	})
	if err != nil {
		return nil, err
	}
	return buf, nil
}

func (b *Backend) alloc(n int) (*buffer, error) {
	p, c, err := b.mem.get(b, n)
	if err != nil {
		return nil, err
	}
	return &buffer{ptr: p, n: n, class: c, owner: b}, nil
}

// Free returns buf to the cache. Freeing nil, a foreign buffer or a freed
// one does nothing.
func (b *Backend) Free(buf kernels.Buffer) {
	d, ok := buf.(*buffer)
	if !ok || d == nil || d.owner != b {
		return
	}
	_ = b.do(func() error {
		b.free(d)
		return nil
	})
}

func (b *Backend) free(d *buffer) {
	if d.freed {
		return
	}
	d.freed = true
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
		d, err := b.own(dst, len(src))
		if err != nil {
			return err
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
// work queued before it.
func (b *Backend) Download(dst []byte, src kernels.Buffer) error {
	return b.do(func() error {
		d, err := b.own(src, len(dst))
		if err != nil {
			return err
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
