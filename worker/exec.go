package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/objectstore"
)

// Ops the worker handles itself; everything else goes to the backend.
const (
	opUpload = "upload"
	opRead   = "read"
	opSync   = "sync"
	opFree   = "free"
	opSeed   = "seed"
	opClose  = "close"
	// opCheckpoint asks for a checkpoint of the device after this frame.
	opCheckpoint = "checkpoint"
)

// exec runs the ops of one frame for one session.
type exec struct {
	d     *device
	s     *session
	seq   uint64
	reply string
	// badReply is a tenant's Fabric-Reply outside its inbox: nothing is
	// answered on it, the reads of the frame fail with CodePermission.
	badReply string
	enc      codec.Encoding
	io       ioCount   // bytes moved by this frame, for metrics
	graph    *graphRun // the replay running, if any (see graph.go)
	// donate marks, for the compute op about to run, the inputs whose
	// buffers its outputs may take (see donations); nil for none.
	donate []bool
}

// pend records a new error of the session, reported on its next read or
// sync, and counts it.
func (x *exec) pend(e codec.Error) {
	x.d.m.countError(e.Code)
	x.s.pending = append(x.s.pending, e)
}

// opError is an op failure with its wire code.
type opError struct {
	code string
	msg  string
}

func (e *opError) Error() string { return e.msg }

func failf(code, format string, args ...any) *opError {
	return &opError{code: code, msg: fmt.Sprintf(format, args...)}
}

// op runs op i of the frame. It reports whether the session was closed.
// A panic in a backend is turned into an internal error for this op: a bug
// in one kernel must not take the device down for every session.
func (x *exec) op(i int, op *codec.Op) (closed bool) {
	var err error
	defer func() {
		if p := recover(); p != nil {
			x.failed(i, op, failf(codec.CodeInternal, "%s panicked: %v", op.Op, p))
			closed = false
		}
	}()
	switch op.Op {
	case opUpload:
		err = x.upload(op)
	case opRead:
		x.read(i, op)
	case opSync:
		x.sync(i, op)
	case opFree:
		for _, id := range op.In {
			x.s.free(x.d, id)
		}
	case opSeed:
		x.s.seed = op.Seed
	case opCheckpoint:
		x.d.ck.wanted = true
	case opExpose:
		err = x.expose(i, op)
	case opImport:
		err = x.importT(i, op)
	case opAllReduce, opAllGather, opReduceScatter, opBroadcast:
		err = x.collective(i, op)
	case opReplay:
		err = x.replay(i, op)
	case opClose:
		x.s.freeAll(x.d)
		if op.Tag != 0 {
			x.sync(i, op)
		}
		return true
	default:
		err = x.compute(op)
	}
	if err != nil {
		x.failed(i, op, err)
	}
	return false
}

// failed records err for op i and marks its outputs failed.
func (x *exec) failed(i int, op *codec.Op, err error) {
	e := codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codeOf(err), Message: err.Error()}
	x.inGraph(&e)
	var fe *failedInput
	if errors.As(err, &fe) {
		// Report the first cause on the ids this op would have made; the
		// cause itself was reported already.
		for _, id := range op.Out {
			if !x.s.tensors.has(id) {
				x.s.tensors.set(id, entry{fail: fe.cause})
			}
		}
		return
	}
	x.pend(e)
	for _, id := range op.Out {
		if !x.s.tensors.has(id) {
			x.s.tensors.set(id, entry{fail: &e})
		}
	}
}

type failedInput struct{ cause *codec.Error }

func (f *failedInput) Error() string { return "input failed earlier: " + f.cause.Error() }

func codeOf(err error) string {
	var oe *opError
	switch {
	case errors.As(err, &oe):
		return oe.code
	case errors.Is(err, kernels.ErrUnknownOp):
		return codec.CodeUnknownOp
	case errors.Is(err, kernels.ErrArity):
		return codec.CodeArity
	case errors.Is(err, kernels.ErrShape):
		return codec.CodeShape
	case errors.Is(err, kernels.ErrDType):
		return codec.CodeDType
	case errors.Is(err, kernels.ErrAttr):
		return codec.CodeAttr
	case errors.Is(err, kernels.ErrTooLarge):
		return codec.CodeTooLarge
	case errors.Is(err, kernels.ErrOutOfMemory):
		return codec.CodeResourceExhausted
	}
	var fe *failedInput
	if errors.As(err, &fe) {
		return codec.CodeFailedID
	}
	return codec.CodeInternal
}

