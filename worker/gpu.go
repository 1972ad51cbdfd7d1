package worker

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// ErrNoGPU: NVML is not available (no NVIDIA driver, or a build without cgo).
var ErrNoGPU = errors.New("worker: no NVIDIA driver")

// GPU is one NVIDIA GPU as NVML describes it.
type GPU struct {
	// Index is NVML's index, which orders GPUs by PCI bus id; CUDA uses the
	// same order when CUDA_DEVICE_ORDER=PCI_BUS_ID.
	Index  int
	Name   string
	UUID   string
	Memory int64 // bytes
	// Major and Minor are the compute capability.
	Major, Minor int
}

// NVML is an open NVML session: the GPUs it found and their telemetry. It
// is safe for concurrent use. Open it with OpenNVML; Close it after the
// worker that uses its telemetry has stopped.
type NVML struct {
	gpus     []GPU
	sample   func(i int) (codec.Telemetry, error)
	shutdown func() error
}

// GPUs lists the GPUs found when the session opened.
func (n *NVML) GPUs() []GPU { return n.gpus }

// Telemetry samples GPU i (an index into GPUs): utilisation, memory in
// use, temperature and power.
func (n *NVML) Telemetry(i int) (codec.Telemetry, error) {
	if i < 0 || i >= len(n.gpus) {
		return codec.Telemetry{}, fmt.Errorf("worker: no GPU %d of %d", i, len(n.gpus))
	}
	return n.sample(i)
}

// Device is the worker device for GPU i computed on b: gpu-<index>, kind
// gpu, its name, UUID, memory and compute capability in the registry, and
// NVML telemetry.
func (n *NVML) Device(i int, b kernels.Backend) Device {
	g := n.gpus[i]
	return Device{
		Name:    "gpu-" + strconv.Itoa(g.Index),
		Kind:    "gpu",
		Backend: b,
		Memory:  g.Memory,
		Props: map[string]string{
			"name":               g.Name,
			"uuid":               g.UUID,
			"compute_capability": fmt.Sprintf("%d.%d", g.Major, g.Minor),
			"memory":             strconv.FormatInt(g.Memory, 10),
		},
		Telemetry: func() (codec.Telemetry, error) { return n.Telemetry(i) },
	}
}

// Close shuts NVML down. Safe on a nil session.
func (n *NVML) Close() error {
	if n == nil || n.shutdown == nil {
		return nil
	}
	f := n.shutdown
	n.shutdown = nil
	return f()
}
