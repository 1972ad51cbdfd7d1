package worker

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// Programs: on a backend that can record device work (kernels.Program:
// the CPU and CUDA backends), a session's replay of a graph is recorded at
// its second run with the same scalars and run as one program from its
// third on: the inputs copied into the program's slots, the recorded work
// (on a GPU one launch of a CUDA graph), the outputs copied into fresh
// tensors. Nothing is checked, planned or allocated op by op, which is
// what a replay of small ops spends its time on.
//
// A program gives the bits of the same ops sent one by one: its kernels
// are the ones the recorded replay ran, through the same paths, on copies
// of its inputs. What a program cannot reproduce is not recorded: graphs
// that draw from the generator (their keys are the ids a replay mints),
// ops that check their data on the host (index checks), a replay that
// failed. A replay that could end differently from one by one runs op by
// op: an input that failed or is bound twice, an internal id already
// taken, a replay that would pass the session's limit or its tenant's
// quota at some point op by op (a program measures that peak as it is
// recorded); on the CPU, a program whose run fails on the data (an index
// out of range), which has then written none of the session's tensors. Programs belong to their
// session, at most maxSessionPrograms of at most maxProgramBytes each,
// and go with it; their memory counts against the device's budget, not
// the session's.

// recorder is a backend that records the device work of a run of ops as
// a program (see kernels.Program).
type recorder interface {
	Record() error
	RecordInput(slot, src kernels.Buffer) error
	EndRecord(outs, held []kernels.Buffer) (kernels.Program, error)
	AbortRecord()
}

const (
	// maxSessionPrograms bounds a session's programs; maxProgramBytes the
	// device memory one may hold.
	maxSessionPrograms = 8
	maxProgramBytes    = 256 << 20
	// maxSeenReplays bounds the replays a session remembers having seen
	// once (a program is recorded at the second).
	maxSeenReplays = 256
	// notRecordable marks, in session.seen, a replay that cannot become a
	// program.
	notRecordable = -1
)

// sessionProgram is a session's program and the most bytes its replay
// added to the session's at any point op by op, which a run checks
// against the session's limit and the tenant's quota first: a replay
// that would fail there runs op by op and fails as it would.
type sessionProgram struct {
	prog kernels.Program
	peak int64
}

// programKey names a replay's program: its graph and its scalars' bits.
func programKey(tenant string, p *graphPlan, op *codec.Op) string {
	k := make([]byte, 0, len(tenant)+1+len(p.name)+8*len(op.Scalars))
	k = append(k, tenant...)
	k = append(k, 0)
	k = append(k, p.name...)
	for _, v := range op.Scalars {
		k = binary.LittleEndian.AppendUint64(k, math.Float64bits(v))
	}
	return string(k)
}

// replayProgram runs a replay whose bindings passed bind as a program,
// recording it if this is its second run. It reports false, having
// changed nothing, when the replay is to run op by op.
func (x *exec) replayProgram(r recorder, p *graphPlan, op *codec.Op, ids []uint64, i int, run *graphRun) bool {
	s := x.s
	key := programKey(s.tenant, p, op)
	if sp, ok := s.programs[key]; ok {
		return x.runProgram(sp, p, op)
	}
	switch n := s.seen[key]; {
	case n == notRecordable:
		return false
	case n == 0:
		if len(s.seen) >= maxSeenReplays {
			clear(s.seen)
		}
		if s.seen == nil {
			s.seen = map[string]int{}
		}
		s.seen[key] = 1
		return false
	case len(s.programs) >= maxSessionPrograms:
		return false
	}
	return x.recordProgram(r, p, op, ids, i, run, key)
}

// programInputs returns the replay's input tensors, once anything in
// flight that they wait for is done, and reports whether the replay may
// run as a program: every input live and bound once, every id it makes
// free.
func (x *exec) programInputs(p *graphPlan, op *codec.Op) ([]*kernels.Tensor, bool) {
	in := make([]*kernels.Tensor, len(op.In))
	for j, id := range op.In {
		if slices.Contains(op.In[:j], id) {
			return nil, false
		}
		t, err := x.input(id)
		if err != nil {
			return nil, false // the replay's ops report it
		}
		in[j] = t
	}
	for k := range p.internal {
		if x.s.tensors.has(op.Base + uint64(k)) {
			return nil, false
		}
	}
	return in, true
}

