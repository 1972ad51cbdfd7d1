package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Planning turns an op or a fused group into a generated kernel (ewSpec)
// and its launch: which tensors go where, the collapsed dims and strides,
// and the grid. It is pure Go, so it is tested without a GPU.

// noLimits: Exec re-checks metas that the caller already checked against
// its own limits.
var noLimits = kernels.Limits{}

// idx32Max bounds the domains indexed with 32-bit arithmetic.
const idx32Max = math.MaxInt32 - 1<<20

func isElementwise(name string) bool {
	return slices.Contains(elementwiseOps, name) || slices.Contains(kernels.Unary, name) || slices.Contains(kernels.Binary, name)
}

func isReduction(name string) bool { return slices.Contains(reductionOps, name) }

// ewPlan is a planned elementwise or reduction kernel.
type ewPlan struct {
	spec   ewSpec
	leafIn []int // group input of each leaf
	outIdx []int // group output of each spec.outs entry
	redOut int   // group output of the reduction, if any
	n      int   // domain elements
	grid   [3]uint32
	block  uint32

	// strided kernel
	dims    []int
	strides [][]int // per strided leaf, in leaf order

	// reduction
	O, R, P, chunk int
	kdims, rdims   []int
	opStrides      [][]int // per operand (non-scalar leaves, then outs): kept then reduced
}

// planGroup plans a fused group whose values have metas vals (from
// kernels.InferFused). sms is the device's multiprocessor count.
func planGroup(g *kernels.FusedGroup, vals []kernels.Meta, sms int) (*ewPlan, error) {
	nin := g.Inputs
	// Values that some result depends on.
	live := make([]bool, len(vals))
	for _, r := range g.Results {
		live[r] = true
	}
	for i := len(g.Ops) - 1; i >= 0; i-- {
		if live[nin+i] {
			for _, a := range g.Ops[i].Args {
				live[a] = true
			}
		}
	}
	red := -1
	for i := range g.Ops {
		v := nin + i
		if !live[v] {
			continue
		}
		name := g.Ops[i].Op.Name
		switch {
		case isElementwise(name):
		case isReduction(name):
			if red >= 0 {
				return nil, fmt.Errorf("%w: fused group with more than one reduction", kernels.ErrNotImplemented)
			}
			red = v
		default:
			return nil, fmt.Errorf("%w: %s in a fused group", kernels.ErrNotImplemented, name)
		}
	}
	if red >= 0 {
		for i := range g.Ops {
			if live[nin+i] && slices.Contains(g.Ops[i].Args, red) {
				return nil, fmt.Errorf("%w: fused group reads a reduction's result", kernels.ErrNotImplemented)
			}
		}
	}
	var domain []int
	if red >= 0 {
		domain = vals[g.Ops[red-nin].Args[0]].Shape
	} else {
		domain = vals[g.Results[0]].Shape
	}
	p := &ewPlan{redOut: -1, n: kernels.Numel(domain)}
	s := &p.spec
	// Leaves, nodes and outputs, renumbered.
	id := make([]int, len(vals))
	for v := range nin {
		if live[v] {
			id[v] = len(s.leaves)
			s.leaves = append(s.leaves, ewLeaf{dt: vals[v].DType})
			p.leafIn = append(p.leafIn, v)
		}
	}
	for i := range g.Ops {
		v := nin + i
		if !live[v] || v == red {
			continue
		}
		n := ewNode{op: g.Ops[i].Op.Name, dt: vals[v].DType}
		for _, a := range g.Ops[i].Args {
			n.args = append(n.args, id[a])
		}
		id[v] = len(s.leaves) + len(s.nodes)
		s.nodes = append(s.nodes, n)
	}
	for k, r := range g.Results {
		if r == red {
			p.redOut = k
			continue
		}
		if !slices.Equal(vals[r].Shape, domain) {
			return nil, fmt.Errorf("%w: fused group result of shape %v in a domain of shape %v", kernels.ErrNotImplemented, vals[r].Shape, domain)
		}
		s.outs = append(s.outs, id[r])
		p.outIdx = append(p.outIdx, k)
	}
	// Strides of every leaf over the domain.
	leafStrides := make([][]int, len(s.leaves))
	for j, v := range p.leafIn {
		st, err := broadcastStrides(vals[v].Shape, domain)
		if err != nil {
			return nil, err
		}
		leafStrides[j] = st
	}
	if red >= 0 {
		op := &g.Ops[red-nin].Op
		axes, err := kernels.NormAxes(op.Axes, len(domain))
		if err != nil {
			return nil, err
		}
		arg := g.Ops[red-nin].Args[0]
		s.red = &redSpec{op: op.Name, dt: vals[arg].DType, out: vals[red].DType, corr: op.Correction, value: id[arg]}
		p.planReduce(domain, axes, leafStrides, sms)
		return p, nil
	}
	p.planElementwise(domain, leafStrides)
	return p, nil
}

