//go:build cgo && linux

package cuda

import (
	"fmt"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// BenchmarkExecCaller: what Alloc, Exec and Free of a chain of tiny adds
// cost the caller, with the device thread left out: a Backend with no
// device, whose kernels are known and whose queue is emptied by hand.
func BenchmarkExecCaller(b *testing.B) {
	for _, chains := range []bool{false, true} {
		b.Run(fmt.Sprintf("chains=%v", chains), func(b *testing.B) {
			be := &Backend{fns: map[string]cuFunction{}, plans: map[string]*planned{}, chains: map[string]*chainPlan{}, sms: 132}
			be.opts.chains = chains
			be.mem.memAlloc = func(n int) (uint64, error) { return 1 << 30, nil }
			be.mem.init()
			// Prime the allocator and the kernel table without a device thread.
			p, _ := be.mem.grow(512, nil)
			be.mem.put(p, 512)
			m := kernels.Meta{DType: kernels.Float32, Shape: []int{1}}
			op := &kernels.Op{Name: kernels.OpAdd}
			g := &kernels.FusedGroup{Inputs: 2}
			vals := []kernels.Meta{m, m}
			for range maxChain {
				g.Ops = append(g.Ops, kernels.FusedOp{Op: *op, Args: []int{len(vals) - 1, 1}})
				g.Results = append(g.Results, len(vals))
				vals = append(vals, m)
			}
			g.Ops[0].Args[0] = 0
			single, err := planGroup(&kernels.FusedGroup{Inputs: 2, Ops: g.Ops[:1], Results: []int{2}}, vals[:3], be.sms)
			if err != nil {
				b.Fatal(err)
			}
			be.fns[single.spec.key()] = nil
			fused, err := planGroup(g, vals, be.sms)
			if err != nil {
				b.Fatal(err)
			}
			be.fns[fused.spec.key()] = nil
			alloc := func() *kernels.Tensor {
				buf, err := be.Alloc(4)
				if err != nil {
					b.Fatal(err)
				}
				return &kernels.Tensor{Meta: m, Buf: buf}
			}
			one, x := alloc(), alloc()
			for b.Loop() {
				y := alloc()
				if err := be.Exec(op, []*kernels.Tensor{x, one}, []*kernels.Tensor{y}); err != nil {
					b.Fatal(err)
				}
				be.Free(x.Buf)
				x = y
				if be.qn.Load() >= 1024 {
					clear(be.q)
					be.q = be.q[:0]
					be.qn.Store(0)
				}
			}
			for _, cp := range be.chains {
				if cp.state != chainReady {
					b.Fatalf("a chain's kernel is not ready (state %d)", cp.state)
				}
			}
		})
	}
}
