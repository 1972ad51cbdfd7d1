package client_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// program runs the same ops through the fabric and on a local CPU backend.
type program struct {
	t     *testing.T
	r     *rand.Rand
	s     *client.Session
	b     *cpu.Backend
	pool  []*value // f32 tensors, inputs of later ops
	bools []*value // bool tensors, conditions of where
	all   []*value // every tensor made, read back at the end
	ops   int
	kinds map[string]int
}

// value is a tensor on both sides.
type value struct {
	remote *client.Tensor
	local  *kernels.Tensor
	op     string
}

// kernelOp is the worker's translation of a wire op, with its defaults.
func kernelOp(op codec.Op, key uint64) *kernels.Op {
	k := &kernels.Op{
		Name: op.Op, Shape: op.Shape, Axes: op.Axes, Keepdims: op.Keepdims, Perm: op.Perm,
		Axis: op.Axis, Correction: op.Correction,
		Value: op.Value, Start: op.Start, Stop: op.Stop, Step: op.Step,
		Low: op.Low, High: op.High, Mean: op.Mean, Std: op.Std,
		Starts: op.Starts, Ends: op.Ends, Steps: op.Steps, Pads: op.Pads, Sizes: op.Sizes,
		K: op.K, Depth: op.Depth, Eps: op.Eps, P: op.P, Num: op.Num, N: op.N, M: op.M,
		Key: key,
	}
	if op.DType != "" {
		k.DType, _ = kernels.ParseDType(op.DType)
	}
	switch {
	case op.Op == kernels.OpArange && k.Step == 0:
		k.Step = 1
	case (op.Op == kernels.OpLayerNorm || op.Op == kernels.OpRMSNorm) && k.Eps == 0:
		k.Eps = 1e-5
	}
	return k
}

// apply runs op on both sides if Infer accepts it and its outputs are
// small, and returns the outputs (nil if skipped).
func (p *program) apply(op codec.Op, in ...*value) []*value {
	p.t.Helper()
	metas := make([]kernels.Meta, len(in))
	local := make([]*kernels.Tensor, len(in))
	remote := make([]*client.Tensor, len(in))
	for i, v := range in {
		metas[i], local[i], remote[i] = v.local.Meta, v.local, v.remote
	}
	// The worker keys random ops by their first output id, known once the
	// op is queued; attributes that Infer reads do not depend on it.
	outm, err := kernels.Infer(kernelOp(op, 0), metas, kernels.DefaultLimits())
	if err != nil {
		return nil
	}
	for _, m := range outm {
		if m.Numel() > 4096 {
			return nil
		}
	}
	var rts []*client.Tensor
	if len(outm) == 1 {
		rts = []*client.Tensor{p.s.Apply(op, remote...)}
	} else {
		rts = p.s.ApplyN(op, len(outm), remote...)
	}
	kop := kernelOp(op, rts[0].ID())
	outs := make([]*kernels.Tensor, len(outm))
	for i, m := range outm {
		buf, err := p.b.Alloc(m.Bytes())
		if err != nil {
			p.t.Fatal(err)
		}
		outs[i] = &kernels.Tensor{Meta: m, Buf: buf}
	}
	if err := p.b.Exec(kop, local, outs); err != nil {
		p.t.Fatalf("local %s: %v", op.Op, err)
	}
	vals := make([]*value, len(outs))
	for i := range outs {
		vals[i] = &value{remote: rts[i], local: outs[i], op: op.Op}
		p.all = append(p.all, vals[i])
		switch outs[i].DType {
		case kernels.Float32:
			p.pool = append(p.pool, vals[i])
		case kernels.Bool:
			p.bools = append(p.bools, vals[i])
		}
	}
	p.ops++
	p.kinds[op.Op]++
	return vals
}

// upload sends host bytes of dtype and shape to both sides.
func (p *program) upload(dt kernels.DType, shape []int, data []byte) *value {
	p.t.Helper()
	r, err := p.s.Upload(context.Background(), dt.String(), shape, data)
	if err != nil {
		p.t.Fatal(err)
	}
	buf, err := p.b.Alloc(len(data))
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.b.Upload(buf, data); err != nil {
		p.t.Fatal(err)
	}
	v := &value{remote: r, local: &kernels.Tensor{Meta: kernels.Meta{DType: dt, Shape: slices.Clone(shape)}, Buf: buf}, op: "upload"}
	p.all = append(p.all, v)
	p.ops++
	return v
}

