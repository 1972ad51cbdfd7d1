package kernels

// Buffer is memory owned by a backend. Only the backend that allocated a
// buffer may use it.
type Buffer interface {
	// Bytes is the buffer's size in bytes.
	Bytes() int
}

// Meta is a tensor's dtype and shape.
type Meta struct {
	DType DType
	Shape []int
}

// Numel is the number of elements (1 for a scalar, 0 if any dim is 0).
func (m Meta) Numel() int { return Numel(m.Shape) }

// Bytes is the contiguous size in bytes.
func (m Meta) Bytes() int { return m.Numel() * m.DType.Size() }

// Tensor is a contiguous row-major tensor in a backend buffer.
type Tensor struct {
	Meta
	Buf Buffer
}

// Backend is one device's compute. A backend is used by one goroutine at a
// time (the worker's device loop); it may parallelise inside a call.
//
// Exec runs op on inputs whose metas passed Infer and writes outputs that
// the caller allocated with the metas Infer returned. Exec must not retain
// the slices it is given.
type Backend interface {
	// Name says what the backend runs on, e.g. "cpu" or "NVIDIA H100 80GB HBM3".
	Name() string
	// Alloc returns a buffer of at least n bytes; contents are undefined.
	Alloc(n int) (Buffer, error)
	// Free releases a buffer. Freeing nil is a no-op.
	Free(Buffer)
	// Upload copies len(src) bytes from host memory into dst.
	Upload(dst Buffer, src []byte) error
	// Download copies len(dst) bytes from src into host memory.
	Download(dst []byte, src Buffer) error
	// Exec runs one op. op is the caller's only for the call: the caller
	// reuses it once Exec returns, so a backend that needs any of it
	// later (queued work) copies it.
	Exec(op *Op, in, out []*Tensor) error
	// Sync waits until all work issued so far is complete.
	Sync() error
}

// Program is device work recorded once, as a run of ops ran, and run
// again on other inputs without the ops being checked, planned or
// allocated one by one: a backend's optional capability (the CUDA
// backend's, for a worker's replays of a captured graph).
type Program interface {
	// Run queues the program: in bound to its inputs, its work, its
	// outputs put into out. Buffers have the sizes of the recording's. An
	// input may be read in place, never written; an output's buffer may
	// come back holding other memory of its size, the caller's given to
	// the program for its next run.
	Run(in, out []Buffer) error
	// CopyOutputs queues copies of the outputs of the last run, or of the
	// recording, into out.
	CopyOutputs(out []Buffer) error
	// Bytes is the device memory the program holds.
	Bytes() int64
	// Release gives the program's memory back; it is idempotent.
	Release()
}
