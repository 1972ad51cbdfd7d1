package cpu

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/jetfabric/jetfabric/kernels"
)

// maxAlloc bounds one allocation, so that an absurd request is an error
// rather than a fatal out-of-memory in the runtime.
const maxAlloc = 1 << 40

// Backend is the CPU backend. The zero value is not usable; call New.
type Backend struct {
	cache *cache
	// rec is the recording in progress, if any (see program.go).
	rec atomic.Pointer[recording]
}

var _ kernels.Backend = (*Backend)(nil)

// Option configures a Backend.
type Option func(*Backend)

// WithCache bounds the bytes of freed buffers kept for reuse (see Free);
// 0 keeps none.
func WithCache(bytes int64) Option {
	return func(b *Backend) { b.cache = newCache(max(bytes, 0)) }
}

// DefaultCache is how many bytes of freed large buffers a Backend keeps
// for reuse unless told otherwise.
const DefaultCache = 1 << 30

// New returns a CPU backend.
func New(opts ...Option) *Backend {
	b := &Backend{cache: newCache(DefaultCache)}
	for _, o := range opts {
		if o != nil {
			o(b)
		}
	}
	return b
}

// Trim drops the freed buffers kept for reuse, so that the garbage
// collector can return their memory to the system, and returns their size
// in bytes. Safe to call from any goroutine.
func (b *Backend) Trim() int64 { return b.cache.drop() }

// Name returns "cpu".
func (b *Backend) Name() string { return "cpu" }

// Buffer is host memory owned by the CPU backend, 8-byte aligned.
type Buffer struct {
	data  []byte
	words []uint64 // the allocation data lives in
}

// Bytes is the buffer's size in bytes.
func (buf *Buffer) Bytes() int { return len(buf.data) }

// Host returns the buffer's memory. The CPU backend's buffers are host
// memory, so a caller may read or write them directly between calls to
// Exec, without Upload and Download. It is nil once the buffer is freed,
// and a slice of it must not be used after Free: the memory may be
// reused.
func (buf *Buffer) Host() []byte { return buf.data }

// Alloc returns a buffer of n bytes, zeroed. It fails with
// kernels.ErrOutOfMemory if n is negative or absurdly large.
func (b *Backend) Alloc(n int) (kernels.Buffer, error) {
	buf, reused, err := b.alloc(n)
	if err != nil {
		return nil, err
	}
	if reused {
		clear(buf.data)
	}
	return buf, nil
}

// Wrap returns a buffer over data, which the caller filled and gives up:
// the backend owns it from then on. data must be 8-byte aligned (as a
// []uint64 viewed as bytes is). Freed, it is left to the garbage
// collector, not kept for reuse.
func (b *Backend) Wrap(data []byte) (kernels.Buffer, error) {
	if len(data) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(data)))%8 != 0 {
		return nil, fmt.Errorf("%w: cpu: wrap: memory not 8-byte aligned", kernels.ErrShape)
	}
	return &Buffer{data: data}, nil
}

// AllocUninit is Alloc for a caller that writes every byte before reading
// any (an upload, a transfer): a buffer reused from the cache keeps its
// old contents.
func (b *Backend) AllocUninit(n int) (kernels.Buffer, error) {
	buf, _, err := b.alloc(n)
	if err != nil {
		return nil, err
	}
	return buf, nil
}

func (b *Backend) alloc(n int) (_ *Buffer, reused bool, err error) {
	r := b.rec.Load()
	if r == nil {
		return b.allocFree(n)
	}
	if buf := r.take(n); buf != nil {
		return buf, true, nil
	}
	buf, reused, err := b.allocFree(n)
	if err == nil {
		r.add(buf)
	}
	return buf, reused, err
}

// allocFree allocates from the cache of freed buffers or the heap.
func (b *Backend) allocFree(n int) (_ *Buffer, reused bool, err error) {
	if n < 0 || n > maxAlloc {
		return nil, false, fmt.Errorf("%w: cpu: cannot allocate %d bytes", kernels.ErrOutOfMemory, n)
	}
	if n == 0 {
		return &Buffer{data: []byte{}}, false, nil
	}
	nw := (n + 7) / 8 // 8-byte alignment for every dtype
	if w := b.cache.take(nw); w != nil {
		return &Buffer{data: unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n), words: w}, true, nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: cpu: allocating %d bytes: %v", kernels.ErrOutOfMemory, n, r)
		}
	}()
	words := make([]uint64, nw)
	return &Buffer{data: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n), words: words}, false, nil
}