func (p *program) randomF32(shape []int) *value {
	data := make([]byte, 4*kernels.Numel(shape))
	for i := range kernels.Numel(shape) {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(p.r.NormFloat64())))
	}
	v := p.upload(kernels.Float32, shape, data)
	p.pool = append(p.pool, v)
	return v
}

// index uploads an i32 or i64 index tensor of shape with values in
// [-n, n).
func (p *program) index(shape []int, n int) *value {
	dt := kernels.Int64
	if p.r.IntN(2) == 0 {
		dt = kernels.Int32
	}
	vals := make([]float64, kernels.Numel(shape))
	for i := range vals {
		if n > 0 {
			vals[i] = float64(p.r.IntN(2*n) - n)
		}
	}
	data, err := kernels.EncodeValues(dt, vals)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.upload(dt, shape, data)
}

// pick draws a pool tensor, favouring recent ones.
func (p *program) pick() *value {
	if p.r.IntN(3) == 0 {
		return p.pool[p.r.IntN(len(p.pool))]
	}
	return p.pool[max(0, len(p.pool)-1-p.r.IntN(min(len(p.pool), 12)))]
}

// sameShape draws a pool tensor of x's shape, or x itself.
func (p *program) sameShape(x *value) *value {
	for range 20 {
		if y := p.pick(); slices.Equal(y.local.Shape, x.local.Shape) {
			return y
		}
	}
	return x
}

func (p *program) axis(r int) int {
	if r == 0 {
		return 0
	}
	return p.r.IntN(2*r) - r
}

func (p *program) axes(r int) []int {
	var a []int
	for d := range r {
		if p.r.IntN(2) == 0 {
			if p.r.IntN(2) == 0 {
				d -= r
			}
			a = append(a, d)
		}
	}
	return a
}

func smallShape(r *rand.Rand) []int {
	shape := make([]int, r.IntN(4))
	for i := range shape {
		shape[i] = r.IntN(5) + 1
	}
	return shape
}

