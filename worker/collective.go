package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// Collectives in flight. On a device whose tensors live in host memory (the
// CPU backend's), a collective op checks what it can, allocates its output
// (charged to the session as any op's), puts it in the session table and
// returns; a goroutine exchanges the pieces and writes the output's bytes,
// while the device runs the ops after it. An op that reads the output
// waits for it (exec.input), as do a read and a sync for every collective
// of their session in flight (so that the errors they report are those of
// every op before them), and a checkpoint's snapshot for every collective
// of the device (a checkpoint never holds a tensor in flight). Results are
// the bits of the same op run in the loop: the same pieces, reduced in
// rank order.
//
// The goroutine shares nothing with the loop: its input's buffer is pinned
// while it reads it (a free of the input waits, see memory.go; tensors are
// immutable, so the pin is as good as a copy), its output's buffer is the
// loop's to read only once it is done, and what it moved and the transfer
// objects it read last are kept on its own mover. The loop settles a
// collective that is done (settle): it takes those in, and on a failure
// records the op's error as the op would have (same seq, index, op and
// code), marks its output failed and frees the buffer. A free of an output
// in flight takes it out of the table at once and frees its buffer when the
// collective is done: the other ranks still get this rank's pieces.
//
// A device stepping down or closing cancels its collectives in flight and
// waits for them; the next owner replays the ops (read counting by
// identity lets a replayed op read its pieces again).

// maxFlying bounds a device's collectives in flight: starting one more
// first waits for the oldest.
const maxFlying = 8

// flight is one collective in flight.
type flight struct {
	// Set by the loop before the goroutine starts; read-only after.
	s     *session
	id    uint64
	t     *kernels.Tensor // the output, written by the goroutine
	in    kernels.Buffer  // the input's buffer, pinned until done
	seq   uint64
	index int
	op    string
	mv    *mover
	// cancel ends the exchange (a step down, a close).
	cancel context.CancelFunc
	// done is closed when the goroutine ends; err is set before.
	done chan struct{}
	err  error
	// freed: the output was freed while in flight; its buffer is freed
	// when the flight is settled. Device loop only.
	freed bool
}

// startCollective starts op i, a collective, beside the loop when the
// device's tensors live in host memory: work runs on its own goroutine,
// with in's bytes, and its result becomes output out. It reports false,
// having done nothing, when the op must run in the loop.
func (x *exec) startCollective(i int, op *codec.Op, c *coll, in *kernels.Tensor, out kernels.Meta, work func(c *coll, data, dst []byte) error) (bool, error) {
	d := x.d
	data := hostView(in)
	if d.syncCollectives || data == nil {
		return false, nil
	}
	if len(d.flying) >= maxFlying {
		d.settle(d.flying[0])
	}
	t, err := x.allocFilled(out)
	if err != nil {
		// In the loop, as before: this rank still sends its pieces, and
		// the op fails at its end, when it places its output.
		return false, nil
	}
	dst := hostView(t)
	if dst == nil {
		x.release([]*kernels.Tensor{t})
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.timeout(op))
	f := &flight{s: x.s, id: op.Out[0], t: t, in: in.Buf, seq: x.seq, index: i, op: op.Op,
		mv: &mover{w: d.w}, cancel: cancel, done: make(chan struct{})}
	c.ctx, c.mv = ctx, f.mv
	d.mem.pin(in.Buf)
	x.s.tensors.set(f.id, entry{t: t})
	if d.flyingBy == nil {
		d.flyingBy = map[*kernels.Tensor]*flight{}
	}
	d.flying = append(d.flying, f)
	d.flyingBy[t] = f
	d.m.flying.Store(int64(len(d.flying)))
	name := f.op
	start := time.Now()
	go func() {
		defer close(f.done)
		defer func() { d.m.collNanos.Add(uint64(time.Since(start))) }()
		defer cancel()
		defer d.mem.unpin(f.in)
		defer func() {
			if p := recover(); p != nil {
				f.err = failf(codec.CodeInternal, "%s panicked: %v", name, p)
			}
		}()
		f.err = work(c, data, dst)
	}()
	return true, nil
}