// Free releases a buffer: later uses of it fail. A large buffer's memory
// is kept for a later Alloc of the same size, up to the cache's bound, so
// that tensors allocated and freed in a loop reuse warm memory instead of
// faulting in fresh pages. Freeing nil or a buffer of another backend is
// a no-op.
func (b *Backend) Free(buf kernels.Buffer) {
	if c, ok := buf.(*Buffer); ok && c != nil {
		if r := b.rec.Load(); r != nil && r.keep(c) {
			return // the recording's, reused only within it
		}
		if c.words != nil {
			b.cache.put(c.words)
		}
		c.data, c.words = nil, nil
	}
}

// Upload copies src into the start of dst. It fails with kernels.ErrShape
// if dst is too small, and with ErrForeignBuffer if dst is not a live
// buffer of this backend.
func (b *Backend) Upload(dst kernels.Buffer, src []byte) error {
	d, err := host(dst)
	if err != nil {
		return fmt.Errorf("cpu: upload: %w", err)
	}
	if len(src) > len(d) {
		return fmt.Errorf("%w: cpu: upload of %d bytes into a buffer of %d", kernels.ErrShape, len(src), len(d))
	}
	if r := b.rec.Load(); r != nil && r.owns(dst.(*Buffer)) {
		r.notRecordable("an upload")
	}
	copy(d, src)
	return nil
}

// Download copies the start of src into dst. It fails with kernels.ErrShape
// if src is smaller than dst, and with ErrForeignBuffer if src is not a live
// buffer of this backend.
func (b *Backend) Download(dst []byte, src kernels.Buffer) error {
	s, err := host(src)
	if err != nil {
		return fmt.Errorf("cpu: download: %w", err)
	}
	if len(dst) > len(s) {
		return fmt.Errorf("%w: cpu: download of %d bytes from a buffer of %d", kernels.ErrShape, len(dst), len(s))
	}
	copy(dst, s)
	return nil
}

// Sync returns nil: Exec is synchronous.
func (b *Backend) Sync() error { return nil }

// ErrForeignBuffer is returned for a buffer that this backend did not
// allocate, or that was freed.
var ErrForeignBuffer = errors.New("cpu: not a live buffer of the cpu backend")

func host(buf kernels.Buffer) ([]byte, error) {
	c, ok := buf.(*Buffer)
	if !ok || c == nil || c.data == nil {
		return nil, fmt.Errorf("%w (%T)", ErrForeignBuffer, buf)
	}
	return c.data, nil
}

// execFn runs one op whose arity has been checked.
type execFn func(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error

type entry struct {
	nin, nout int // -1: any number, checked by the op against kernels.Infer
	fn        execFn
}

// table maps every op this backend runs to its implementation.
var table = map[string]entry{}

func def(fn execFn, nin int, names ...string) {
	for _, n := range names {
		table[n] = entry{nin, 1, fn}
	}
}

// defVar registers ops whose input or output counts vary (-1); their
// functions check every count and meta against kernels.Infer.
func defVar(fn execFn, nin, nout int, names ...string) {
	for _, n := range names {
		table[n] = entry{nin, nout, fn}
	}
}

// Exec runs op. Inputs and outputs must be contiguous tensors in buffers of
// this backend, with the metas kernels.Infer gives; Exec checks that they fit
// (arity, dtypes, shapes, buffer sizes) and returns an error wrapping
// kernels.ErrArity, ErrShape, ErrDType, ErrAttr or ErrForeignBuffer if not,
// kernels.ErrIndex for an index input out of range, and
// kernels.ErrUnknownOp for an op outside the set. An output may share its
// buffer with an input.
func (b *Backend) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	err := b.exec(op, in, out)
	if r := b.rec.Load(); r != nil && op != nil {
		c, ci, co := op.Clone(), cloneTensors(in), cloneTensors(out)
		r.note(err, op.Name, co, func() error { return b.exec(&c, ci, co) })
	}
	return err
}

func (b *Backend) exec(op *kernels.Op, in, out []*kernels.Tensor) (err error) {
	if op == nil {
		return fmt.Errorf("%w: cpu: nil op", kernels.ErrUnknownOp)
	}
	e, ok := table[op.Name]
	if !ok {
		if kernels.Known(op.Name) {
			return fmt.Errorf("%w: cpu: %s", kernels.ErrNotImplemented, op.Name)
		}
		return fmt.Errorf("%w %q", kernels.ErrUnknownOp, op.Name)
	}
	if (e.nin >= 0 && len(in) != e.nin) || (e.nout >= 0 && len(out) != e.nout) {
		return fmt.Errorf("%w: cpu: %s takes %d inputs and %d outputs, got %d and %d",
			kernels.ErrArity, op.Name, e.nin, e.nout, len(in), len(out))
	}
	for i, t := range in {
		if err := checkTensor(op, "input", i, t); err != nil {
			return err
		}
	}
	for i, t := range out {
		if err := checkTensor(op, "output", i, t); err != nil {
			return err
		}
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cpu: %s: internal error: %v", op.Name, r)
		}
	}()
	if aliased(in, out) && !inPlaceSafe(op, in, out) {
		return b.execCopyOut(e, op, in, out)
	}
	return e.fn(b, op, in, out)
}