// input resolves a tensor id, waiting for it if it is the output of a
// collective in flight.
func (x *exec) input(id uint64) (*kernels.Tensor, error) {
	e, ok := x.s.tensors.get(id)
	if ok && e.t != nil && x.d.awaitFlying(e.t) {
		e, ok = x.s.tensors.get(id) // the tensor, or the collective's error
	}
	switch {
	case !ok:
		return nil, failf(codec.CodeUnknownID, "tensor %d does not exist in this session (never created, or freed)", id)
	case e.fail != nil:
		return nil, &failedInput{cause: e.fail}
	}
	if err := x.d.awaitTensor(e.t); err != nil {
		return nil, err
	}
	return e.t, nil
}

// alloc makes an output tensor, charged to the session.
func (x *exec) alloc(m kernels.Meta) (*kernels.Tensor, error) {
	return x.allocWith(m, x.d.cfg.Backend.Alloc)
}

// uninitAllocator is a backend that can skip clearing a buffer its caller
// fills entirely (the CPU backend reusing freed memory).
type uninitAllocator interface {
	AllocUninit(n int) (kernels.Buffer, error)
}

// allocFilled is alloc for a tensor whose every byte the caller writes
// before anything reads it.
func (x *exec) allocFilled(m kernels.Meta) (*kernels.Tensor, error) {
	if u, ok := x.d.cfg.Backend.(uninitAllocator); ok {
		return x.allocWith(m, u.AllocUninit)
	}
	return x.alloc(m)
}

func (x *exec) allocWith(m kernels.Meta, alloc func(int) (kernels.Buffer, error)) (*kernels.Tensor, error) {
	n := m.Bytes()
	if x.s.bytes+int64(n) > x.d.w.cfg.Limits.MaxSessionBytes {
		return nil, failf(codec.CodeLimit, "session memory limit: %d bytes in use, %d more asked, limit %d", x.s.bytes, n, x.d.w.cfg.Limits.MaxSessionBytes)
	}
	if err := x.quotaBytes(int64(n)); err != nil {
		return nil, err
	}
	if err := x.d.charge(n); err != nil {
		return nil, err
	}
	buf, err := alloc(n)
	if err != nil {
		x.d.mem.held.Add(-int64(n))
		return nil, err
	}
	x.d.mem.held.Add(int64(buf.Bytes() - n))
	x.s.addBytes(int64(buf.Bytes()))
	return &kernels.Tensor{Meta: m, Buf: buf}, nil
}

// claim checks that op's output ids are fresh.
func (x *exec) claim(op *codec.Op, n int) error {
	if len(op.Out) != n {
		return failf(codec.CodeArity, "%s produces %d tensors, %d output ids given", op.Op, n, len(op.Out))
	}
	for _, id := range op.Out {
		if id == 0 {
			return failf(codec.CodeAttr, "output id 0 is reserved")
		}
		if x.s.tensors.has(id) {
			return failf(codec.CodeDuplicate, "output id %d is already in use in this session", id)
		}
	}
	return nil
}

