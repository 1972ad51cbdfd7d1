package cpu

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jetfabric/jetfabric/kernels"
)

// Programs (kernels.Program): the calls of a run of ops, recorded as they
// run and run again on other inputs, with nothing checked or allocated op
// by op in the caller (a worker's replay of a captured graph).
//
// Record starts a recording. Every buffer allocated from then on belongs
// to it; one of them freed goes to the recording's own free list, handed
// out again only within it, so the calls recorded name buffers that
// nothing else gets while the program lives. Exec, ExecFused, ExecRelu and
// ExecMatmulT record each call that succeeds, with copies of its op and
// tensors. RecordInput copies an input into a slot of the recording;
// EndRecord makes the calls a program whose inputs are the slots. Run
// binds its inputs, makes the calls and hands its outputs over; a call
// that fails on the data (an index out of range) fails Run, which has then
// written only the program's own buffers.
//
// Nothing is copied that need not be: a slot that no call writes and that
// is no output reads the caller's input in place during a run (its own
// memory is freed at EndRecord), and an output that is not an input slot
// is handed over by exchanging memory with the caller's buffer of the same
// size, which the next run writes.
//
// A call that failed (other than one the caller may fall back from,
// kernels.ErrNotImplemented) or an upload into a buffer of the recording
// makes EndRecord refuse the recording.

var _ kernels.Program = (*Program)(nil)

// recording is the program being recorded; its methods are safe for
// concurrent use (a collective beside the caller may allocate).
type recording struct {
	mu      sync.Mutex
	calls   []func() error
	written map[*Buffer]bool // the buffers the calls write
	blocks  map[*Buffer]bool
	pool    []*Buffer
	inputs  []*Buffer
	bad     string
}

// take returns a buffer of n bytes that the recording freed, if any.
func (r *recording) take(n int) *Buffer {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, buf := range r.pool {
		if len(buf.data) == n {
			r.pool = slices.Delete(r.pool, i, i+1)
			return buf
		}
	}
	return nil
}

func (r *recording) add(buf *Buffer) {
	r.mu.Lock()
	r.blocks[buf] = true
	r.mu.Unlock()
}

// keep takes buf into the recording's free list if it is the recording's.
func (r *recording) keep(buf *Buffer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.blocks[buf] {
		return false
	}
	r.pool = append(r.pool, buf)
	return true
}

// note records call, which ran with err and writes out, or why the
// recording cannot be a program.
func (r *recording) note(err error, name string, out []*kernels.Tensor, call func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.calls = append(r.calls, call)
		for _, t := range out {
			if buf, ok := t.Buf.(*Buffer); ok {
				r.written[buf] = true
			}
		}
	case !errors.Is(err, kernels.ErrNotImplemented) && r.bad == "":
		r.bad = name + " failed"
	}
}

func (r *recording) notRecordable(why string) {
	r.mu.Lock()
	if r.bad == "" {
		r.bad = why
	}
	r.mu.Unlock()
}

func (r *recording) owns(buf *Buffer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blocks[buf]
}

// cloneTensors copies ts, sharing no memory with them but the buffers.
func cloneTensors(ts []*kernels.Tensor) []*kernels.Tensor {
	c := make([]*kernels.Tensor, len(ts))
	for i, t := range ts {
		if t != nil {
			c[i] = &kernels.Tensor{Meta: kernels.Meta{DType: t.DType, Shape: slices.Clone(t.Shape)}, Buf: t.Buf}
		}
	}
	return c
}

// Program is recorded calls (see Record).
type Program struct {
	b       *Backend
	calls   []func() error
	inputs  []*Buffer
	outputs []*Buffer
	// inPlace marks the inputs read in place (their slots hold no memory
	// between runs); handOver the outputs exchanged with the caller's.
	inPlace  []bool
	handOver []bool
	inSize   []int
	arena    []*Buffer
	bytes    int64
	released bool
}

// Record starts recording the calls made from now on (see Program).
func (b *Backend) Record() error {
	r := &recording{blocks: map[*Buffer]bool{}, written: map[*Buffer]bool{}}
	if !b.rec.CompareAndSwap(nil, r) {
		return fmt.Errorf("%w: cpu: a recording is already in progress", kernels.ErrAttr)
	}
	return nil
}

// RecordInput makes slot, a buffer allocated since Record, the next input
// of the recording, and copies src into it.
func (b *Backend) RecordInput(slot, src kernels.Buffer) error {
	r := b.rec.Load()
	if r == nil {
		return fmt.Errorf("%w: cpu: no recording in progress", kernels.ErrAttr)
	}
	s, ok := slot.(*Buffer)
	d, err := host(src)
	switch {
	case err != nil:
		return fmt.Errorf("cpu: record input: %w", err)
	case !ok || s == nil || s.data == nil || !r.owns(s) || len(s.data) != len(d):
		return fmt.Errorf("%w: cpu: an input slot is a buffer of the input's size (%d bytes) allocated since Record", kernels.ErrAttr, len(d))
	}
	r.mu.Lock()
	twice := slices.Contains(r.inputs, s)
	r.mu.Unlock()
	if twice {
		return fmt.Errorf("%w: cpu: record input: the slot is an input already", kernels.ErrAttr)
	}
	copy(s.data, d)
	r.mu.Lock()
	r.inputs = append(r.inputs, s)
	r.mu.Unlock()
	return nil
}