// step emits one random op.
func (p *program) step() {
	x := p.pick()
	shape := x.local.Shape
	rank := len(shape)
	dim := func(axis int) int { return shape[(axis%rank+rank)%rank] }
	switch p.r.IntN(30) {
	case 0, 1:
		p.apply(codec.Op{Op: kernels.Unary[p.r.IntN(len(kernels.Unary))]}, x)
	case 2, 3:
		p.apply(codec.Op{Op: kernels.Binary[p.r.IntN(len(kernels.Binary))]}, x, p.pick())
	case 4:
		p.apply(codec.Op{Op: kernels.Compare[p.r.IntN(len(kernels.Compare))]}, x, p.pick())
		if len(p.bools) > 0 {
			c := p.bools[p.r.IntN(len(p.bools))]
			p.apply(codec.Op{Op: kernels.OpWhere}, c, x, p.pick())
		}
	case 5:
		op := codec.Op{Op: kernels.Reductions[p.r.IntN(len(kernels.Reductions))], Axes: p.axes(rank), Keepdims: p.r.IntN(2) == 0}
		if op.Op == kernels.OpVar {
			op.Correction = p.r.IntN(2)
		}
		p.apply(op, x)
	case 6:
		name := []string{kernels.OpSoftmax, kernels.OpLogSoftmax}[p.r.IntN(2)]
		p.apply(codec.Op{Op: name, Axis: p.axis(rank)}, x)
	case 7:
		p.apply(codec.Op{Op: kernels.OpMatmul}, x, p.pick())
	case 8:
		p.apply(codec.Op{Op: kernels.OpPermute, Perm: p.r.Perm(rank)}, x)
		p.apply(codec.Op{Op: kernels.OpReshape, Shape: []int{-1}}, x)
	case 9:
		to := slices.Clone(shape)
		for i := range to {
			if to[i] == 1 {
				to[i] = p.r.IntN(4) + 1
			}
		}
		if p.r.IntN(2) == 0 {
			to = append([]int{p.r.IntN(3) + 1}, to...)
		}
		p.apply(codec.Op{Op: kernels.OpExpand, Shape: to}, x)
	case 10, 11:
		op := codec.Op{Op: kernels.OpSlice}
		for _, d := range shape {
			op.Starts = append(op.Starts, p.r.IntN(2*d+3)-d-1)
			op.Ends = append(op.Ends, p.r.IntN(2*d+3)-d-1)
			op.Steps = append(op.Steps, []int{1, 2, -1, -2, 3}[p.r.IntN(5)])
		}
		if rank > 0 && p.r.IntN(2) == 0 { // leave trailing axes whole
			k := p.r.IntN(rank)
			op.Starts, op.Ends, op.Steps = op.Starts[:k], op.Ends[:k], op.Steps[:k]
		}
		p.apply(op, x)
	case 12:
		op := codec.Op{Op: kernels.OpPad, Value: p.r.NormFloat64()}
		for range 2 * rank {
			op.Pads = append(op.Pads, p.r.IntN(3))
		}
		p.apply(op, x)
	case 13:
		ins := []*value{x}
		for range p.r.IntN(3) {
			y := p.sameShape(x)
			ins = append(ins, y)
		}
		name := []string{kernels.OpConcat, kernels.OpStack}[p.r.IntN(2)]
		p.apply(codec.Op{Op: name, Axis: p.axis(rank + 1)}, ins...)
	case 14:
		if rank == 0 {
			return
		}
		axis := p.axis(rank)
		var sizes []int
		for left := dim(axis); left > 0; {
			n := p.r.IntN(left) + 1
			sizes = append(sizes, n)
			left -= n
		}
		if len(sizes) == 0 {
			sizes = []int{0}
		}
		p.apply(codec.Op{Op: kernels.OpSplit, Axis: axis, Sizes: sizes}, x)
	case 15:
		p.apply(codec.Op{Op: kernels.OpFlip, Axes: p.axes(rank)}, x)
		p.apply(codec.Op{Op: kernels.OpSqueeze}, x)
	case 16:
		p.apply(codec.Op{Op: kernels.OpUnsqueeze, Axes: []int{p.axis(rank + 1)}}, x)
	case 17:
		if rank == 0 {
			return
		}
		axis := p.axis(rank)
		if dim(axis) == 0 {
			return
		}
		idx := slices.Clone(shape)
		for i := range idx {
			idx[i] = p.r.IntN(idx[i] + 1)
		}
		idx[(axis+rank)%rank] = p.r.IntN(5)
		ix := p.index(idx, dim(axis))
		p.apply(codec.Op{Op: kernels.OpGather, Axis: axis}, x, ix)
		src := p.randomF32(idx)
		p.apply(codec.Op{Op: kernels.OpScatterAdd, Axis: axis}, x, ix, src)
	case 18:
		if rank == 0 {
			return
		}
		axis := p.axis(rank)
		if dim(axis) == 0 {
			return
		}
		p.apply(codec.Op{Op: kernels.OpIndexSelect, Axis: axis}, x, p.index([]int{p.r.IntN(6)}, dim(axis)))
	case 19:
		depth := p.r.IntN(5) + 1
		p.apply(codec.Op{Op: kernels.OpOneHot, Depth: depth, DType: "f32"}, p.index(smallShape(p.r), depth))
	case 20:
		name := []string{kernels.OpTril, kernels.OpTriu}[p.r.IntN(2)]
		p.apply(codec.Op{Op: name, K: p.r.IntN(7) - 3}, x)
	case 21, 22:
		if rank == 0 {
			return
		}
		name := []string{kernels.OpLayerNorm, kernels.OpRMSNorm}[p.r.IntN(2)]
		k := p.r.IntN(rank) + 1
		op := codec.Op{Op: name, Eps: []float64{0, 1e-3, 1e-6}[p.r.IntN(3)]}
		if p.r.IntN(2) == 0 {
			for i := range k {
				op.Axes = append(op.Axes, i-k)
			}
		} else {
			k = 1
		}
		ins := []*value{x}
		for range p.r.IntN(3) {
			ins = append(ins, p.randomF32(shape[rank-k:]))
		}
		p.apply(op, ins...)
	case 23:
		sh := smallShape(p.r)
		switch p.r.IntN(5) {
		case 0:
			p.apply(codec.Op{Op: kernels.OpZeros, Shape: sh})
		case 1:
			p.apply(codec.Op{Op: kernels.OpOnes, Shape: sh, DType: "f32"})
		case 2:
			p.apply(codec.Op{Op: kernels.OpLinspace, Start: p.r.NormFloat64(), Stop: p.r.NormFloat64() * 10, Num: p.r.IntN(20)})
		case 3:
			p.apply(codec.Op{Op: kernels.OpEye, N: p.r.IntN(6), M: p.r.IntN(6), K: p.r.IntN(5) - 2})
		case 4:
			p.apply(codec.Op{Op: kernels.OpBernoulli, Shape: sh, P: p.r.Float64()})
		}
	case 24:
		sh := smallShape(p.r)
		switch p.r.IntN(4) {
		case 0:
			p.apply(codec.Op{Op: kernels.OpFull, Shape: sh, Value: p.r.NormFloat64()})
		case 1:
			p.apply(codec.Op{Op: kernels.OpArange, Start: -2, Stop: float64(p.r.IntN(20)), Step: 0.5})
		case 2:
			p.apply(codec.Op{Op: kernels.OpUniform, Shape: sh, Low: -1, High: 2})
		case 3:
			p.apply(codec.Op{Op: kernels.OpNormal, Shape: sh, Mean: 0.5, Std: 2})
		}
	case 25:
		p.apply(codec.Op{Op: kernels.OpClamp}, x, p.pick(), p.pick())
		p.apply(codec.Op{Op: kernels.OpIsNaN}, x)
	case 26:
		y := p.apply(codec.Op{Op: kernels.OpCast, DType: []string{"f16", "bf16", "f64", "i32"}[p.r.IntN(4)]}, x)
		if y != nil {
			p.apply(codec.Op{Op: kernels.OpCast, DType: "f32"}, y[0])
		}
	default:
		p.randomF32(smallShape(p.r))
	}
}