func (x *exec) compute(op *codec.Op) error {
	if !kernels.Known(op.Op) {
		return fmt.Errorf("%w %q", kernels.ErrUnknownOp, op.Op)
	}
	in := make([]*kernels.Tensor, len(op.In))
	metas := make([]kernels.Meta, len(op.In))
	for j, id := range op.In {
		t, err := x.input(id)
		if err != nil {
			return err
		}
		in[j], metas[j] = t, t.Meta
	}
	// The op is built in the device's scratch op, not a new heap object
	// per op: a backend keeps nothing of it past Exec (kernels.Backend).
	kop := &x.d.scratchOp
	var err error
	if *kop, err = codec.KernelOp(op); err != nil {
		return err
	}
	if len(op.Out) > 0 {
		kop.Key = op.Out[0]
	}
	kop.Seed = x.s.seed
	outMetas, err := kernels.Infer(kop, metas, x.d.w.cfg.Limits.Tensor)
	if err != nil {
		return err
	}
	if err := x.claim(op, len(outMetas)); err != nil {
		return err
	}
	// Exec writes every element of its outputs (the conformance suite
	// poisons them first), so they need no clearing. An output may take
	// the buffer of an input that is dropped after this op (donate).
	out := make([]*kernels.Tensor, len(outMetas))
	from := x.donated(in, outMetas)
	for j, m := range outMetas {
		if from != nil && from[j] >= 0 {
			out[j] = &kernels.Tensor{Meta: m, Buf: in[from[j]].Buf}
			continue
		}
		if out[j], err = x.allocFilled(m); err != nil {
			x.releaseOwn(out[:j], from)
			return err
		}
	}
	if err := x.d.execOn(kop, in, out); err != nil {
		x.releaseOwn(out, from)
		return err
	}
	// A donated input's buffer is its output's now: the input is gone,
	// its bytes the output's, and the free that follows finds nothing.
	for _, i := range from {
		if i >= 0 {
			x.d.dropLazy(in[i])
			x.s.tensors.del(op.In[i])
		}
	}
	for j, id := range op.Out {
		x.s.tensors.set(id, entry{t: out[j]})
	}
	return nil
}

// donated returns, for each output meta, the input whose buffer it takes
// (-1 for a new one): an input that x.donate marks, of the output's dtype
// and shape, each input to one output at most, none that a checkpoint in
// flight reads.
// It returns nil when there is no such input.
func (x *exec) donated(in []*kernels.Tensor, outMetas []kernels.Meta) []int {
	if x.donate == nil || len(x.donate) != len(in) {
		return nil
	}
	var from []int
	taken := make([]bool, len(in))
	for j, m := range outMetas {
		for i, t := range in {
			if x.donate[i] && !taken[i] && t.DType == m.DType && sameShape(t.Shape, m.Shape) && !x.d.mem.pinned(t.Buf) {
				if from == nil {
					from = make([]int, len(outMetas))
					for k := range from {
						from[k] = -1
					}
				}
				from[j], taken[i] = i, true
				break
			}
		}
	}
	return from
}

// releaseOwn releases the outputs that did not take an input's buffer
// (all of them if from is nil).
func (x *exec) releaseOwn(out []*kernels.Tensor, from []int) {
	for j, t := range out {
		if t != nil && (from == nil || from[j] < 0) {
			x.release([]*kernels.Tensor{t})
		}
	}
}

func (x *exec) release(ts []*kernels.Tensor) {
	for _, t := range ts {
		x.s.addBytes(-int64(t.Buf.Bytes()))
		x.d.freeBuf(t.Buf)
	}
}

func (x *exec) upload(op *codec.Op) error {
	if err := x.claim(op, 1); err != nil {
		return err
	}
	dt, err := kernels.ParseDType(op.DType)
	if err != nil {
		return err
	}
	if err := kernels.CheckShape(op.Shape, x.d.w.cfg.Limits.Tensor); err != nil {
		return err
	}
	m := kernels.Meta{DType: dt, Shape: op.Shape}
	data := op.Data
	switch {
	case op.Object != "":
		return x.uploadObject(op, m)
	case data == nil && op.Values != nil:
		if data, err = kernels.EncodeValues(dt, op.Values); err != nil {
			return err
		}
	}
	if len(data) != m.Bytes() {
		return failf(codec.CodeShape, "upload of %v %v needs %d bytes, got %d", dt, op.Shape, m.Bytes(), len(data))
	}
	t, err := x.alloc(m)
	if err != nil {
		return err
	}
	if err := x.d.cfg.Backend.Upload(t.Buf, data); err != nil {
		x.release([]*kernels.Tensor{t})
		return err
	}
	x.s.tensors.set(op.Out[0], entry{t: t})
	if op.Object != "" {
		x.io.inObject += uint64(len(data))
	} else {
		x.io.inInline += uint64(len(data))
	}
	return nil
}

