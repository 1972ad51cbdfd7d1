//go:build cgo && linux

package cuda

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Exec queues op. It runs on the caller's goroutine: it checks the metas
// with kernels.Infer and the buffers' sizes, plans the kernels, compiles
// and loads those not loaded yet, takes scratch memory, and queues the
// device calls for the device thread without waiting for them. Everything
// that depends on the op and its inputs fails here: unsupported dtype
// combinations return kernels.ErrNotImplemented; gather, index_select,
// one_hot, scatter_add and cross_entropy wait for their launch and return
// kernels.ErrIndex. A device call that the driver rejects once queued (in
// practice a broken context) is reported by the next Sync, Download or
// index-checking op as an *AsyncError naming op.
func (b *Backend) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	// The caller reuses op once Exec returns (kernels.Backend): nothing
	// queued refers to it, only to values taken from it.
	return b.queue(op.Name, func() error { return b.exec(op, in, out) })
}

// ExecFused queues a fused group as one kernel: elementwise ops (unary,
// binary with broadcasting, cast), optionally ending in one reduction
// whose result no op of the group reads. Values not named in g.Results are
// computed in registers and never stored. Groups of any other form return
// kernels.ErrNotImplemented: run their ops one by one. Like Exec, it
// returns once the kernel is queued.
func (b *Backend) ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	return b.queue("fused group", func() error {
		b.flushChain()
		if err := checkNil("fused group", in, out); err != nil {
			return err
		}
		key := b.groupKey(g, in)
		c, ok := b.plans[string(key)]
		if !ok {
			vals, err := kernels.InferFused(g, metas(in), noLimits)
			if err != nil {
				return err
			}
			want := make([]kernels.Meta, len(g.Results))
			for k, r := range g.Results {
				want[k] = vals[r]
			}
			p, err := planGroup(g, vals, b.sms)
			if err != nil {
				return err
			}
			fns, err := b.planFunctions(p)
			if err != nil {
				return err
			}
			c = &planned{want: want, p: p, fns: fns}
			b.keepPlan(key, c)
		}
		inB, outB, err := b.tensors("fused group", in, out, c.want)
		if err != nil {
			return err
		}
		return b.launchPlan(c.p, c.fns, inB, outB)
	})
}

// groupKey names what a fused group's plan depends on, as planKey does
// an op's: each op's kind and attributes and where its arguments come
// from, the values kept, and the inputs' metas. The key is in b.keyBuf,
// valid until the next call.
func (b *Backend) groupKey(g *kernels.FusedGroup, in []*kernels.Tensor) []byte {
	k := append(b.keyBuf[:0], 0xFF) // no op name starts so
	k = binary.AppendUvarint(k, uint64(g.Inputs))
	for i := range g.Ops {
		k = appendOpKey(k, &g.Ops[i].Op)
		k = binary.AppendUvarint(k, uint64(len(g.Ops[i].Args)))
		for _, a := range g.Ops[i].Args {
			k = binary.AppendVarint(k, int64(a))
		}
	}
	k = binary.AppendUvarint(k, uint64(len(g.Results)))
	for _, r := range g.Results {
		k = binary.AppendVarint(k, int64(r))
	}
	k = appendMetas(k, in)
	b.keyBuf = k
	return k
}

// maxQueued bounds the items waiting for the device thread: past it, a
// caller waits for the thread to take them.
const maxQueued = 4096

// queue runs plan, which records the device calls of op (see record),
// and queues them as one item; if plan fails, nothing it recorded runs.
// The caller holds mu.
func (b *Backend) queue(op string, plan func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cuda: internal error: %s: %v", op, p)
		}
		if err != nil {
			b.rec = nil
		}
	}()
	if err := plan(); err != nil {
		return err
	}
	b.pushRun(op)
	return nil
}

// pushRun queues the device calls recorded so far as op's.
func (b *Backend) pushRun(op string) {
	if len(b.rec) == 0 {
		return
	}
	for b.qn.Load() >= maxQueued {
		runtime.Gosched()
	}
	if r := b.recording; r != nil {
		r.body = append(r.body, item{run: b.rec, op: op})
	}
	b.push(item{run: b.rec, op: op})
	b.rec = nil
}

