package worker

import (
	"time"

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
	tensors map[uint64]entry
	seed    uint64
	// pending holds errors not yet reported to the client.
	pending []codec.Error
	bytes   int64
	last    time.Time
}

func newSession(id string) *session {
	return &session{id: id, tensors: map[uint64]entry{}}
}

func (s *session) free(d *device, id uint64) bool {
	e, ok := s.tensors[id]
	if !ok {
		return false
	}
	if e.t != nil {
		s.bytes -= int64(e.t.Buf.Bytes())
		d.freeBuf(e.t.Buf)
	}
	delete(s.tensors, id)
	return true
}

func (s *session) freeAll(d *device) {
	for id := range s.tensors {
		s.free(d, id)
	}
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
