package worker

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// entry is one id in a session's tensor table: a live tensor, or the error
// of the op that should have produced it.
type entry struct {
	t    *kernels.Tensor
	fail *codec.Error
}

// session is one client session's state on a device. Only the device loop
// touches it.
type session struct {
	id      string
	tensors table
	seed    uint64
	// pending holds errors not yet reported to the client.
	pending []codec.Error
	bytes   int64
	last    time.Time
	// frame is the number (header Fabric-Frame) of the last frame run;
	// loose: the session takes numbered frames in any order (restored
	// from a checkpoint that did not record the number). held are frames
	// stored ahead of a missing one, by number, until it comes (see
	// device.order).
	frame    uint64
	loose    bool
	held     map[uint64]heldFrame
	heldSize int
	// tenant is the session's tenant ("" for none); st its record on
	// this worker; use its use of the device, charged with the session's
	// bytes (quota.go).
	tenant string
	st     *tenantState
	use    *tenantUse
	// programs are the session's replays recorded as device programs, by
	// programKey; seen counts the replays of keys not recorded yet, or
	// marks them notRecordable (see program.go).
	programs map[string]sessionProgram
	seen     map[string]int
	// high is the most bytes the session held since it was last set (a
	// program's recording measures its replay's peak with it).
	high int64
}

// heldFrame is a frame waiting for the frames numbered before it.
type heldFrame struct {
	msg jetstream.Msg
	seq uint64
}

func newSession(id string) *session {
	return &session{id: id}
}

// addBytes changes the bytes the session holds, and its tenant's.
func (s *session) addBytes(n int64) {
	s.bytes += n
	s.high = max(s.high, s.bytes)
	if s.use != nil {
		s.use.held += n
	}
}

func (s *session) free(d *device, id uint64) bool {
	e, ok := s.tensors.get(id)
	if !ok {
		return false
	}
	if e.t != nil {
		s.addBytes(-int64(e.t.Buf.Bytes()))
		d.dropLazy(e.t)
		if !d.dropFlying(e.t) { // else freed once its collective is done
			d.freeBuf(e.t.Buf)
		}
	}
	s.tensors.del(id)
	return true
}

func (s *session) freeAll(d *device) {
	for id := range s.tensors.all() {
		s.free(d, id)
	}
	s.dropPrograms(d)
}

// pendInOrder records e, an error of an op that ran beside the loop,
// among the unreported errors in the order of the ops (stream sequence,
// then index), where the op would have put it had it run in the loop.
func (s *session) pendInOrder(e codec.Error) {
	k := len(s.pending)
	for k > 0 {
		p := s.pending[k-1]
		if p.Seq < e.Seq || p.Seq == e.Seq && p.Index <= e.Index {
			break
		}
		k--
	}
	s.pending = slices.Insert(s.pending, k, e)
}

// takeErrors returns and clears the unreported errors, adding cause if it is
// not among them.
func (s *session) takeErrors(cause *codec.Error) []codec.Error {
	errs := s.pending
	s.pending = nil
	if cause != nil {
		found := false
		for _, e := range errs {
			if e.Seq == cause.Seq && e.Index == cause.Index {
				found = true
				break
			}
		}
		if !found {
			errs = append(errs, *cause)
		}
	}
	return errs
}
