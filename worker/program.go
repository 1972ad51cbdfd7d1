package worker

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// Programs: on a backend that can record device work (the CUDA backend,
// see kernels/cuda/program.go), a session's replay of a graph is recorded
// at its second run with the same scalars and run as one program from its
// third on: the inputs copied into the program's slots, one launch of the
// recorded work (a CUDA graph), the outputs copied into fresh tensors.
// Nothing is checked, planned or allocated op by op, which is what a
// replay of small ops spends its time on.
//
// A program gives the bits of the same ops sent one by one: its kernels
// are the ones the recorded replay ran, through the same paths, on copies
// of its inputs. What a program cannot reproduce is not recorded: graphs
// that draw from the generator (their keys are the ids a replay mints),
// ops that check their data on the host (index checks), a replay that
// failed. A replay that could end differently from one by one runs op by
// op: an input that failed or is bound twice, an internal id already
// taken, an output the session's limits refuse. Programs belong to their
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
	if prog := s.programs[key]; prog != nil {
		return x.runProgram(prog, p, op)
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
// into, charged to the session as the replay's outputs would be.
func (x *exec) programOutputs(p *graphPlan) ([]*kernels.Tensor, bool) {
	out := make([]*kernels.Tensor, len(p.outMetas))
	for j, m := range p.outMetas {
		t, err := x.alloc(m)
		if err != nil {
			x.release(out[:j])
			return nil, false // op by op, the replay fails where it would
		}
		out[j] = t
	}
	return out, true
}

// runProgram runs a replay as the session's program.
func (x *exec) runProgram(prog kernels.Program, p *graphPlan, op *codec.Op) bool {
	in, ok := x.programInputs(p, op)
	if !ok {
		return false
	}
	out, ok := x.programOutputs(p)
	if !ok {
		return false
	}
	if err := prog.Run(buffers(in), buffers(out)); err != nil {
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
	// them otherwise; the slots are not charged to the session, so that
	// its limit sees what the ops one by one would hold.
	out, ok := x.programOutputs(p)
	if !ok {
		return false
	}
	if err := r.Record(); err != nil {
		x.release(out)
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
			x.release(out)
			return false
		}
		slots[j] = slot
	}
	saved := make([]entry, len(in))
	for j, id := range op.In {
		saved[j], _ = x.s.tensors.get(id)
		x.s.tensors.set(id, entry{t: slots[j]})
	}
	pending := len(x.s.pending)
	x.replayOps(p, op, ids, i, run)
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
		for _, t := range held {
			x.d.freeBuf(t.Buf)
		}
		x.release(out)
	}
	if failed {
		forget()
		x.s.seen[key] = notRecordable
		return true
	}
	prog, err := r.EndRecord(buffers(results), buffers(held))
	if err != nil {
		forget()
		if !errors.Is(err, kernels.ErrNotYet) {
			x.s.seen[key] = notRecordable
		} // else recorded again at the next replay
		return true
	}
	// The program owns the results and the slots now: the session stops
	// counting the results, which the fresh outputs replace, and the
	// device counts the program's memory instead of theirs.
	var moved int64
	for _, t := range results {
		moved += int64(t.Buf.Bytes())
	}
	x.s.addBytes(-moved)
	for _, t := range held {
		moved += int64(t.Buf.Bytes())
	}
	x.d.mem.held.Add(prog.Bytes() - moved)
	if err := prog.CopyOutputs(buffers(out)); err != nil {
		// Only a closed backend refuses; its tensors are gone with it.
		x.release(out)
		for _, off := range p.outputs {
			x.s.tensors.set(op.Base+off, entry{fail: &codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeInternal, Message: err.Error()}})
		}
		x.dropProgram(prog)
		return true
	}
	for j, off := range p.outputs {
		x.s.tensors.set(op.Base+off, entry{t: out[j]})
	}
	if prog.Bytes() > maxProgramBytes {
		x.dropProgram(prog)
		x.s.seen[key] = notRecordable
		return true
	}
	if x.s.programs == nil {
		x.s.programs = map[string]kernels.Program{}
	}
	x.s.programs[key] = prog
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

// dropProgram releases a program no session holds.
func (x *exec) dropProgram(prog kernels.Program) {
	prog.Release()
	x.d.mem.held.Add(-prog.Bytes())
}

// dropPrograms releases the session's programs.
func (s *session) dropPrograms(d *device) {
	for _, prog := range s.programs {
		prog.Release()
		d.mem.held.Add(-prog.Bytes())
		d.m.programs.Add(-1)
		d.m.programBytes.Add(-prog.Bytes())
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