// uploadObject makes an upload's tensor from its object, reading straight
// into the tensor; with op.NUID, while the uploader is still writing it.
func (x *exec) uploadObject(op *codec.Op, m kernels.Meta) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	lanes, err := x.lanes()
	if err != nil {
		return err
	}
	xfer := lanes[0]
	if op.Pieces != 0 {
		if op.NUID == "" {
			return failf(codec.CodeAttr, "upload: pieces %d without the nuid of their chunk subjects", op.Pieces)
		}
		if err := objectstore.CheckPieces(m.Bytes(), op.Pieces, op.NUID); err != nil {
			return failf(codec.CodeAttr, "upload of %d bytes: %v", m.Bytes(), err)
		}
	}
	if op.NUID == "" {
		info, err := xfer.Stat(ctx, op.Object)
		if err != nil {
			return failf(codec.CodeUnavailabe, "upload object %q: %v", op.Object, err)
		}
		if info.Size != int64(m.Bytes()) {
			return failf(codec.CodeShape, "upload object %q holds %d bytes, the tensor needs %d", op.Object, info.Size, m.Bytes())
		}
	} else if err := objectstore.ValidNUID(op.NUID); err != nil {
		return failf(codec.CodeAttr, "upload: %v", err)
	}
	r := &receiver{x: x}
	dst, err := r.alloc(m)
	if err != nil {
		return err
	}
	switch {
	case op.Pieces != 0:
		err = lanes.Follow(ctx, op.Object, op.NUID, op.Pieces, dst)
	case op.NUID != "":
		_, err = xfer.Follow(ctx, op.Object, op.NUID, dst)
	default:
		_, err = xfer.GetInto(ctx, op.Object, dst)
	}
	if err != nil {
		r.drop()
		if errors.Is(err, objectstore.ErrSize) {
			return failf(codec.CodeShape, "upload object %q: %v", op.Object, err)
		}
		return failf(codec.CodeUnavailabe, "upload object %q: %v", op.Object, err)
	}
	if err := r.done(op.Out[0]); err != nil {
		return err
	}
	x.io.inObject += uint64(m.Bytes())
	return nil
}

func (x *exec) answer(i int, op *codec.Op, r *codec.Result) {
	if x.badReply != "" {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodePermission,
			Message: fmt.Sprintf("Fabric-Reply %q is outside tenant %s's inbox %s; nothing was answered", x.badReply, x.s.tenant, x.d.w.names.TenantInboxPrefix(x.s.tenant))})
		return
	}
	if x.reply == "" {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeAttr,
			Message: "a " + op.Op + " needs a Fabric-Reply header to answer on"})
		return
	}
	r.V, r.Tag, r.Seq, r.Index = codec.Version, op.Tag, x.seq, i
	x.d.reply(x.reply, x.enc, r)
}

func (x *exec) sync(i int, op *codec.Op) {
	r := &codec.Result{}
	x.d.settleSession(x.s)
	if err := x.d.cfg.Backend.Sync(); err != nil {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeInternal, Message: err.Error()})
	}
	r.Errors = x.s.takeErrors(nil)
	x.answer(i, op, r)
}

func (x *exec) read(i int, op *codec.Op) {
	r := &codec.Result{}
	// The errors of the collectives in flight are reported with the
	// others, as if they had run in the loop.
	x.d.settleSession(x.s)
	if len(op.In) != 1 {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeArity,
			Message: fmt.Sprintf("read takes 1 tensor, got %d", len(op.In))})
		r.Errors = x.s.takeErrors(nil)
		x.answer(i, op, r)
		return
	}
	t, err := x.input(op.In[0])
	if err != nil {
		var fe *failedInput
		var cause *codec.Error
		if errors.As(err, &fe) {
			cause = fe.cause
		} else {
			cause = &codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codeOf(err), Message: err.Error()}
			x.d.m.countError(cause.Code)
		}
		r.Errors = x.s.takeErrors(cause)
		x.answer(i, op, r)
		return
	}
	if op.Pieces < 0 || op.Pieces > objectstore.MaxPieces {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codec.CodeAttr,
			Message: fmt.Sprintf("read: pieces %d, want 0 to %d", op.Pieces, objectstore.MaxPieces)})
		r.Errors = x.s.takeErrors(nil)
		x.answer(i, op, r)
		return
	}
	var write func()
	if r.Tensor, write, err = x.tensorData(t, op.Pieces); err != nil {
		x.pend(codec.Error{Seq: x.seq, Index: i, Op: op.Op, Code: codeOf(err), Message: err.Error()})
	}
	r.Errors = x.s.takeErrors(nil)
	x.answer(i, op, r)
	if write != nil {
		write()
	}
}