// programOutputs allocates the tensors a program's outputs are copied
// into, with alloc.
func programOutputs(p *graphPlan, alloc func(kernels.Meta) (*kernels.Tensor, error), free func(*kernels.Tensor)) ([]*kernels.Tensor, bool) {
	out := make([]*kernels.Tensor, len(p.outMetas))
	for j, m := range p.outMetas {
		t, err := alloc(m)
		if err != nil {
			for _, t := range out[:j] {
				free(t)
			}
			return nil, false // op by op, the replay fails where it would
		}
		out[j] = t
	}
	return out, true
}

// fits reports whether the session's limit and its tenant's quota leave
// room for peak more bytes.
func (x *exec) fits(peak int64) bool {
	if x.s.bytes+peak > x.d.w.cfg.Limits.MaxSessionBytes {
		return false
	}
	return x.quotaBytes(peak) == nil
}

// runProgram runs a replay as the session's program.
func (x *exec) runProgram(sp sessionProgram, p *graphPlan, op *codec.Op) bool {
	if !x.fits(sp.peak) {
		return false
	}
	in, ok := x.programInputs(p, op)
	if !ok {
		return false
	}
	out, ok := programOutputs(p, x.alloc, func(t *kernels.Tensor) { x.release([]*kernels.Tensor{t}) })
	if !ok {
		return false
	}
	if err := sp.prog.Run(buffers(in), buffers(out)); err != nil {
		x.release(out)
		return false
	}
	x.finishProgram(p, op, out)
	return true
}

// finishProgram gives the replay's outputs their ids and frees the inputs
// the graph frees.
func (x *exec) finishProgram(p *graphPlan, op *codec.Op, out []*kernels.Tensor) {
	for j, off := range p.outputs {
		x.s.tensors.set(op.Base+off, entry{t: out[j]})
	}
	for j, id := range op.In {
		if p.freesInput[j] {
			x.s.free(x.d, id)
		}
	}
	x.d.m.programRuns.Add(1)
	x.d.m.programOps.Add(uint64(p.nops))
}