// record adds a device call to the Exec in progress; it runs on the
// device thread after everything queued before it.
func (b *Backend) record(f func() error) { b.rec = append(b.rec, f) }

// queueLaunch records a kernel launch on the stream; a is not changed
// afterwards.
func (b *Backend) queueLaunch(f cuFunction, grid [3]uint32, block uint32, a *kargs) {
	s := b.stream
	b.record(func() error { return launch(f, grid, block, s, a) })
}

// queueCopy records a copy of n bytes from src to dst on the stream.
func (b *Backend) queueCopy(dst, src uint64, n int) {
	s := b.stream
	b.record(func() error { return memcpyDtoD(dst, src, n, s) })
}

// queueMemset records setting n bytes at dst to v on the stream.
func (b *Backend) queueMemset(dst uint64, v byte, n int) {
	s := b.stream
	b.record(func() error { return memsetD8(dst, v, n, s) })
}

// queueGemm records a cuBLAS product on h (bound to the stream).
func (b *Backend) queueGemm(h blasHandle, g gemmArgs) {
	b.record(func() error { return gemm(h, &g) })
}

// blasHandle returns the cuBLAS handle, made on the device thread on
// first use.
func (b *Backend) blasHandle() (blasHandle, error) {
	if !b.blas.tried {
		_ = b.call(func() error {
			_, _ = b.blas.handle(b)
			return nil
		})
	}
	return b.blas.h, b.blas.err
}

// checkNil rejects nil tensors, which Infer would dereference.
func checkNil(name string, ts ...[]*kernels.Tensor) error {
	for _, l := range ts {
		for i, t := range l {
			if t == nil {
				return fmt.Errorf("%w: %s: tensor %d is nil", kernels.ErrArity, name, i)
			}
		}
	}
	return nil
}

func metas(ts []*kernels.Tensor) []kernels.Meta {
	m := make([]kernels.Meta, len(ts))
	for i, t := range ts {
		m[i] = t.Meta
	}
	return m
}

// tensors checks inputs and outputs against their metas and returns
// their buffers.
func (b *Backend) tensors(name string, in, out []*kernels.Tensor, want []kernels.Meta) (inB, outB []*buffer, err error) {
	return b.tensorsInto(nil, nil, name, in, out, want)
}

// tensorsInto is tensors appending to inB and outB.
func (b *Backend) tensorsInto(inB, outB []*buffer, name string, in, out []*kernels.Tensor, want []kernels.Meta) ([]*buffer, []*buffer, error) {
	if len(out) != len(want) {
		return nil, nil, fmt.Errorf("%w: %s has %d outputs, got %d", kernels.ErrArity, name, len(want), len(out))
	}
	for i, t := range in {
		d, err := b.own(t.Buf, t.Bytes())
		if err != nil {
			return nil, nil, fmt.Errorf("%s input %d: %w", name, i, err)
		}
		inB = append(inB, d)
	}
	for i, t := range out {
		if t.DType != want[i].DType || !slices.Equal(t.Shape, want[i].Shape) {
			return nil, nil, fmt.Errorf("%w: %s output %d is %v%v, want %v%v", kernels.ErrShape, name, i, t.DType, t.Shape, want[i].DType, want[i].Shape)
		}
		d, err := b.own(t.Buf, t.Bytes())
		if err != nil {
			return nil, nil, fmt.Errorf("%s output %d: %w", name, i, err)
		}
		outB = append(outB, d)
	}
	return inB, outB, nil
}