// TestRandomProgram sends a random program of 1,000 ops or more over small f32
// tensors through client, broker and worker, runs the same program on a
// local CPU backend, and compares every tensor bit for bit.
func TestRandomProgram(t *testing.T) {
	_, c := devices(t, 1)
	s := open(t, c, "cpu-0")
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	p := &program{t: t, r: rand.New(rand.NewPCG(seed, 1)), s: s, b: cpu.New(), kinds: map[string]int{}}
	for range 6 {
		p.randomF32(smallShape(p.r))
	}
	// At least 1,000 ops, and on until every op below has been drawn
	// (a rare seed draws none of one of them in the first 1,000).
	wanted := append(slices.Clone(kernels.Movement), kernels.OpScatterAdd, kernels.OpOneHot, kernels.OpLayerNorm, kernels.OpRMSNorm)
	missing := func() bool {
		return slices.ContainsFunc(wanted, func(name string) bool { return p.kinds[name] == 0 })
	}
	for tries := 0; (p.ops < 1000 || missing()) && tries < 100000; tries++ {
		p.step()
	}
	if p.ops < 1000 {
		t.Fatalf("only %d ops in the program", p.ops)
	}
	for _, name := range wanted {
		if p.kinds[name] == 0 {
			t.Errorf("the program has no %s", name)
		}
	}
	ctx := context.Background()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for i, v := range p.all {
		got, err := v.remote.Read(ctx)
		if err != nil {
			t.Fatalf("tensor %d (%s): %v", i, v.op, err)
		}
		want := make([]byte, v.local.Bytes())
		if err := p.b.Download(want, v.local.Buf); err != nil {
			t.Fatal(err)
		}
		if got.DType != v.local.DType.String() || !slices.Equal(got.Shape, v.local.Shape) || !bytes.Equal(got.Bytes, want) {
			t.Fatalf("tensor %d (%s): got %s %v, want %v %v; bytes differ: %v", i, v.op,
				got.DType, got.Shape, v.local.DType, v.local.Shape, !bytes.Equal(got.Bytes, want))
		}
	}
	t.Logf("%d ops, %d tensors compared: %v", p.ops, len(p.all), p.kinds)
}
