//go:build cgo && linux

package cuda

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// Programs: the device work of a run of ops, recorded once as the ops run
// and run again on other inputs without planning, checking or allocating
// anything op by op (a worker's replay of a captured graph, see
// worker/graph.go).
//
// Record starts a recording. From then on every block the allocator hands
// out belongs to the recording, and a block of the recording that is freed
// goes to the recording's own free list, handed out again only within it:
// the device calls queued meanwhile name fixed addresses that nothing else
// will be given while the program lives (its arena). RecordInput copies an
// input into a slot of the recording, outside what is recorded. EndRecord
// turns the device calls queued since Record into a Program whose inputs
// are the slots and whose outputs are the buffers it is told; the blocks
// still held (outputs, slots never freed) become the program's, and freeing
// them does nothing.
//
// Run copies its inputs into the slots, runs the recorded calls and copies
// the outputs out, all queued like any op. The first Run captures the
// recorded calls as a CUDA graph on the stream (stream capture, relaxed
// mode), so each later Run is three kinds of calls whatever the program's
// length: the inputs' copies, one graph launch, the outputs' copies. A
// capture the driver refuses (or a driver without graphs) leaves the
// program running its calls one by one, with the same results.
//
// Work that cannot be repeated makes the recording fail at EndRecord
// (kernels.ErrNotRecordable): an op that reads a flag back from the device (index
// checks), an upload or a download (host memory), a call that failed to
// plan. The caller then keeps what the ops did as they ran, and runs them
// one by one next time.

var _ kernels.Program = (*Program)(nil)

// recording is the program being recorded (see Record). Caller's side,
// under mu.
type recording struct {
	body   []item           // the device calls queued since Record, in order
	blocks map[uint64]int   // every block handed out since Record: address to class
	pool   map[int][]uint64 // blocks of the recording freed since, by class
	inputs []*buffer        // the input slots, in the order of RecordInput
	bad    string           // why it cannot become a program; "" if it can
	// unfused is set when a chain of the recording ran op by op because
	// its fused kernel was still compiling: a recording later would be
	// one launch where this one is several.
	unfused bool
}

// notRecordable marks the recording in progress, if any, as one that
// cannot become a program. The caller holds mu.
func (b *Backend) notRecordable(why string) {
	if r := b.recording; r != nil && r.bad == "" {
		r.bad = why
	}
}

// Program is recorded device work (see Record). Its methods are safe to
// call from the goroutine that uses the backend.
type Program struct {
	b       *Backend
	body    []item
	inputs  []*buffer
	outputs []*buffer
	arena   map[uint64]int // address to class: every block it owns
	bytes   int64
	// released is set by Release, under b.mu.
	released bool

	// Device thread only.
	graph   cuGraph
	exec    cuGraphExec
	noGraph bool
}

// Record starts recording the device work queued from now on (see
// Program).
func (b *Backend) Record() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	if b.recording != nil {
		return fmt.Errorf("%w: a recording is already in progress", kernels.ErrAttr)
	}
	b.flushChain() // work queued before belongs to no program
	b.recording = &recording{blocks: map[uint64]int{}, pool: map[int][]uint64{}}
	return nil
}

// RecordInput makes slot, a buffer allocated since Record, the next input
// of the recording, and queues a copy of src into it that is not part of
// the recording. slot and src must have the same size.
func (b *Backend) RecordInput(slot, src kernels.Buffer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	r := b.recording
	if r == nil {
		return fmt.Errorf("%w: no recording in progress", kernels.ErrAttr)
	}
	s, err := b.own(slot, 0)
	if err != nil {
		return fmt.Errorf("record input slot: %w", err)
	}
	d, err := b.own(src, s.n)
	if err != nil {
		return fmt.Errorf("record input: %w", err)
	}
	if _, ok := r.blocks[s.ptr]; !ok || s.n != d.n {
		return fmt.Errorf("%w: an input slot is a buffer of the input's size (%d bytes) allocated since Record", kernels.ErrAttr, d.n)
	}
	b.flushChain()
	b.recording = nil
	b.queueCopy(s.ptr, d.ptr, s.n)
	b.pushRun("program input")
	b.recording = r
	r.inputs = append(r.inputs, s)
	return nil
}