// recordProgram runs a replay op by op while the backend records it. The
// graph's ops read copies of the inputs (slots of the recording) in the
// inputs' place; if the replay ends as a program can repeat, its outputs
// are copied into fresh tensors and the recording becomes the session's
// program. Either way the session ends as if the ops had run one by one.
func (x *exec) recordProgram(r recorder, p *graphPlan, op *codec.Op, ids []uint64, i int, run *graphRun, key string) bool {
	in, ok := x.programInputs(p, op)
	if !ok {
		return false
	}
	// The outputs' tensors come before the recording, which would own
	// them otherwise. Neither they nor the slots are charged to the
	// session while the ops run, so that its limit sees what the ops one
	// by one hold; the outputs take the place of the results after.
	freeDev := func(t *kernels.Tensor) { x.d.freeBuf(t.Buf) }
	out, ok := programOutputs(p, x.deviceAlloc, freeDev)
	if !ok {
		return false
	}
	if err := r.Record(); err != nil {
		for _, t := range out {
			freeDev(t)
		}
		return false
	}
	slots := make([]*kernels.Tensor, len(in))
	for j, t := range in {
		slot, err := x.deviceAlloc(t.Meta)
		if err == nil {
			if err = r.RecordInput(slot.Buf, t.Buf); err != nil {
				x.d.freeBuf(slot.Buf)
			}
		}
		if err != nil {
			for _, s := range slots[:j] {
				x.d.freeBuf(s.Buf)
			}
			r.AbortRecord()
			for _, t := range out {
				freeDev(t)
			}
			return false
		}
		slots[j] = slot
	}
	saved := make([]entry, len(in))
	for j, id := range op.In {
		saved[j], _ = x.s.tensors.get(id)
		x.s.tensors.set(id, entry{t: slots[j]})
	}
	pending, start := len(x.s.pending), x.s.bytes
	x.s.high = start
	x.replayOps(p, op, ids, i, run)
	peak := x.s.high - start
	failed := len(x.s.pending) != pending
	results := make([]*kernels.Tensor, len(p.outputs))
	for j, off := range p.outputs {
		e, _ := x.s.tensors.get(op.Base + off)
		if e.t == nil {
			failed = true
		}
		results[j] = e.t
	}
	// The inputs take their ids again. A slot the graph freed was taken
	// off the session's bytes as the input would have been: the input
	// goes now, its bytes counted back first.
	var held []*kernels.Tensor
	for j, id := range op.In {
		e, kept := x.s.tensors.get(id)
		x.s.tensors.set(id, saved[j])
		if kept {
			held = append(held, e.t)
		} else {
			x.s.addBytes(int64(saved[j].t.Buf.Bytes()))
			x.s.free(x.d, id)
		}
	}
	forget := func() {
		r.AbortRecord()
		for _, t := range append(held, out...) {
			freeDev(t)
		}
	}
	if failed {
		forget()
		x.s.seen[key] = notRecordable
		return true
	}
	// The program owns the results and the slots now (counted before
	// EndRecord, which may free a slot it reads in place).
	var moved int64
	for _, t := range append(results, held...) {
		moved += int64(t.Buf.Bytes())
	}
	prog, err := r.EndRecord(buffers(results), buffers(held))
	if err != nil {
		forget()
		if !errors.Is(err, kernels.ErrNotYet) {
			x.s.seen[key] = notRecordable
		} // else recorded again at the next replay
		return true
	}
	// The fresh outputs take the results' place in the session (and their
	// bytes, the same), and the device counts the program's memory
	// instead of the results' and the slots'.
	x.d.mem.held.Add(prog.Bytes() - moved)
	if err := prog.CopyOutputs(buffers(out)); err != nil {
		// Only a closed backend refuses; its tensors are gone with it.
		for j, t := range out {
			x.s.addBytes(-int64(results[j].Buf.Bytes()))
			freeDev(t)
		}
		for _, off := range p.outputs {
			x.s.tensors.set(op.Base+off, entry{fail: &codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeInternal, Message: err.Error()}})
		}
		x.d.dropProgram(prog)
		return true
	}
	for j, off := range p.outputs {
		x.s.tensors.set(op.Base+off, entry{t: out[j]})
	}
	if prog.Bytes() > maxProgramBytes {
		x.d.dropProgram(prog)
		x.s.seen[key] = notRecordable
		return true
	}
	if x.s.programs == nil {
		x.s.programs = map[string]sessionProgram{}
	}
	x.s.programs[key] = sessionProgram{prog: prog, peak: peak}
	delete(x.s.seen, key)
	x.d.m.programs.Add(1)
	x.d.m.programBytes.Add(prog.Bytes())
	return true
}

// deviceAlloc allocates a tensor charged to the device's budget but not
// to the session.
func (x *exec) deviceAlloc(m kernels.Meta) (*kernels.Tensor, error) {
	n := m.Bytes()
	if err := x.d.charge(n); err != nil {
		return nil, err
	}
	buf, err := x.d.cfg.Backend.Alloc(n)
	if err != nil {
		x.d.mem.held.Add(-int64(n))
		return nil, err
	}
	x.d.mem.held.Add(int64(buf.Bytes() - n))
	return &kernels.Tensor{Meta: m, Buf: buf}, nil
}

// dropProgram releases prog and the device memory it was counted for.
func (d *device) dropProgram(prog kernels.Program) {
	prog.Release()
	d.mem.held.Add(-prog.Bytes())
}

// dropPrograms releases the session's programs.
func (s *session) dropPrograms(d *device) {
	for _, sp := range s.programs {
		d.dropProgram(sp.prog)
		d.m.programs.Add(-1)
		d.m.programBytes.Add(-sp.prog.Bytes())
	}
	s.programs, s.seen = nil, nil
}

func buffers(ts []*kernels.Tensor) []kernels.Buffer {
	b := make([]kernels.Buffer, len(ts))
	for i, t := range ts {
		b[i] = t.Buf
	}
	return b
}
