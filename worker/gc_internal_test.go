package worker

import "testing"

// TestHeapTensorBytes: only devices whose tensors are Go heap set the
// collector's pace; a GPU's tensors do not, the host copies a standby of a
// GPU read ahead do.
func TestHeapTensorBytes(t *testing.T) {
	cpu, gpu := &device{cfg: Device{Name: "cpu-0", Kind: "cpu"}}, &device{cfg: Device{Name: "gpu-0", Kind: "gpu"}}
	cpu.mem.held.Store(3 << 30)
	gpu.mem.held.Store(40 << 30)
	if n := heapTensorBytes([]*device{cpu, gpu}); n != 3<<30 {
		t.Errorf("heap tensor bytes %d, want %d (the CPU device's only)", n, 3<<30)
	}
	if n := heapTensorBytes([]*device{gpu}); n != 0 {
		t.Errorf("a GPU alone counts %d bytes, want 0", n)
	}
	// With only the GPU's tensors, GOGC stays the process's own.
	if p := gcPercent(heapTensorBytes([]*device{gpu}), 100); p != 100 {
		t.Errorf("GOGC %d with GPU tensors only, want 100", p)
	}
	if p := gcPercent(heapTensorBytes([]*device{cpu, gpu}), 100); p != 12 {
		t.Errorf("GOGC %d with 3 GiB on the CPU, want 12", p)
	}
	cpu.m.warmBytes.Store(1 << 30)
	gpu.m.warmBytes.Store(2 << 30)
	if n := heapTensorBytes([]*device{cpu, gpu}); n != 6<<30 {
		t.Errorf("heap tensor bytes %d with 3 GiB read ahead, want %d", n, 6<<30)
	}
}