func (b *Backend) exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkNil(op.Name, in, out); err != nil {
		return err
	}
	if pointwise[op.Name] {
		return b.execPlanned(op, in, out)
	}
	b.flushChain()
	inM := metas(in)
	want, err := kernels.Infer(op, inM, noLimits)
	if err != nil {
		return err
	}
	inB, outB, err := b.tensors(op.Name, in, out, want)
	if err != nil {
		return err
	}
	switch name := op.Name; {
	case name == kernels.OpPermute:
		if tp := planTranspose(inM[0], op.Perm, want[0]); tp != nil {
			return b.runTranspose(tp, inB[0], outB[0])
		}
		return b.runPlan(planPermute(inM[0], op.Perm, want[0]), inB, outB)
	case name == kernels.OpReshape:
		if n := want[0].Bytes(); n > 0 && inB[0].ptr != outB[0].ptr {
			b.queueCopy(outB[0].ptr, inB[0].ptr, n)
			return nil
		}
		return nil
	case name == kernels.OpFull || name == kernels.OpArange || name == kernels.OpUniform || name == kernels.OpNormal:
		return b.generate(op, want[0], outB[0])
	case name == "softmax" || name == "log_softmax":
		return b.softmax(op, inM[0], inB[0], outB[0])
	case name == kernels.OpMatmul:
		return b.matmul(inM, want[0], inB, outB[0])
	case isMovement(name) || isIndexing(name) || name == kernels.OpLayerNorm || name == kernels.OpRMSNorm:
		return b.movement(op, inM, want, inB, outB)
	case isNN(name):
		return b.nn(op, inM, want[0], inB, outB[0])
	case name == kernels.OpAdamStep || name == kernels.OpSGDStep:
		return b.optimStep(op, inM, inB, outB)
	}
	return fmt.Errorf("%w: %s", kernels.ErrNotImplemented, op.Name)
}

// aliasSafe reports whether output k may share memory with the leaves it
// overlaps: only in the linear kernel, where each element is read and
// written by the same thread (a scalar leaf is read by every thread: only
// where there is one element).
func (p *ewPlan) aliasSafe(ptr uint64, leafPtr []uint64) bool {
	for j, q := range leafPtr {
		if q != ptr {
			continue
		}
		switch k := p.spec.leaves[j].kind; {
		case p.spec.red != nil || p.spec.rank != 0:
			return false
		case k == leafFull, k == leafScalar && p.n == 1:
		default:
			return false
		}
	}
	return true
}

// pointwise are the ops run by one generated elementwise or reduction
// kernel (see execPlanned).
var pointwise = func() map[string]bool {
	m := map[string]bool{}
	for _, l := range [][]string{elementwiseOps, reductionOps, kernels.Unary, kernels.Binary} {
		for _, name := range l {
			m[name] = true
		}
	}
	return m
}()

// planFns are the kernels of a plan: its own and, for a reduction in
// several passes, the final pass.
type planFns struct{ f, fin cuFunction }

// planned is an op's plan, kept for the next op of the same kind on
// inputs of the same metas.
type planned struct {
	want []kernels.Meta
	p    *ewPlan
	fns  planFns
}

// maxPlans bounds the plans kept; past it they are all dropped.
const maxPlans = 4096

// planKey names what an elementwise op's or a reduction's plan depends
// on: the op, the attributes Infer and planGroup read, and the inputs'
// metas. The key is in b.keyBuf, valid until the next call.
func (b *Backend) planKey(op *kernels.Op, in []*kernels.Tensor) []byte {
	k := appendOpKey(b.keyBuf[:0], op)
	k = appendMetas(k, in)
	b.keyBuf = k
	return k
}

// appendOpKey appends the op's kind and the attributes that Infer and
// planGroup read for an elementwise op or a reduction.
func appendOpKey(k []byte, op *kernels.Op) []byte {
	k = append(k, op.Name...)
	k = append(k, 0, byte(op.DType))
	if op.Keepdims {
		k = append(k, 1)
	} else {
		k = append(k, 0)
	}
	k = binary.AppendVarint(k, int64(op.Correction))
	k = binary.AppendUvarint(k, uint64(len(op.Axes)))
	for _, a := range op.Axes {
		k = binary.AppendVarint(k, int64(a))
	}
	return k
}

// appendMetas appends the tensors' dtypes and shapes.
func appendMetas(k []byte, ts []*kernels.Tensor) []byte {
	for _, t := range ts {
		k = append(k, byte(t.DType))
		k = binary.AppendUvarint(k, uint64(len(t.Shape)))
		for _, d := range t.Shape {
			k = binary.AppendVarint(k, int64(d))
		}
	}
	return k
}

