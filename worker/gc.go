package worker

import (
	"os"
	"runtime/debug"
	"sync"
	"time"
)

// The Go collector starts a cycle once the heap has grown by GOGC percent
// (100 by default) of what the last cycle found live. Tensor memory on a
// CPU device is Go heap, so with the default a worker holding 8 GiB of
// tensors may reach 16 GiB before it collects the tensors its sessions
// freed, and the garbage of an object store read (the chunk messages of a
// restore, as large as the tensors) doubles the heap the same way. The
// collector's cost, on the other hand, does not grow with tensor bytes:
// tensor buffers hold no pointers and are not scanned.
//
// So while the workers of this process hold tensors in the Go heap (CPU
// devices), the collector's headroom is kept at an eighth of those bytes
// (at least gcFloor):
// GOGC = 100 x headroom / held, never above the process's own setting.
// An explicit GOGC in the environment turns this off.

// gcFloor is the least headroom: the default GOGC's over a 64 MiB heap.
const gcFloor = 64 << 20

// gcTick is how often the tensor bytes are looked at.
const gcTick = 50 * time.Millisecond

// gcTuner is the process's one tuner, shared by its workers.
var gcTuner struct {
	mu      sync.Mutex
	workers map[*Worker]bool
	stop    chan struct{}
	done    chan struct{}
	base    int // GOGC when the tuner started
	pct     int // GOGC set last
}

// gcPercent is the GOGC for held tensor bytes, at most base.
func gcPercent(held int64, base int) int {
	if held <= 0 || base < 0 {
		return base
	}
	p := int(100 * max(held/8, gcFloor) / held)
	return max(min(p, base), 10)
}

// tuneGC adds w to the workers whose tensor bytes set GOGC; untune takes
// it out again.
func tuneGC(w *Worker) {
	if os.Getenv("GOGC") != "" {
		return
	}
	g := &gcTuner
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.workers == nil {
		g.workers = map[*Worker]bool{}
	}
	g.workers[w] = true
	if g.stop != nil {
		return
	}
	g.base = debug.SetGCPercent(100)
	debug.SetGCPercent(g.base)
	g.pct = g.base
	g.stop, g.done = make(chan struct{}), make(chan struct{})
	go gcLoop(g.stop, g.done)
}

func untuneGC(w *Worker) {
	g := &gcTuner
	g.mu.Lock()
	if !g.workers[w] {
		g.mu.Unlock()
		return
	}
	delete(g.workers, w)
	if len(g.workers) > 0 {
		g.mu.Unlock()
		return
	}
	stop, done := g.stop, g.done
	g.stop, g.done = nil, nil
	g.mu.Unlock()
	close(stop)
	<-done
	g.mu.Lock()
	if g.pct != g.base {
		debug.SetGCPercent(g.base)
		g.pct = g.base
	}
	g.mu.Unlock()
}

// gcLoop sets GOGC from the tensor bytes of the process's workers until
// stop. It is the tuner's goroutine (owned by tuneGC and untuneGC).
func gcLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(gcTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		g := &gcTuner
		g.mu.Lock()
		var held int64
		for w := range g.workers {
			held += w.heldBytes()
		}
		if p := gcPercent(held, g.base); p != g.pct {
			debug.SetGCPercent(p)
			g.pct = p
		}
		g.mu.Unlock()
	}
}

// heldBytes is the tensor memory of w's devices that keep their tensors
// in the Go heap.
func (w *Worker) heldBytes() int64 {
	return heapTensorBytes(w.allDevices())
}

// heapTensorBytes is the tensor memory of the devices among devs whose
// tensors are Go heap: not a GPU's, whose tensors live in its own memory
// and cost the collector nothing. Counting them would run the collector
// many times as often while a GPU holds gigabytes, for no heap. The
// tensors a standby read ahead are Go heap on every device (warm.go).
func heapTensorBytes(devs []*device) int64 {
	var n int64
	for _, d := range devs {
		if d.cfg.Kind != "gpu" {
			n += d.mem.held.Load()
		}
		n += d.m.warmBytes.Load()
	}
	return n
}