// EndRecord ends the recording and returns its program, whose outputs are
// outs. held lists every other buffer allocated since Record that the
// caller still holds; with outs, they become the program's, and the
// caller forgets them without freeing them. On an error the recording is
// dropped: the caller keeps every buffer it holds, as if nothing had been
// recorded.
func (b *Backend) EndRecord(outs, held []kernels.Buffer) (kernels.Program, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, ErrClosed
	}
	r := b.recording
	if r == nil {
		return nil, fmt.Errorf("%w: no recording in progress", kernels.ErrAttr)
	}
	b.flushChain() // the recording's last chain is part of it
	b.recording = nil
	fail := func(err error) (kernels.Program, error) {
		b.dropRecording(r)
		return nil, err
	}
	switch {
	case r.bad != "":
		return fail(fmt.Errorf("%w: %s", kernels.ErrNotRecordable, r.bad))
	case r.unfused:
		return fail(fmt.Errorf("%w: a chain's fused kernel is still compiling", kernels.ErrNotYet))
	}
	p := &Program{b: b, body: r.body, inputs: r.inputs, arena: r.blocks}
	kept := map[uint64]bool{}
	var owned []*buffer
	for _, l := range [][]kernels.Buffer{outs, held} {
		for _, buf := range l {
			d, err := b.own(buf, 0)
			if err != nil {
				return fail(fmt.Errorf("end record: %w", err))
			}
			if _, ok := r.blocks[d.ptr]; !ok || kept[d.ptr] {
				return fail(fmt.Errorf("%w: end record: a buffer not allocated since Record, or listed twice", kernels.ErrAttr))
			}
			kept[d.ptr] = true
			owned = append(owned, d)
		}
	}
	p.outputs = owned[:len(outs)]
	pooled := 0
	for _, l := range r.pool {
		pooled += len(l)
	}
	if pooled+len(kept) != len(r.blocks) {
		return fail(fmt.Errorf("%w: end record: %d blocks allocated since Record, %d freed and %d listed", kernels.ErrAttr, len(r.blocks), pooled, len(kept)))
	}
	for _, d := range owned {
		d.freed = true // the program's now: a Free of it does nothing
	}
	for _, c := range r.blocks {
		p.bytes += int64(c)
	}
	return p, nil
}

// AbortRecord drops the recording in progress, if any; the caller keeps
// the buffers it holds.
func (b *Backend) AbortRecord() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.recording; r != nil && !b.closed {
		b.flushChain()
		b.recording = nil
		b.dropRecording(r)
	}
}

// dropRecording returns the blocks that r freed to the allocator; those
// its caller holds go back one by one as it frees them. The caller holds
// mu.
func (b *Backend) dropRecording(r *recording) {
	for c, l := range r.pool {
		for _, p := range l {
			b.mem.put(p, c)
		}
	}
}

// Bytes is the device memory the program holds.
func (p *Program) Bytes() int64 { return p.bytes }

// Run queues the program on in: each input copied into its slot, the
// recorded work, each output copied into out. in and out have the sizes
// of the recording's.
func (p *Program) Run(in, out []kernels.Buffer) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := p.usable(); err != nil {
		return err
	}
	if len(in) != len(p.inputs) || len(out) != len(p.outputs) {
		return fmt.Errorf("%w: program takes %d inputs and %d outputs, got %d and %d", kernels.ErrArity, len(p.inputs), len(p.outputs), len(in), len(out))
	}
	inB, err := p.sized(in, p.inputs)
	if err != nil {
		return fmt.Errorf("program input %w", err)
	}
	outB, err := p.sized(out, p.outputs)
	if err != nil {
		return fmt.Errorf("program output %w", err)
	}
	return b.queue("program", func() error {
		b.flushChain()
		for k, d := range inB {
			b.queueCopy(p.inputs[k].ptr, d.ptr, d.n)
		}
		b.record(p.runBody)
		for k, d := range outB {
			b.queueCopy(d.ptr, p.outputs[k].ptr, d.n)
		}
		return nil
	})
}