// broadcastStrides are the element strides of a contiguous tensor of
// shape src read as shape dst (numpy broadcasting: 0 on broadcast dims).
func broadcastStrides(src, dst []int) ([]int, error) {
	if len(src) > len(dst) {
		return nil, fmt.Errorf("%w: %v does not broadcast to %v", kernels.ErrShape, src, dst)
	}
	st := make([]int, len(dst))
	acc := 1
	for i := len(dst) - 1; i >= 0; i-- {
		j := i - (len(dst) - len(src))
		if j < 0 {
			continue
		}
		switch src[j] {
		case dst[i]:
			if dst[i] != 1 {
				st[i] = acc
			}
		case 1:
		default:
			return nil, fmt.Errorf("%w: %v does not broadcast to %v", kernels.ErrShape, src, dst)
		}
		acc *= src[j]
	}
	return st, nil
}

func contiguousStrides(shape []int) []int {
	st := make([]int, len(shape))
	acc := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return st
}

// collapse drops unit dims and merges neighbours that every operand walks
// as one: stride[k] == stride[k+1]*dim[k+1].
func collapse(dims []int, strides [][]int) ([]int, [][]int) {
	var od []int
	os := make([][]int, len(strides))
	for d, n := range dims {
		if n == 1 {
			continue
		}
		if len(od) > 0 {
			merge := true
			for j := range strides {
				if os[j][len(os[j])-1] != strides[j][d]*n {
					merge = false
					break
				}
			}
			if merge {
				od[len(od)-1] *= n
				for j := range strides {
					os[j][len(os[j])-1] = strides[j][d]
				}
				continue
			}
		}
		od = append(od, n)
		for j := range strides {
			os[j] = append(os[j], strides[j][d])
		}
	}
	return od, os
}