// execPlanned queues an elementwise op or a reduction, planned once for
// each kind of op and inputs' metas.
func (b *Backend) execPlanned(op *kernels.Op, in, out []*kernels.Tensor) error {
	key := b.planKey(op, in)
	c, ok := b.plans[string(key)]
	if !ok {
		inM := metas(in)
		want, err := kernels.Infer(op, inM, noLimits)
		if err != nil {
			return err
		}
		args := make([]int, len(in))
		for i := range args {
			args[i] = i
		}
		g := &kernels.FusedGroup{Inputs: len(in), Ops: []kernels.FusedOp{{Op: *op, Args: args}}, Results: []int{len(in)}}
		p, err := planGroup(g, append(inM, want[0]), b.sms)
		if err != nil {
			return err
		}
		fns, err := b.planFunctions(p)
		if err != nil {
			return err
		}
		c = &planned{want: want, p: p, fns: fns}
		b.keepPlan(key, c)
	}
	// The buffers in arrays of the caller's frame: the chain copies what
	// it keeps, so an op costs no allocation here.
	var inA, outA [4]*buffer
	inB, outB, err := b.tensorsInto(inA[:0], outA[:0], op.Name, in, out, c.want)
	if err != nil {
		return err
	}
	if b.chainAdd(op.Name, c, in, inB, outB[0]) {
		return nil
	}
	return b.launchPlan(c.p, c.fns, inB, outB)
}

// keepPlan keeps c under key, dropping every plan kept when there are
// maxPlans.
func (b *Backend) keepPlan(key []byte, c *planned) {
	if len(b.plans) >= maxPlans {
		clear(b.plans)
	}
	b.plans[string(key)] = c
}

// empty reports whether p has no work.
func (p *ewPlan) empty() bool {
	return (p.spec.red == nil && p.n == 0) || (p.spec.red != nil && p.O == 0)
}

// planFunctions compiles or finds the kernels of p (none for an empty
// plan).
func (b *Backend) planFunctions(p *ewPlan) (planFns, error) {
	var fns planFns
	if p.empty() {
		return fns, nil
	}
	var err error
	if fns.f, err = b.function(p.spec.key(), p.spec.source); err != nil {
		return fns, err
	}
	if rd := p.spec.red; rd != nil && p.P > 1 {
		fns.fin, err = b.function(finalKey(rd, p.spec.idx64), func() (string, error) {
			return finalSource(rd, p.spec.idx64), nil
		})
	}
	return fns, err
}

// runPlan queues a planned elementwise or reduction kernel.
func (b *Backend) runPlan(p *ewPlan, inB, outB []*buffer) error {
	fns, err := b.planFunctions(p)
	if err != nil {
		return err
	}
	return b.launchPlan(p, fns, inB, outB)
}

// launchPlan queues p with its kernels fns.
func (b *Backend) launchPlan(p *ewPlan, fns planFns, inB, outB []*buffer) error {
	if p.empty() {
		return nil
	}
	var err error
	leafPtr := make([]uint64, len(p.leafIn))
	for j, i := range p.leafIn {
		leafPtr[j] = inB[i].ptr
	}
	// Outputs that overlap an input unsafely are computed into scratch
	// buffers and copied afterwards.
	var fix []struct {
		dst, tmp *buffer
	}
	defer func() {
		for _, x := range fix {
			b.free(x.tmp)
		}
	}()
	dst := func(k int) (uint64, error) {
		d := outB[k]
		if p.aliasSafe(d.ptr, leafPtr) {
			return d.ptr, nil
		}
		tmp, err := b.alloc(d.n)
		if err != nil {
			return 0, err
		}
		fix = append(fix, struct{ dst, tmp *buffer }{d, tmp})
		return tmp.ptr, nil
	}
	outPtr := make([]uint64, len(p.outIdx))
	for k, i := range p.outIdx {
		if outPtr[k], err = dst(i); err != nil {
			return err
		}
	}
	var rout, part uint64
	var partB *buffer
	if p.spec.red != nil {
		if rout, err = dst(p.redOut); err != nil {
			return err
		}
		if p.P > 1 {
			if partB, err = b.alloc(p.O * p.P * accSize(p.spec.red.op, p.spec.red.dt)); err != nil {
				return err
			}
			defer b.free(partB)
			part = partB.ptr
		}
	}
	var a kargs
	p.args(&a, leafPtr, outPtr, rout, part)
	b.queueLaunch(fns.f, p.grid, p.block, &a)
	if partB != nil {
		var fa kargs
		fa.ptr(part)
		fa.ptr(rout)
		fa.idx(p.O, p.spec.idx64)
		fa.idx(p.P, p.spec.idx64)
		fa.idx(p.R, p.spec.idx64)
		b.queueLaunch(fns.fin, [3]uint32{uint32(ceilDiv(p.O, blockSize)), 1, 1}, blockSize, &fa)
	}
	for _, x := range fix {
		b.queueCopy(x.dst.ptr, x.tmp.ptr, x.dst.n)
	}
	return nil
}

