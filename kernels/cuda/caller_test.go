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
			be := &Backend{fns: map[string]cuFunction{}, plans: map[string]*planned{}, chains: map[string]*chainPlan{}, bgDone: map[string]loadedFn{}, sms: 132}
			be.opts.chains = chains
			be.mem.memAlloc = func(n int) (uint64, error) { return 1 << 30, nil }
			be.mem.init()
			// Prime the allocator and the kernel table without a device thread.
			p, _ := be.mem.grow(512, nil)
			be.mem.put(p, 512)
			m := kernels.Meta{DType: kernels.Float32, Shape: []int{1}}
			op := &kernels.Op{Name: kernels.OpAdd}
			single, err := planGroup(&kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{{Op: *op, Args: []int{0, 1}}}, Results: []int{2}}, []kernels.Meta{m, m, m}, be.sms)
			if err != nil {
				b.Fatal(err)
			}
			be.fns[single.spec.key()] = nil
			alloc := func() *kernels.Tensor {
				buf, err := be.Alloc(4)
				if err != nil {
					b.Fatal(err)
				}
				return &kernels.Tensor{Meta: m, Buf: buf}
			}
			one, x := alloc(), alloc()
			step := func() {
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
			// The chains' forms, planned once, taken as compiled.
			for range 4 * maxChain {
				step()
			}
			for _, cp := range be.chains {
				if cp.p != nil {
					be.fns[cp.spec] = nil
					cp.state, cp.fns.f = chainReady, nil
				}
			}
			for b.Loop() {
				step()
			}
			for _, cp := range be.chains {
				if cp.state != chainReady {
					b.Fatalf("a chain's kernel is not ready (state %d)", cp.state)
				}
			}
		})
	}
}