// checkTensor checks that t is a well-formed tensor in a live buffer large
// enough for its meta.
func checkTensor(op *kernels.Op, role string, i int, t *kernels.Tensor) error {
	if t == nil {
		return fmt.Errorf("%w: cpu: %s %s %d is nil", kernels.ErrArity, op.Name, role, i)
	}
	if !t.DType.Valid() {
		return fmt.Errorf("%w: cpu: %s %s %d has dtype %v", kernels.ErrDType, op.Name, role, i, t.DType)
	}
	if len(t.Shape) > maxRank {
		return fmt.Errorf("%w: cpu: %s %s %d has rank %d, over %d", kernels.ErrTooLarge, op.Name, role, i, len(t.Shape), maxRank)
	}
	n := 1
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("%w: cpu: %s %s %d has shape %v", kernels.ErrShape, op.Name, role, i, t.Shape)
		}
		if d != 0 && n > maxAlloc/d {
			return fmt.Errorf("%w: cpu: %s %s %d has shape %v", kernels.ErrTooLarge, op.Name, role, i, t.Shape)
		}
		n *= d
	}
	c, ok := t.Buf.(*Buffer)
	if !ok || c == nil || c.data == nil {
		return fmt.Errorf("cpu: %s %s %d: %w (%T)", op.Name, role, i, ErrForeignBuffer, t.Buf)
	}
	if need := n * t.DType.Size(); len(c.data) < need {
		return fmt.Errorf("%w: cpu: %s %s %d: %v %v needs %d bytes, the buffer holds %d",
			kernels.ErrShape, op.Name, role, i, t.DType, t.Shape, need, len(c.data))
	}
	return nil
}

// data returns the bytes of t's elements; t passed checkTensor.
func data(t *kernels.Tensor) []byte {
	return t.Buf.(*Buffer).data[:t.Numel()*t.DType.Size()]
}

func overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}

func aliased(in, out []*kernels.Tensor) bool {
	for _, o := range out {
		od := data(o)
		for _, i := range in {
			if overlap(od, data(i)) {
				return true
			}
		}
	}
	return false
}

// inPlaceSafe reports whether op may write out while reading in although
// they overlap: elementwise ops whose aliased inputs start where the output
// starts and have its size and element size.
func inPlaceSafe(op *kernels.Op, in, out []*kernels.Tensor) bool {
	if !elementwise[op.Name] {
		return false
	}
	for _, o := range out {
		od := data(o)
		for _, i := range in {
			id := data(i)
			if !overlap(od, id) {
				continue
			}
			if &od[0] != &id[0] || len(od) != len(id) || o.DType.Size() != i.DType.Size() {
				return false
			}
		}
	}
	return true
}

// InPlace reports whether op may write an output over an input of the same
// dtype and shape without a copy: the elementwise ops and the optimizer
// steps, whose element i of every output reads only element i of the
// inputs, all of them before it is written.
func (b *Backend) InPlace(op string) bool { return elementwise[op] }

// execCopyOut runs op into fresh outputs and copies them over the real ones.
func (b *Backend) execCopyOut(e entry, op *kernels.Op, in, out []*kernels.Tensor) error {
	tmp := make([]*kernels.Tensor, len(out))
	for i, o := range out {
		tmp[i] = &kernels.Tensor{Meta: o.Meta, Buf: &Buffer{data: make([]byte, len(data(o)))}}
	}
	if err := e.fn(b, op, in, tmp); err != nil {
		return err
	}
	for i, o := range out {
		copy(data(o), data(tmp[i]))
	}
	return nil
}

// elementwise names the ops whose output element i depends only on input
// elements i when no input is broadcast.
var elementwise = map[string]bool{}

func dtypeErr(op *kernels.Op, role string, i int, dt kernels.DType) error {
	return fmt.Errorf("%w: cpu: %s %s %d is %v", kernels.ErrDType, op.Name, role, i, dt)
}

func shapeErr(op *kernels.Op, format string, args ...any) error {
	return fmt.Errorf("%w: cpu: %s: %s", kernels.ErrShape, op.Name, fmt.Sprintf(format, args...))
}