func allZero(s []int) bool {
	for _, x := range s {
		if x != 0 {
			return false
		}
	}
	return true
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func (p *ewPlan) planElementwise(domain []int, leafStrides [][]int) {
	s := &p.spec
	s.idx64 = p.n > idx32Max
	dims, st := collapse(domain, leafStrides)
	contig := contiguousStrides(dims)
	strided := false
	for j := range s.leaves {
		switch {
		case allZero(st[j]):
			s.leaves[j].kind = leafScalar
		case slices.Equal(st[j], contig):
			s.leaves[j].kind = leafFull
		default:
			s.leaves[j].kind = leafStrided
			strided = true
		}
	}
	p.block = blockSize
	if !strided {
		v, u := s.vecShape()
		p.grid = [3]uint32{uint32(max(1, ceilDiv(p.n/v, blockSize*u))), 1, 1}
		return
	}
	s.rank = len(dims)
	p.dims = dims
	for j := range s.leaves {
		if s.leaves[j].kind == leafStrided {
			p.strides = append(p.strides, st[j])
		}
	}
	if p.vectorise(dims, st) {
		v, u := s.vecShape()
		p.grid = [3]uint32{uint32(max(1, ceilDiv(p.n/v, blockSize*u))), 1, 1}
		return
	}
	p.grid = [3]uint32{uint32(max(1, ceilDiv(p.n, blockSize*stridedPerThread))), 1, 1}
}

// vectorise turns a strided plan into whole vectors along the innermost
// dim when that dim is a multiple of the vector width and every strided
// leaf walks it with stride 1, at vector-aligned offsets, or 0.
func (p *ewPlan) vectorise(dims []int, st [][]int) bool {
	s := &p.spec
	last := len(dims) - 1
	s.vec = true
	for j := range s.leaves {
		if s.leaves[j].kind != leafStrided {
			continue
		}
		switch st[j][last] {
		case 0:
			s.leaves[j].inner = 0
		case 1:
			s.leaves[j].inner = 1
		default:
			s.vec = false
		}
	}
	v, _ := s.vecShape()
	if s.vec && v > 1 && dims[last]%v == 0 {
		ok := true
		for j := range s.leaves {
			if s.leaves[j].kind == leafStrided && s.leaves[j].inner == 1 {
				for d := range last {
					ok = ok && st[j][d]%v == 0
				}
			}
		}
		if ok {
			return true
		}
	}
	s.vec = false
	for j := range s.leaves {
		s.leaves[j].inner = 0
	}
	return false
}

func (p *ewPlan) planReduce(domain, axes []int, leafStrides [][]int, sms int) {
	s := &p.spec
	rd := s.red
	// Operands: non-scalar leaves, then outputs (contiguous over the domain).
	var st [][]int
	for j := range s.leaves {
		if allZero(leafStrides[j]) {
			s.leaves[j].kind = leafScalar
			continue
		}
		s.leaves[j].kind = leafStrided
		st = append(st, leafStrides[j])
	}
	for range s.outs {
		st = append(st, contiguousStrides(domain))
	}
	// Kept dims first, then reduced, each collapsed on its own.
	var kd, rdm []int
	kst := make([][]int, len(st))
	rst := make([][]int, len(st))
	lastReduced := false
	for d, n := range domain {
		r := slices.Contains(axes, d)
		if n != 1 {
			lastReduced = r
		}
		if r {
			rdm = append(rdm, n)
		} else {
			kd = append(kd, n)
		}
		for j := range st {
			if r {
				rst[j] = append(rst[j], st[j][d])
			} else {
				kst[j] = append(kst[j], st[j][d])
			}
		}
	}
	kd, kst = collapse(kd, kst)
	rdm, rst = collapse(rdm, rst)
	p.kdims, p.rdims = kd, rdm
	p.O, p.R = kernels.Numel(kd), kernels.Numel(rdm)
	for j := range st {
		p.opStrides = append(p.opStrides, append(slices.Clone(kst[j]), rst[j]...))
	}
	rd.kr, rd.rr = len(kd), len(rdm)
	target := 4 * max(sms, 1)
	p.P, p.chunk, p.block = 1, p.R, blockSize
	switch {
	case p.O == 0:
		rd.mode = redThreadPerOut
	case lastReduced && p.R > 32 && p.R <= 8192 && p.O >= warpsPerBlock*target:
		// Many short rows: a warp each, no block-wide synchronisation.
		rd.mode = redWarpPerOut
		p.grid = [3]uint32{uint32(ceilDiv(p.O, warpsPerBlock)), 1, 1}
	case lastReduced && p.R > 32:
		rd.mode = redBlockPerOut
		if p.O < target {
			p.P = max(1, min(ceilDiv(target, p.O), ceilDiv(p.R, 4096), 65535))
		}
		// Chunks of whole runs (redVec), so a vector never straddles two.
		p.chunk = ceilDiv(ceilDiv(p.R, p.P), redVec) * redVec
		p.P = max(1, ceilDiv(p.R, p.chunk))
		p.block = uint32(min(blockSize, ceilDiv(ceilDiv(p.chunk, redVec), 32)*32))
		p.grid = [3]uint32{uint32(p.O), uint32(p.P), 1}
	default:
		rd.mode = redThreadPerOut
		bx := ceilDiv(p.O, blockSize)
		if bx < target/2 && p.R > 0 {
			p.P = max(1, min(ceilDiv(target, bx), ceilDiv(p.R, 32), 65535))
		}
		p.chunk = ceilDiv(p.R, p.P)
		if p.chunk > 0 {
			p.P = ceilDiv(p.R, p.chunk)
		}
		p.grid = [3]uint32{uint32(bx), uint32(p.P), 1}
	}
	s.idx64 = p.n > idx32Max || p.O*p.P > idx32Max
	p.vectoriseReduce()
}

// vectoriseReduce lets a warp- or block-per-output reduction load whole
// runs of redVec elements when the reduced dims collapse to one that every
// leaf walks with stride 1 or 0, the run boundaries fall on multiples of
// redVec for every row, and no elementwise output is written beside it.
func (p *ewPlan) vectoriseReduce() {
	s := &p.spec
	rd := s.red
	rd.vec = false
	if rd.mode == redThreadPerOut || rd.rr != 1 || len(s.outs) > 0 || p.R%redVec != 0 || p.chunk%redVec != 0 {
		return
	}
	ones := 0
	k := 0 // operand index of the next strided leaf
	for j := range s.leaves {
		if s.leaves[j].kind != leafStrided {
			continue
		}
		strides := p.opStrides[k]
		k++
		switch strides[len(strides)-1] {
		case 0:
		case 1:
			for _, ks := range strides[:len(strides)-1] {
				if ks%redVec != 0 {
					return
				}
			}
			ones++
		default:
			return
		}
	}
	if ones == 0 {
		return
	}
	k = 0
	for j := range s.leaves {
		if s.leaves[j].kind != leafStrided {
			continue
		}
		if p.opStrides[k][len(p.opStrides[k])-1] == 1 {
			s.leaves[j].inner = 1
		}
		k++
	}
	rd.vec = true
}

// kargs packs kernel parameters: each is its own value in blob, at offs.
// The first few live in the struct itself (b0, o0): a kargs is used by
// pointer, never copied.
type kargs struct {
	blob []byte
	offs []int32
	b0   [128]byte
	o0   [16]int32
}

func (a *kargs) put(v uint64, size int) {
	if a.blob == nil {
		a.blob, a.offs = a.b0[:0], a.o0[:0]
	}
	for len(a.blob)%size != 0 {
		a.blob = append(a.blob, 0)
	}
	a.offs = append(a.offs, int32(len(a.blob)))
	if size == 8 {
		a.blob = binary.LittleEndian.AppendUint64(a.blob, v)
	} else {
		a.blob = binary.LittleEndian.AppendUint32(a.blob, uint32(v))
	}
}

func (a *kargs) ptr(p uint64)  { a.put(p, 8) }
func (a *kargs) u64(v uint64)  { a.put(v, 8) }
func (a *kargs) f64(v float64) { a.put(math.Float64bits(v), 8) }
func (a *kargs) i64(v int)     { a.put(uint64(int64(v)), 8) }
func (a *kargs) idx(v int, wide bool) {
	if wide {
		a.put(uint64(v), 8)
	} else {
		a.put(uint64(v), 4)
	}
}

// args packs the launch parameters of p after its pointers (inputs of
// each leaf, outputs), in the order the generated kernel declares them.
// rout and part are the reduction's output and partials (0 if none).
func (p *ewPlan) args(a *kargs, leafPtr, outPtr []uint64, rout, part uint64) {
	s := &p.spec
	w := s.idx64
	for _, q := range leafPtr {
		a.ptr(q)
	}
	for _, q := range outPtr {
		a.ptr(q)
	}
	switch {
	case s.red != nil:
		a.ptr(rout)
		a.ptr(part)
		a.idx(p.O, w)
		a.idx(p.R, w)
		a.idx(p.chunk, w)
		for _, d := range p.kdims {
			a.idx(d, w)
		}
		for _, d := range p.rdims {
			a.idx(d, w)
		}
		for _, st := range p.opStrides {
			for _, x := range st {
				a.idx(x, w)
			}
		}
	case s.rank == 0:
		a.idx(p.n, w)
	default: // strided, vectorised or not: the same parameters
		a.idx(p.n, w)
		for _, d := range p.dims {
			a.idx(d, w)
		}
		for _, st := range p.strides {
			for _, x := range st {
				a.idx(x, w)
			}
		}
	}
}

// planPermute plans a permute as a copy whose one leaf walks the input
// with permuted strides.
func planPermute(in kernels.Meta, perm []int, out kernels.Meta) *ewPlan {
	r := len(in.Shape)
	inSt := contiguousStrides(in.Shape)
	st := make([]int, r)
	for i, q := range perm {
		if q < 0 {
			q += r
		}
		st[i] = inSt[q]
	}
	p := &ewPlan{redOut: -1, n: out.Numel(), leafIn: []int{0}, outIdx: []int{0}}
	p.spec.leaves = []ewLeaf{{dt: in.DType}}
	p.spec.outs = []int{0}
	p.planElementwise(out.Shape, [][]int{st})
	return p
}

// mmPlan is a batched matrix product as GEMMs: each call multiplies count
// matrices, strided by sA, sB, sC elements, from the element offsets of
// one entry of calls. Batch dims are broadcast with stride 0.
type mmPlan struct {
	m, k, n    int
	count      int
	sA, sB, sC int
	calls      [][3]int
}

func planMatmul(a, b []int) (*mmPlan, error) {
	batch, m, k, n, _, err := kernels.MatmulShapes(a, b)
	if err != nil {
		return nil, err
	}
	aa, bb := a, b
	if len(a) == 1 {
		aa = []int{1, a[0]}
	}
	if len(b) == 1 {
		bb = []int{b[0], 1}
	}
	sa, err := broadcastStrides(aa[:len(aa)-2], batch)
	if err != nil {
		return nil, err
	}
	sb, err := broadcastStrides(bb[:len(bb)-2], batch)
	if err != nil {
		return nil, err
	}
	sc := contiguousStrides(batch)
	for i := range batch {
		sa[i] *= m * k
		sb[i] *= k * n
		sc[i] *= m * n
	}
	dims, st := collapse(batch, [][]int{sa, sb, sc})
	p := &mmPlan{m: m, k: k, n: n, count: 1}
	if len(dims) == 0 {
		p.calls = [][3]int{{0, 0, 0}}
		return p, nil
	}
	last := len(dims) - 1
	p.count = dims[last]
	p.sA, p.sB, p.sC = st[0][last], st[1][last], st[2][last]
	if last == 0 && p.sB == 0 && p.sA == m*k && p.sC == m*n {
		// B shared by the whole batch: one GEMM with count*m rows.
		p.m, p.count, p.sA, p.sC = m*p.count, 1, 0, 0
	}
	outer := dims[:last]
	idx := make([]int, len(outer))
	for {
		var off [3]int
		for d, i := range idx {
			for j := range 3 {
				off[j] += i * st[j][d]
			}
		}
		p.calls = append(p.calls, off)
		d := len(idx) - 1
		for d >= 0 {
			idx[d]++
			if idx[d] < outer[d] {
				break
			}
			idx[d] = 0
			d--
		}
		if d < 0 {
			break
		}
	}
	return p, nil
}

// sizeClass rounds n up to one of four classes per power of two (at most
// 25% waste), at least 512 bytes, so that freed blocks are found again.
func sizeClass(n int) int {
	if n <= 512 {
		return 512
	}
	step := 1 << max(bits.Len(uint(n-1))-3, 0)
	return (n + step - 1) &^ (step - 1)
}

// transposePlan is a permute run as tiled transposes.
type transposePlan struct {
	spec          transposeSpec
	R, C          int
	outer, stride []int
	grid          [3]uint32
}

// planTranspose returns a tiled plan when the permute, collapsed, swaps
// the two innermost dims under outer dims that fit gridDim.z; else nil.
func planTranspose(in kernels.Meta, perm []int, out kernels.Meta) *transposePlan {
	r := len(in.Shape)
	inSt := contiguousStrides(in.Shape)
	st := make([]int, r)
	for i, q := range perm {
		if q < 0 {
			q += r
		}
		st[i] = inSt[q]
	}
	dims, sts := collapse(out.Shape, [][]int{st})
	n := len(dims)
	if n < 2 || sts[0][n-2] != 1 || sts[0][n-1] != dims[n-2] {
		return nil
	}
	R, C := dims[n-2], dims[n-1]
	z := kernels.Numel(dims[:n-2])
	if z > 65535 || ceilDiv(R, 32) > 65535 || R < 8 || C < 8 {
		return nil
	}
	return &transposePlan{
		spec:   transposeSpec{dt: in.DType, outer: n - 2, idx64: out.Numel() > idx32Max},
		R:      R,
		C:      C,
		outer:  dims[:n-2],
		stride: sts[0][:n-2],
		grid:   [3]uint32{uint32(ceilDiv(C, 32)), uint32(ceilDiv(R, 32)), uint32(max(z, 1))},
	}
}

func (p *transposePlan) args(a *kargs, in, out uint64) {
	w := p.spec.idx64
	a.ptr(in)
	a.ptr(out)
	a.idx(p.R, w)
	a.idx(p.C, w)
	for d := range p.outer {
		a.idx(p.outer[d], w)
		a.idx(p.stride[d], w)
	}
}

// planSoftmax plans softmax or log_softmax of x over op.Axis as a
// logsumexp of each slice, in float64 (lbytes of it), and an elementwise
// pass over x and that.
func planSoftmax(op *kernels.Op, x kernels.Meta, sms int) (lse, apply *ewPlan, lbytes int, err error) {
	axis := op.Axis
	if axis < 0 {
		axis += len(x.Shape)
	}
	lm := kernels.Meta{DType: kernels.Float64, Shape: slices.Clone(x.Shape)}
	lm.Shape[axis] = 1
	g := &kernels.FusedGroup{Inputs: 1, Ops: []kernels.FusedOp{{Op: kernels.Op{Name: "logsumexp", Axes: []int{axis}, Keepdims: true}, Args: []int{0}}}, Results: []int{1}}
	if lse, err = planGroup(g, []kernels.Meta{x, lm}, sms); err != nil {
		return nil, nil, 0, err
	}
	ls, err := broadcastStrides(lm.Shape, x.Shape)
	if err != nil {
		return nil, nil, 0, err
	}
	apply = &ewPlan{redOut: -1, n: x.Numel(), leafIn: []int{0, 1}, outIdx: []int{0}}
	apply.spec.leaves = []ewLeaf{{dt: x.DType}, {dt: kernels.Float64}}
	apply.spec.nodes = []ewNode{{op: op.Name, dt: x.DType, args: []int{0, 1}}}
	apply.spec.outs = []int{2}
	apply.planElementwise(x.Shape, [][]int{contiguousStrides(x.Shape), ls})
	return lse, apply, lm.Bytes(), nil
}