// CopyOutputs queues copies of the outputs of the program's last run (or
// of its recording) into out.
func (p *Program) CopyOutputs(out []kernels.Buffer) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := p.usable(); err != nil {
		return err
	}
	if len(out) != len(p.outputs) {
		return fmt.Errorf("%w: program has %d outputs, got %d", kernels.ErrArity, len(p.outputs), len(out))
	}
	outB, err := p.sized(out, p.outputs)
	if err != nil {
		return fmt.Errorf("program output %w", err)
	}
	return b.queue("program outputs", func() error {
		b.flushChain()
		for k, d := range outB {
			b.queueCopy(d.ptr, p.outputs[k].ptr, d.n)
		}
		return nil
	})
}

// Release gives the program's memory back to the allocator (work queued
// before that still uses it runs first) and its CUDA graph back to the
// driver. It is idempotent.
func (p *Program) Release() {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.released || b.closed {
		p.released = true
		return
	}
	p.released = true
	for ptr, c := range p.arena {
		b.mem.put(ptr, c)
	}
	b.push(item{bg: func() {
		if p.exec != nil {
			_ = graphExecDestroy(p.exec)
		}
		if p.graph != nil {
			_ = graphDestroy(p.graph)
		}
		p.exec, p.graph = nil, nil
	}})
}

// usable checks that p may be queued. The caller holds mu.
func (p *Program) usable() error {
	switch {
	case p.b.closed:
		return ErrClosed
	case p.released:
		return fmt.Errorf("%w: program released", kernels.ErrAttr)
	case p.b.recording != nil:
		return fmt.Errorf("%w: a program cannot run while another is recorded", kernels.ErrAttr)
	}
	return nil
}

// sized returns the buffers of l, each of the size of the slot at its
// index.
func (p *Program) sized(l []kernels.Buffer, slots []*buffer) ([]*buffer, error) {
	r := make([]*buffer, len(l))
	for k, buf := range l {
		d, err := p.b.own(buf, slots[k].n)
		if err != nil {
			return nil, fmt.Errorf("%d: %w", k, err)
		}
		if d.n != slots[k].n {
			return nil, fmt.Errorf("%d: %w: %d bytes, the program's are %d", k, kernels.ErrShape, d.n, slots[k].n)
		}
		r[k] = d
	}
	return r, nil
}

// runBody runs the recorded calls: through the program's CUDA graph once
// it has one, captured at the first run after the recording. Device
// thread only.
func (p *Program) runBody() error {
	if p.exec == nil && !p.noGraph {
		if err := p.capture(); err != nil {
			p.noGraph = true
		} else {
			p.b.graphs++
		}
	}
	if p.exec != nil {
		return graphLaunch(p.exec, p.b.stream)
	}
	for _, it := range p.body {
		for _, f := range it.run {
			if err := f(); err != nil {
				return fmt.Errorf("%s: %w", it.op, err)
			}
		}
	}
	return nil
}

// capture records the body on the stream as a CUDA graph and instantiates
// it; nothing runs. On failure the stream is out of capture mode and p
// has no graph. Device thread only.
func (p *Program) capture() (err error) {
	if graphErr != nil {
		return graphErr
	}
	s := p.b.stream
	if err := streamBeginCapture(s); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: internal error during capture: %v", r)
		}
		g, endErr := streamEndCapture(s)
		if err == nil {
			err = endErr
		}
		if err != nil {
			if g != nil {
				_ = graphDestroy(g)
			}
			return
		}
		e, ierr := graphInstantiate(g)
		if ierr != nil {
			_ = graphDestroy(g)
			err = ierr
			return
		}
		p.graph, p.exec = g, e
	}()
	for _, it := range p.body {
		for _, f := range it.run {
			if err := f(); err != nil {
				return err
			}
		}
	}
	return nil
}
