//go:build cgo && linux

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels"
)

// Host buffers: page-locked host memory lent to the caller, who fills it
// (then uploads it) or downloads into it (then reads it) in place. Upload
// from one and Download into one copy by DMA straight from and to it, with
// no pass through the staging buffers, so a large transfer costs no host
// copy and the device's copy runs at the bus's speed.
//
// Pinning memory is slow (the driver locks every page), so buffers given
// back are kept for reuse, up to hostCacheBytes in all, until Trim; a
// buffer an upload still reads is handed out again only once that copy is
// done.

// hostCacheBytes bounds the pinned bytes kept for reuse once given back.
const hostCacheBytes = 512 << 20

// hostMinBytes is the smallest buffer HostBuffer pins: below it the
// staging buffers cost about one copy of the size of one of them.
const hostMinBytes = stageBytes

// hostBuf is one pinned buffer. Device thread only, but for the slice the
// caller holds while it is lent.
type hostBuf struct {
	host unsafe.Pointer
	n    int
	ev   cuEvent
	busy bool // an upload from it is queued: ev completes when it is done
	lent bool
}

// hostBufs are a backend's pinned buffers, lent and kept. Device thread
// only.
type hostBufs struct {
	all  []*hostBuf
	kept int // bytes of the buffers not lent
}

// HostBuffer lends n bytes of page-locked host memory and the function
// that gives it back, which the caller calls once, when it no longer
// touches the bytes (an Upload from them may still be in flight: the
// buffer is reused only after it). Upload from the buffer (or a part of
// it) and Download into it copy with no staging. Sizes under 8 MiB, where
// staging costs as much, are refused with an error wrapping
// kernels.ErrShape; memory the driver cannot pin fails with its error.
func (b *Backend) HostBuffer(n int) ([]byte, func(), error) {
	if n < hostMinBytes {
		return nil, nil, fmt.Errorf("%w: a host buffer of %d bytes (at least %d)", kernels.ErrShape, n, hostMinBytes)
	}
	var hb *hostBuf
	err := b.do(func() error {
		var err error
		hb, err = b.hosts.lend(n)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	returned := false
	give := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if returned {
			return
		}
		returned = true
		if b.closed {
			return // freed with the context
		}
		_ = b.call(func() error { b.hosts.giveBack(hb); return nil })
	}
	return unsafe.Slice((*byte)(hb.host), n), give, nil
}

// lend returns a kept buffer of n to 2n bytes, its last upload done, or
// pins a new one.
func (h *hostBufs) lend(n int) (*hostBuf, error) {
	var best *hostBuf
	for _, hb := range h.all {
		if !hb.lent && hb.n >= n && hb.n <= 2*n && (best == nil || hb.n < best.n) {
			best = hb
		}
	}
	if best != nil {
		if best.busy {
			if err := eventSync(best.ev); err != nil {
				return nil, err
			}
			best.busy = false
		}
		best.lent = true
		h.kept -= best.n
		return best, nil
	}
	p, err := hostAlloc(n)
	if err != nil {
		return nil, err
	}
	ev, err := eventCreate(false)
	if err != nil {
		_ = hostFree(p)
		return nil, err
	}
	hb := &hostBuf{host: p, n: n, ev: ev, lent: true}
	h.all = append(h.all, hb)
	return hb, nil
}

// giveBack keeps hb for reuse, then frees the oldest kept buffers while
// more than hostCacheBytes are kept.
func (h *hostBufs) giveBack(hb *hostBuf) {
	hb.lent = false
	h.kept += hb.n
	for i := 0; h.kept > hostCacheBytes && i < len(h.all); {
		old := h.all[i]
		if old.lent {
			i++
			continue
		}
		h.free(old)
		h.kept -= old.n
		h.all = append(h.all[:i], h.all[i+1:]...)
	}
}

// free releases hb, after the upload from it, if any.
func (h *hostBufs) free(hb *hostBuf) {
	if hb.busy {
		_ = eventSync(hb.ev)
	}
	_ = eventDestroy(hb.ev)
	_ = hostFree(hb.host)
}

// trim frees every kept buffer.
func (h *hostBufs) trim() {
	lent := h.all[:0]
	for _, hb := range h.all {
		if hb.lent {
			lent = append(lent, hb)
			continue
		}
		h.free(hb)
	}
	clear(h.all[len(lent):])
	h.all, h.kept = lent, 0
}

// close frees every buffer, lent or kept.
func (h *hostBufs) close() {
	for _, hb := range h.all {
		h.free(hb)
	}
	h.all, h.kept = nil, 0
}

// find returns the lent buffer that holds all of p, or nil.
func (h *hostBufs) find(p []byte) *hostBuf {
	if len(p) == 0 {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	for _, hb := range h.all {
		base := uintptr(hb.host)
		if hb.lent && start >= base && start+uintptr(len(p)) <= base+uintptr(hb.n) {
			return hb
		}
	}
	return nil
}