// settle waits for f and ends it: what it moved goes to the device's
// metrics and consumed list; a failure becomes the op's error in its
// session and its output's; a freed output's buffer is freed. Device loop
// only.
func (d *device) settle(f *flight) {
	select {
	case <-f.done:
	default:
		start := time.Now()
		<-f.done
		d.m.collWaitNanos.Add(uint64(time.Since(start)))
	}
	for k, g := range d.flying {
		if g == f {
			d.flying = append(d.flying[:k], d.flying[k+1:]...)
			break
		}
	}
	delete(d.flyingBy, f.t)
	d.m.flying.Store(int64(len(d.flying)))
	f.mv.mu.Lock()
	d.m.moved(&f.mv.io)
	d.consumed = append(d.consumed, f.mv.consumed...)
	f.mv.io, f.mv.consumed = ioCount{}, nil
	f.mv.mu.Unlock()
	if f.err == nil {
		if f.freed {
			d.freeBuf(f.t.Buf)
		}
		return
	}
	e := codec.Error{Seq: f.seq, Index: f.index, Op: f.op, Code: codeOf(f.err), Message: f.err.Error()}
	d.m.countError(e.Code)
	s := f.s
	if d.sessions[s.id] == s {
		s.pendInOrder(e)
	}
	if cur, ok := s.tensors.get(f.id); ok && cur.t == f.t && !f.freed {
		s.addBytes(-int64(f.t.Buf.Bytes()))
		s.tensors.set(f.id, entry{fail: &e})
	}
	d.freeBuf(f.t.Buf)
}

// awaitFlying waits for t if it is the output of a collective in flight
// and settles it, reporting whether it was. Device loop only.
func (d *device) awaitFlying(t *kernels.Tensor) bool {
	f := d.flyingBy[t]
	if f == nil {
		return false
	}
	d.settle(f)
	return true
}

// dropFlying notes that t was freed: if it is the output of a collective
// in flight, its buffer is freed once the collective is done, and
// dropFlying reports true. Device loop only.
func (d *device) dropFlying(t *kernels.Tensor) bool {
	f := d.flyingBy[t]
	if f == nil {
		return false
	}
	f.freed = true
	return true
}

// settleSession waits for the collectives of s in flight, oldest first.
// Device loop only.
func (d *device) settleSession(s *session) {
	for k := 0; k < len(d.flying); {
		if f := d.flying[k]; f.s == s {
			d.settle(f)
			continue
		}
		k++
	}
}

// settleDone settles the collectives that are done, without waiting.
// Device loop only.
func (d *device) settleDone() {
	for k := 0; k < len(d.flying); {
		f := d.flying[k]
		select {
		case <-f.done:
			d.settle(f)
			continue
		default:
		}
		k++
	}
}

// settleAll waits for every collective in flight; it gives up when ctx
// ends first, leaving the rest in flight. Device loop only.
func (d *device) settleAll(ctx context.Context) error {
	for len(d.flying) > 0 {
		f := d.flying[0]
		select {
		case <-f.done:
			d.settle(f)
		case <-ctx.Done():
			return fmt.Errorf("%d collectives still in flight: %w", len(d.flying), ctx.Err())
		}
	}
	return nil
}

// stopFlying cancels the collectives in flight and waits for them, for a
// device that drops its state (a step down, a close): nothing of them is
// recorded, and the buffers of outputs freed meanwhile are freed; the
// others are in their sessions' tables. Device loop only, or after it
// stopped.
func (d *device) stopFlying() {
	for _, f := range d.flying {
		f.cancel()
	}
	for _, f := range d.flying {
		<-f.done
		if f.freed {
			d.freeBuf(f.t.Buf)
		}
	}
	clear(d.flyingBy)
	d.flying = nil
	d.m.flying.Store(0)
}
