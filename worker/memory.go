package worker

import (
	"bufio"
	"bytes"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// memory is a device's account of tensor memory: what its sessions hold,
// the budget they share, and the buffers a checkpoint in flight still
// reads (pinned), whose frees wait until the checkpoint is done with them.
//
// held and the per-session byte counts are written by the device loop and
// read by the heartbeat and the metrics endpoint. pins and deferred are
// shared with the checkpoint writer, under mu.
type memory struct {
	budget int64 // 0: none
	// held is every byte of tensor buffers the device allocated for its
	// sessions and has not yet given back to the backend, frees deferred
	// by a checkpoint included.
	held atomic.Int64
	// freed counts bytes given back since the last reclaim (see reclaim).
	freed atomic.Int64

	mu       sync.Mutex
	pins     map[kernels.Buffer]int // buffer -> checkpoints reading it
	deferred map[kernels.Buffer]bool
	ready    []kernels.Buffer // unpinned deferred frees, for the loop
}

// pin marks buf as read by a checkpoint in flight.
func (m *memory) pin(buf kernels.Buffer) {
	m.mu.Lock()
	if m.pins == nil {
		m.pins = map[kernels.Buffer]int{}
	}
	m.pins[buf]++
	m.mu.Unlock()
}

// unpin ends a checkpoint's read of buf. A free that waited for it is
// handed to the device loop (see drain).
func (m *memory) unpin(buf kernels.Buffer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pins[buf]--; m.pins[buf] > 0 {
		return
	}
	delete(m.pins, buf)
	if m.deferred[buf] {
		delete(m.deferred, buf)
		m.ready = append(m.ready, buf)
	}
}

// pinned reports whether a checkpoint in flight reads buf.
func (m *memory) pinned(buf kernels.Buffer) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pins[buf] > 0
}

// deferFree reports whether buf is pinned, and if so records that it is
// to be freed once it is not.
func (m *memory) deferFree(buf kernels.Buffer) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pins[buf] == 0 {
		return false
	}
	if m.deferred == nil {
		m.deferred = map[kernels.Buffer]bool{}
	}
	m.deferred[buf] = true
	return true
}

// takeReady returns the deferred frees whose checkpoint is done.
func (m *memory) takeReady() []kernels.Buffer {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.ready
	m.ready = nil
	return r
}

// freeBuf gives a session tensor's buffer back to the backend, or, while a
// checkpoint reads it, once the checkpoint is done. Device loop only.
func (d *device) freeBuf(buf kernels.Buffer) {
	if buf == nil || d.mem.deferFree(buf) {
		return
	}
	d.backendFree(buf)
}

func (d *device) backendFree(buf kernels.Buffer) {
	n := int64(buf.Bytes())
	d.cfg.Backend.Free(buf)
	d.mem.held.Add(-n)
	d.mem.freed.Add(n)
}

// drainFrees frees the buffers whose free waited for a checkpoint. Device
// loop only.
func (d *device) drainFrees() {
	for _, buf := range d.mem.takeReady() {
		d.backendFree(buf)
	}
}

// reclaimBytes is how much memory freed since the last reclaim makes the
// next housekeeping return it to the system.
const reclaimBytes = 64 << 20

// reclaimLoop returns freed memory to the operating system: Go's collector
// runs only as the heap grows, so memory that a freed session held stays
// resident while the worker is idle. Every Config.Reclaim, if the devices
// freed reclaimBytes or more since the last time, it collects and releases
// the free pages (debug.FreeOSMemory), off the device loops. Until Stop.
func (w *Worker) reclaimLoop() {
	t := time.NewTicker(w.cfg.Reclaim)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		var freed int64
		for _, d := range w.allDevices() {
			freed += d.mem.freed.Load()
		}
		if freed < reclaimBytes {
			continue
		}
		for _, d := range w.allDevices() {
			d.mem.freed.Store(0)
		}
		debug.FreeOSMemory()
	}
}

// defaultBudget is the budget of a device whose Device.Budget is 0: the
// fraction of its memory, and for the host's devices (CPU), of the host's
// memory shared among them. 0 when the memory is unknown.
func defaultBudget(dev Device, fraction float64, hostDevices int) int64 {
	if fraction <= 0 {
		return 0
	}
	if dev.Kind == "gpu" {
		return int64(float64(dev.Memory) * fraction)
	}
	total := hostRAM()
	if total <= 0 {
		return 0
	}
	return int64(float64(total) * fraction / float64(max(hostDevices, 1)))
}

// hostRAM is the memory this process may use: the host's, or its
// cgroup's limit if lower (Linux; 0 elsewhere or when unknown).
func hostRAM() int64 {
	var total int64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err == nil {
					total = kb << 10
				}
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if lim, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil && lim > 0 && (total == 0 || lim < total) {
			total = lim
		}
	}
	return total
}

// charge reserves n bytes of the device's budget for a new tensor, or
// fails with resource_exhausted. Device loop only.
func (d *device) charge(n int) error {
	held := d.mem.held.Add(int64(n))
	if b := d.mem.budget; b > 0 && held > b {
		d.mem.held.Add(-int64(n))
		return failf(codec.CodeResourceExhausted, "device %s memory budget: %d bytes held, %d more asked, budget %d", d.cfg.Name, held-int64(n), n, b)
	}
	return nil
}

// sessionBytes is one session's tensor memory, for the metrics.
type sessionBytes struct {
	id    string
	bytes int64
}

// noteSessions publishes each session's bytes for the metrics endpoint.
// Device loop only (housekeeping, once a second).
func (d *device) noteSessions() {
	l := make([]sessionBytes, 0, len(d.sessions))
	for id, s := range d.sessions {
		l = append(l, sessionBytes{id, s.bytes})
	}
	slices.SortFunc(l, func(a, b sessionBytes) int { return strings.Compare(a.id, b.id) })
	d.sessBytes.Store(&l)
}

// trimmer is a backend that keeps freed buffers for reuse and can give
// them back (the CPU and CUDA backends).
type trimmer interface{ Trim() int64 }

// trimIdle empties the backend's buffer cache once the device has run no
// frame for three Config.Reclaim, so that an idle worker goes back to its
// baseline. Device loop only.
func (d *device) trimIdle(now time.Time) {
	t, ok := d.cfg.Backend.(trimmer)
	if !ok || d.trimmed || now.Sub(d.lastFrame) < 3*d.w.cfg.Reclaim {
		return
	}
	d.trimmed = true
	d.mem.freed.Add(t.Trim())
}