// runTranspose queues a tiled transpose; into its own input it goes
// through scratch memory.
func (b *Backend) runTranspose(p *transposePlan, in, out *buffer) error {
	f, err := b.function(p.spec.key(), func() (string, error) { return p.spec.source(), nil })
	if err != nil {
		return err
	}
	dst := out
	if in.ptr == out.ptr {
		if dst, err = b.alloc(out.n); err != nil {
			return err
		}
		defer b.free(dst)
	}
	var a kargs
	p.args(&a, in.ptr, dst.ptr)
	b.queueLaunch(f, p.grid, 256, &a)
	if dst != out {
		b.queueCopy(out.ptr, dst.ptr, out.n)
		return nil
	}
	return nil
}

// softmax queues softmax or log_softmax over op.Axis: a logsumexp of each
// slice, kept in float64, then one elementwise pass.
func (b *Backend) softmax(op *kernels.Op, x kernels.Meta, xb, yb *buffer) error {
	if x.Numel() == 0 {
		return nil
	}
	rp, ap, lbytes, err := planSoftmax(op, x, b.sms)
	if err != nil {
		return err
	}
	lb, err := b.alloc(lbytes)
	if err != nil {
		return err
	}
	defer b.free(lb)
	if err := b.runPlan(rp, []*buffer{xb}, []*buffer{lb}); err != nil {
		return err
	}
	return b.runPlan(ap, []*buffer{xb, lb}, []*buffer{yb})
}

// generate queues full, arange, uniform, normal, linspace, eye or
// bernoulli.
func (b *Backend) generate(op *kernels.Op, m kernels.Meta, out *buffer) error {
	n := m.Numel()
	if n == 0 {
		return nil
	}
	g := genSpec{op: op.Name, dt: m.DType, idx64: n > idx32Max}
	f, err := b.function(g.key(), func() (string, error) { return g.source(), nil })
	if err != nil {
		return err
	}
	var x, y float64
	var hk uint64
	switch op.Name {
	case kernels.OpFull:
		x = op.Value
	case kernels.OpArange:
		x, y = op.Start, op.Step
	case kernels.OpUniform:
		x, y, hk = op.Low, op.High, randomKey(op.Seed, op.Key)
	case kernels.OpNormal:
		x, y, hk = op.Mean, op.Std, randomKey(op.Seed, op.Key)
	case kernels.OpLinspace:
		x, y = op.Start, op.Stop
	case kernels.OpEye:
		x, y = float64(m.Shape[1]), float64(max(-m.Shape[0]-1, min(op.K, m.Shape[1]+1)))
	case kernels.OpBernoulli:
		x, hk = op.P, randomKey(op.Seed, op.Key)
	}
	var a kargs
	a.ptr(out.ptr)
	a.idx(n, g.idx64)
	a.f64(x)
	a.f64(y)
	a.u64(hk)
	b.queueLaunch(f, [3]uint32{uint32(ceilDiv(n, blockSize)), 1, 1}, blockSize, &a)
	return nil
}
