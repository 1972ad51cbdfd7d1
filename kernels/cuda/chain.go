//go:build cgo && linux

package cuda

import (
	"encoding/binary"
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

// Chains: consecutive elementwise ops of one shape, each checked,
// planned and compiled by its own Exec, whose launches are held back and
// issued as one fused kernel that writes every op's output (a chain of
// tiny ops costs one launch, not one each). The fused kernel of a chain
// is compiled in the background the first time the chain is seen; until
// it is loaded, the chain's ops are launched one by one. Both give the
// same bits: the generator rounds each op of a fused kernel as it rounds
// the op alone. A chain is issued before any other work is queued (any
// other op, any call that waits for the device thread), so the order of
// the stream is the order of the calls.

// maxChain bounds the ops of a chain, and its leaves (inputs read from
// memory).
const maxChain = 16

// chainOp is one op of the pending chain, with what it needs to run alone.
type chainOp struct {
	name string
	c    *planned
	inB  []*buffer
	out  *buffer
}

// chain is the pending chain. vals maps a buffer written by an op of the
// chain to that op (the last one writing it); leaves are the buffers the
// chain reads from memory, with their metas. key names the chain's form:
// each op's plan key and where its arguments come from.
type chain struct {
	ops    []chainOp
	inB    []*buffer // the ops' inputs: each op's inB is a slice of it
	leaves []*buffer
	leafM  []kernels.Meta
	key    []byte
	shape  []int
}

// chainPlan is the fused kernel of a chain's form. state is chainPending
// while its kernel compiles in the background.
type chainPlan struct {
	p     *ewPlan
	fns   planFns
	spec  string // the kernel's key
	state chainState
	err   error // why the kernel could not be compiled or loaded
}

type chainState uint8

const (
	chainPending chainState = iota
	chainReady
	chainFailed
)

// Buffers are told apart by address: a block freed and handed out again
// while the chain is pending is a new *buffer of the same memory.

// valueOf returns the op of the chain that last wrote d's memory, or -1.
func (ch *chain) valueOf(d *buffer) int { return ch.valueOfBefore(d, len(ch.ops)) }

// valueOfBefore returns the op before op k that last wrote d's memory,
// or -1.
func (ch *chain) valueOfBefore(d *buffer, k int) int {
	for v := k - 1; v >= 0; v-- {
		if ch.ops[v].out.ptr == d.ptr {
			return v
		}
	}
	return -1
}

// leafOf returns the leaf index of d's memory, or -1.
func (ch *chain) leafOf(d *buffer) int {
	for j, l := range ch.leaves {
		if l.ptr == d.ptr {
			return j
		}
	}
	return -1
}

// chainAdd adds an op that execPlanned checked and planned (c, with its
// buffers) to the pending chain, issuing the chain first if the op cannot
// join it. It reports false when the op cannot be part of any chain: the
// caller launches it alone.
func (b *Backend) chainAdd(name string, c *planned, in []*kernels.Tensor, inB []*buffer, out *buffer) bool {
	if !b.opts.chains || c.p.spec.red != nil || len(c.want) != 1 || c.p.empty() || len(in) > maxChain {
		b.flushChain()
		return false
	}
	for _, d := range inB {
		if d.ptr == out.ptr {
			b.flushChain() // in place: alone, through scratch memory
			return false
		}
	}
	if !b.chainFits(c, in, inB, out) {
		b.flushChain()
	}
	ch := &b.chain
	if len(ch.ops) == 0 {
		ch.shape = c.want[0].Shape
	}
	k := binary.AppendUvarint(ch.key, uint64(len(b.keyBuf)))
	k = append(k, b.keyBuf...) // the op's plan key, from execPlanned
	for i, d := range inB {
		if v := ch.valueOf(d); v >= 0 {
			k = binary.AppendUvarint(k, uint64(2*v+1))
			continue
		}
		j := ch.leafOf(d)
		if j < 0 {
			j = len(ch.leaves)
			ch.leaves = append(ch.leaves, d)
			ch.leafM = append(ch.leafM, in[i].Meta)
		}
		k = binary.AppendUvarint(k, uint64(2*j))
	}
	// The leaf the op's output shares memory with, if any (plus one).
	k = binary.AppendUvarint(k, uint64(ch.leafOf(out)+1))
	ch.key = k
	at := len(ch.inB)
	ch.inB = append(ch.inB, inB...)
	ch.ops = append(ch.ops, chainOp{name: name, c: c, inB: ch.inB[at:len(ch.inB):len(ch.inB)], out: out})
	if len(ch.ops) == maxChain {
		b.flushChain()
	}
	return true
}

// chainFits reports whether the op can join the pending chain (true when
// there is none): the same output shape; inputs that the chain made read
// with the metas they were made with, and other inputs read with one
// meta; an output that no op of the chain reads from memory, or that
// each thread reads before it writes (see mayWrite); room.
func (b *Backend) chainFits(c *planned, in []*kernels.Tensor, inB []*buffer, out *buffer) bool {
	ch := &b.chain
	if len(ch.ops) == 0 {
		return true
	}
	if !equalShape(c.want[0].Shape, ch.shape) || !ch.mayWrite(out, c.want[0]) {
		return false
	}
	leaves := len(ch.leaves)
	for i, d := range inB {
		if v := ch.valueOf(d); v >= 0 {
			m := ch.ops[v].c.want[0]
			if m.DType != in[i].DType || !equalShape(m.Shape, in[i].Shape) {
				return false
			}
			continue
		}
		if j := ch.leafOf(d); j >= 0 {
			if ch.leafM[j].DType != in[i].DType || !equalShape(ch.leafM[j].Shape, in[i].Shape) {
				return false
			}
			continue
		}
		leaves++
	}
	return leaves <= maxChain
}

// mayWrite reports whether the chain may write out, of meta m, in its
// domain: a block that the chain reads (a leaf), freed and handed out
// again, only if the leaf has the domain's shape and m's element size,
// so that each element is read and written by the same thread, reads
// first. Such a leaf is not restricted in the kernel (ewLeaf.alias).
func (ch *chain) mayWrite(out *buffer, m kernels.Meta) bool {
	j := ch.leafOf(out)
	return j < 0 || ch.leafM[j].DType.Size() == m.DType.Size() && equalShape(ch.leafM[j].Shape, ch.shape)
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// flushChain queues the pending chain: one fused kernel when its form's
// kernel is loaded, else its ops one by one. The caller holds mu. Its
// device calls go in an item of their own, before anything recorded
// after.
func (b *Backend) flushChain() {
	if len(b.chain.ops) == 0 {
		return
	}
	// Taken out first: launching may call the device thread, which
	// flushes the chain. Its slices are kept for the next.
	ch := b.chain
	b.chain = b.spare
	defer func() {
		clear(ch.ops)
		clear(ch.leaves)
		clear(ch.inB)
		b.spare = chain{ops: ch.ops[:0], inB: ch.inB[:0], leaves: ch.leaves[:0], leafM: ch.leafM[:0], key: ch.key[:0]}
	}()
	rec := b.rec
	b.rec = nil
	name := ch.ops[0].name
	if len(ch.ops) > 1 {
		name = fmt.Sprintf("%s (first of a fused chain of %d ops)", name, len(ch.ops))
	}
	if err := b.launchChain(&ch); err != nil {
		// Every op was checked and its kernel loaded: only scratch memory
		// can fail here, and the ops' outputs are already handed out.
		b.notRecordable("a chain that failed to launch")
		b.rec = append(b.rec, func() error { return err })
	}
	b.pushRun(name)
	b.rec = rec
}

// launchChain records the launches of ch.
func (b *Backend) launchChain(ch *chain) error {
	if len(ch.ops) > 1 {
		if cp := b.chainPlanOf(ch); cp.state == chainReady {
			outB := make([]*buffer, len(ch.ops))
			for k, op := range ch.ops {
				outB[k] = op.out
			}
			b.fusedChains++
			return b.launchPlan(cp.p, cp.fns, ch.leaves, outB)
		} else if cp.state == chainPending && b.recording != nil {
			b.recording.unfused = true
		}
	}
	for _, op := range ch.ops {
		if err := b.launchPlan(op.c.p, op.c.fns, op.inB, []*buffer{op.out}); err != nil {
			return err
		}
	}
	return nil
}

// chainPlanOf returns the plan of ch's form, planning it and starting its
// compilation the first time the form is seen, and taking its kernel
// once loaded.
func (b *Backend) chainPlanOf(ch *chain) *chainPlan {
	cp, ok := b.chains[string(ch.key)]
	if !ok {
		cp = b.planChain(ch)
		if len(b.chains) >= maxPlans {
			clear(b.chains)
		}
		b.chains[string(ch.key)] = cp
	}
	if cp.state == chainPending {
		if f, ok := b.fns[cp.spec]; ok {
			cp.fns.f, cp.state = f, chainReady
		} else if l, done := b.loaded(cp.spec); done {
			if l.err != nil {
				cp.state, cp.err = chainFailed, l.err
			} else {
				b.fns[cp.spec] = l.f
				cp.fns.f, cp.state = l.f, chainReady
			}
		}
	}
	return cp
}

// planChain plans the fused kernel of ch and, unless it is loaded
// already, starts compiling it.
func (b *Backend) planChain(ch *chain) *chainPlan {
	nin := len(ch.leaves)
	g := &kernels.FusedGroup{Inputs: nin, Ops: make([]kernels.FusedOp, len(ch.ops)), Results: make([]int, len(ch.ops))}
	vals := append([]kernels.Meta{}, ch.leafM...)
	for k, op := range ch.ops {
		args := make([]int, len(op.inB))
		for i, d := range op.inB {
			if v := ch.valueOfBefore(d, k); v >= 0 {
				args[i] = nin + v
			} else {
				args[i] = ch.leafOf(d)
			}
		}
		g.Ops[k] = kernels.FusedOp{Op: kernels.Op{Name: op.name}, Args: args}
		g.Results[k] = nin + k
		vals = append(vals, op.c.want[0])
	}
	// The plan reads only names and metas of elementwise ops.
	p, err := planGroup(g, vals, b.sms)
	if err != nil || p.spec.red != nil || len(p.outIdx) != len(ch.ops) {
		return &chainPlan{state: chainFailed}
	}
	for sj, j := range p.leafIn {
		for _, op := range ch.ops {
			if op.out.ptr == ch.leaves[j].ptr {
				p.spec.leaves[sj].alias = true
			}
		}
	}
	cp := &chainPlan{p: p, spec: p.spec.key()}
	b.chainForms++
	if f, ok := b.fns[cp.spec]; ok {
		cp.fns.f, cp.state = f, chainReady
		return cp
	}
	src, err := p.spec.source()
	if err != nil {
		cp.state = chainFailed
		return cp
	}
	b.compileAsync(cp.spec, src)
	return cp
}

// loadedFn is a kernel compiled and loaded in the background, or why
// not.
type loadedFn struct {
	f   cuFunction
	err error
}

// loaded returns the background load of kernel key, if it has finished.
func (b *Backend) loaded(key string) (loadedFn, bool) {
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	l, ok := b.bgDone[key]
	if ok {
		delete(b.bgDone, key)
	}
	return l, ok
}

// compileAsync compiles src on a goroutine of its own and loads it on the
// device thread, recording the result for loaded. Close waits for it.
func (b *Backend) compileAsync(key, src string) {
	done := func(f cuFunction, err error) {
		b.bgMu.Lock()
		b.bgDone[key] = loadedFn{f: f, err: err}
		b.bgMu.Unlock()
	}
	opts := b.compileOptions()
	b.bg.Go(func() {
		img, err := image(src, opts, b.opts.cacheDir)
		if err != nil {
			done(nil, err)
			return
		}
		b.push(item{bg: func() {
			m, err := moduleLoad(img)
			if err != nil {
				done(nil, err)
				return
			}
			b.mods = append(b.mods, m)
			done(moduleFunction(m, kernelName))
		}})
	})
}
