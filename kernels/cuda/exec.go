//go:build cgo && linux

package cuda

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Exec queues op. It checks the metas with kernels.Infer and the buffers'
// sizes; unsupported dtype combinations return kernels.ErrNotImplemented.
func (b *Backend) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	return b.do(func() error { return b.exec(op, in, out) })
}

// ExecFused queues a fused group as one kernel: elementwise ops (unary,
// binary with broadcasting, cast), optionally ending in one reduction
// whose result no op of the group reads. Values not named in g.Results are
// computed in registers and never stored. Groups of any other form return
// kernels.ErrNotImplemented: run their ops one by one.
func (b *Backend) ExecFused(g *kernels.FusedGroup, in, out []*kernels.Tensor) error {
	return b.do(func() error {
		if err := checkNil("fused group", in, out); err != nil {
			return err
		}
		vals, err := kernels.InferFused(g, metas(in), noLimits)
		if err != nil {
			return err
		}
		want := make([]kernels.Meta, len(g.Results))
		for k, r := range g.Results {
			want[k] = vals[r]
		}
		inB, outB, err := b.tensors("fused group", in, out, want)
		if err != nil {
			return err
		}
		p, err := planGroup(g, vals, b.sms)
		if err != nil {
			return err
		}
		return b.runPlan(p, inB, outB)
	})
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
	case isElementwise(name) || isReduction(name):
		args := make([]int, len(in))
		for i := range args {
			args[i] = i
		}
		g := &kernels.FusedGroup{Inputs: len(in), Ops: []kernels.FusedOp{{Op: *op, Args: args}}, Results: []int{len(in)}}
		p, err := planGroup(g, append(inM, want[0]), b.sms)
		if err != nil {
			return err
		}
		return b.runPlan(p, inB, outB)
	case name == kernels.OpPermute:
		if tp := planTranspose(inM[0], op.Perm, want[0]); tp != nil {
			return b.runTranspose(tp, inB[0], outB[0])
		}
		return b.runPlan(planPermute(inM[0], op.Perm, want[0]), inB, outB)
	case name == kernels.OpReshape:
		if n := want[0].Bytes(); n > 0 && inB[0].ptr != outB[0].ptr {
			return memcpyDtoD(outB[0].ptr, inB[0].ptr, n, b.stream)
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
// written by the same thread.
func (p *ewPlan) aliasSafe(ptr uint64, leafPtr []uint64) bool {
	for j, q := range leafPtr {
		if q == ptr && (p.spec.red != nil || p.spec.rank != 0 || p.spec.leaves[j].kind != leafFull) {
			return false
		}
	}
	return true
}

// runPlan queues a planned elementwise or reduction kernel.
func (b *Backend) runPlan(p *ewPlan, inB, outB []*buffer) error {
	if (p.spec.red == nil && p.n == 0) || (p.spec.red != nil && p.O == 0) {
		return nil
	}
	f, err := b.function(p.spec.key(), p.spec.source)
	if err != nil {
		return err
	}
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
	if err := launch(f, p.grid, p.block, b.stream, &a); err != nil {
		return err
	}
	if partB != nil {
		rd := p.spec.red
		ff, err := b.function(finalKey(rd, p.spec.idx64), func() (string, error) {
			return finalSource(rd, p.spec.idx64), nil
		})
		if err != nil {
			return err
		}
		var fa kargs
		fa.ptr(part)
		fa.ptr(rout)
		fa.idx(p.O, p.spec.idx64)
		fa.idx(p.P, p.spec.idx64)
		fa.idx(p.R, p.spec.idx64)
		if err := launch(ff, [3]uint32{uint32(ceilDiv(p.O, blockSize)), 1, 1}, blockSize, b.stream, &fa); err != nil {
			return err
		}
	}
	for _, x := range fix {
		if err := memcpyDtoD(x.dst.ptr, x.tmp.ptr, x.dst.n, b.stream); err != nil {
			return err
		}
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
	if err := launch(f, p.grid, 256, b.stream, &a); err != nil {
		return err
	}
	if dst != out {
		return memcpyDtoD(out.ptr, dst.ptr, out.n, b.stream)
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
	return launch(f, [3]uint32{uint32(ceilDiv(n, blockSize)), 1, 1}, blockSize, b.stream, &a)
}