// EndRecord ends the recording and returns its program, whose outputs are
// outs. held lists every other buffer allocated since Record that the
// caller still holds; with outs they become the program's, and the caller
// forgets them without freeing them. On an error the recording is
// dropped and the caller keeps what it holds.
func (b *Backend) EndRecord(outs, held []kernels.Buffer) (kernels.Program, error) {
	r := b.rec.Swap(nil)
	if r == nil {
		return nil, fmt.Errorf("%w: cpu: no recording in progress", kernels.ErrAttr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fail := func(err error) (kernels.Program, error) {
		for _, buf := range r.pool {
			b.Free(buf)
		}
		return nil, err
	}
	if r.bad != "" {
		return fail(fmt.Errorf("%w: cpu: %s", kernels.ErrNotRecordable, r.bad))
	}
	p := &Program{b: b, calls: r.calls, inputs: r.inputs}
	kept := map[*Buffer]bool{}
	for _, l := range [][]kernels.Buffer{outs, held} {
		for _, buf := range l {
			c, ok := buf.(*Buffer)
			if !ok || !r.blocks[c] || kept[c] || c.data == nil {
				return fail(fmt.Errorf("%w: cpu: end record: a buffer not allocated since Record, freed, or listed twice", kernels.ErrAttr))
			}
			kept[c] = true
			if len(p.outputs) < len(outs) {
				p.outputs = append(p.outputs, c)
			}
		}
	}
	if len(r.pool)+len(kept) != len(r.blocks) {
		return fail(fmt.Errorf("%w: cpu: end record: %d buffers allocated since Record, %d freed and %d listed", kernels.ErrAttr, len(r.blocks), len(r.pool), len(kept)))
	}
	slots := map[*Buffer]bool{}
	for _, in := range p.inputs {
		slots[in] = true
		p.inPlace = append(p.inPlace, !r.written[in] && !slices.Contains(p.outputs, in))
		p.inSize = append(p.inSize, len(in.data))
	}
	for _, out := range p.outputs {
		p.handOver = append(p.handOver, !slots[out])
	}
	for k, in := range p.inputs {
		if p.inPlace[k] {
			b.Free(in) // not the recording's any more: its memory goes back
		}
	}
	for buf := range r.blocks {
		p.arena = append(p.arena, buf)
		p.bytes += int64(len(buf.data))
	}
	return p, nil
}

// AbortRecord drops the recording in progress, if any; the caller keeps
// the buffers it holds.
func (b *Backend) AbortRecord() {
	if r := b.rec.Swap(nil); r != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, buf := range r.pool {
			b.Free(buf)
		}
	}
}

// Bytes is the memory the program holds.
func (p *Program) Bytes() int64 { return p.bytes }

// Run binds in to the program's inputs, makes its calls and puts its
// outputs into out: the buffers of out may come back holding other memory
// of the same size (see Program). A call that fails (on the data: an
// index out of range) fails Run, having written none of in and out.
func (p *Program) Run(in, out []kernels.Buffer) error {
	if p.released {
		return fmt.Errorf("%w: cpu: program released", kernels.ErrAttr)
	}
	if len(in) != len(p.inputs) || len(out) != len(p.outputs) {
		return fmt.Errorf("%w: cpu: program takes %d inputs and %d outputs, got %d and %d", kernels.ErrArity, len(p.inputs), len(p.outputs), len(in), len(out))
	}
	src := make([][]byte, len(in))
	for k, buf := range in {
		d, err := host(buf)
		if err != nil {
			return fmt.Errorf("cpu: program input %d: %w", k, err)
		}
		if len(d) != p.inSize[k] {
			return fmt.Errorf("%w: cpu: program input %d has %d bytes, the program's %d", kernels.ErrShape, k, len(d), p.inSize[k])
		}
		src[k] = d
	}
	if err := p.checkOut(out); err != nil {
		return err
	}
	for k, d := range src {
		if p.inPlace[k] {
			p.inputs[k].data = d
		} else {
			copy(p.inputs[k].data, d)
		}
	}
	defer func() {
		for k, in := range p.inputs {
			if p.inPlace[k] {
				in.data = nil
			}
		}
	}()
	for _, call := range p.calls {
		if err := call(); err != nil {
			return err
		}
	}
	for k, buf := range out {
		o, mine := buf.(*Buffer), p.outputs[k]
		if p.handOver[k] {
			o.data, o.words, mine.data, mine.words = mine.data, mine.words, o.data, o.words
		} else {
			copy(o.data, mine.data)
		}
	}
	return nil
}

func (p *Program) checkOut(out []kernels.Buffer) error {
	for k, buf := range out {
		d, err := host(buf)
		if err != nil {
			return fmt.Errorf("cpu: program output %d: %w", k, err)
		}
		if len(d) != len(p.outputs[k].data) {
			return fmt.Errorf("%w: cpu: program output %d has %d bytes, the program's %d", kernels.ErrShape, k, len(d), len(p.outputs[k].data))
		}
	}
	return nil
}

// CopyOutputs copies the outputs of the last run, or of the recording,
// into out.
func (p *Program) CopyOutputs(out []kernels.Buffer) error {
	if p.released {
		return fmt.Errorf("%w: cpu: program released", kernels.ErrAttr)
	}
	if len(out) != len(p.outputs) {
		return fmt.Errorf("%w: cpu: program has %d outputs, got %d", kernels.ErrArity, len(p.outputs), len(out))
	}
	if err := p.checkOut(out); err != nil {
		return err
	}
	for k, buf := range out {
		copy(buf.(*Buffer).data, p.outputs[k].data)
	}
	return nil
}

// Release frees the program's buffers; it is idempotent.
func (p *Program) Release() {
	if p.released {
		return
	}
	p.released = true
	for _, buf := range p.arena {
		p.b.Free(buf)
	}
}