// tensorData downloads t. Small tensors travel inline. A large one goes
// through the object store, written by write, which the caller runs after
// sending the answer: the answer names the object and its chunk subject,
// so the reader copies the chunks while they are written, in up to pieces
// pieces on the worker's transfer lanes.
func (x *exec) tensorData(t *kernels.Tensor, pieces int) (td *codec.Tensor, write func(), err error) {
	td = &codec.Tensor{DType: t.DType.String(), Shape: t.Shape}
	if td.Shape == nil {
		td.Shape = []int{}
	}
	if t.Bytes() <= x.d.w.cfg.Limits.InlineBytes {
		data := make([]byte, t.Bytes())
		if err := x.d.cfg.Backend.Download(data, t.Buf); err != nil {
			return nil, nil, err
		}
		td.Data = data
		x.io.outInline += uint64(len(data))
		if x.enc == codec.JSON {
			td.Values = finiteValues(t.DType, data)
		}
		return td, nil, nil
	}
	lanes, bucket, err := x.resultLanes(t.Bytes())
	if err != nil {
		return nil, nil, err
	}
	data, give := hostView(t), func() {}
	if data == nil {
		data, give = x.d.hostBuffer(t.Bytes())
		if err := x.d.cfg.Backend.Download(data, t.Buf); err != nil {
			give()
			return nil, nil, err
		}
	}
	td.Object, td.NUID, td.Bucket = "result-"+randomID(), objectstore.NewNUID(), bucket
	x.io.outObject += uint64(len(data))
	meta := map[string]string{"dtype": td.DType, "shape": shapeString(t.Shape)}
	k := lanes.Pieces(len(data), pieces)
	if k > 1 {
		td.Pieces = k
	}
	return td, func() {
		defer give()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var err error
		if k > 1 {
			err = lanes.Put(ctx, td.Object, td.NUID, k, data, meta) // aborts the pieces itself
		} else if _, err = lanes[0].Put(ctx, td.Object, data, meta, objectstore.WithNUID(td.NUID)); err != nil {
			// The reader is following the chunks: tell it why none will come.
			_ = lanes[0].Abort(ctx, td.Object, td.NUID, "store result: "+err.Error())
		}
		if err != nil {
			x.d.w.logf("worker: %s: store result %s: %v", x.d.cfg.Name, td.Object, err)
		}
	}, nil
}

// resultLanes is where a large result of n bytes goes: the results bucket
// (in the broker's memory) for a single-user session, when the result
// takes at most an eighth of it and, if over a 64th, the bucket has room
// for it now (one question to the server, worth it at that size); else
// the session's transfer bucket. bucket names the results bucket, "" for
// the transfer bucket.
func (x *exec) resultLanes(n int) (lanes objectstore.Lanes, bucket string, err error) {
	if r := x.d.w.results; r != nil && x.s.tenant == "" && fits(r[0], int64(n)) {
		return r, r[0].Bucket(), nil
	}
	lanes, err = x.lanes()
	return lanes, "", err
}

// fits says whether a result of n bytes goes to the results bucket s.
func fits(s *objectstore.Store, n int64) bool {
	max := s.MaxBytes()
	switch {
	case max <= 0 || n <= max/64:
		return true
	case n > max/8:
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	free, err := s.Free(ctx)
	return err == nil && (free < 0 || n <= free)
}

// finiteValues returns the elements as numbers if all are finite (JSON
// cannot carry NaN or Inf), else nil.
func finiteValues(dt kernels.DType, data []byte) []float64 {
	v, err := kernels.DecodeValues(dt, data)
	if err != nil {
		return nil
	}
	for _, f := range v {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
	}
	return v
}

func shapeString(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.Itoa(d)
	}
	return strings.Join(parts, ",")
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
