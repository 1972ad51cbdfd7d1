package worker_test

import (
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// partial is a backend that declines every op but add, like a GPU backend
// without kernels for some ops.
type partial struct {
	*cpu.Backend
	declined int
}

func (p *partial) Name() string { return "partial" }

func (p *partial) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	if op.Name != kernels.OpAdd {
		p.declined++
		return kernels.ErrNotImplemented
	}
	return p.Backend.Exec(op, in, out)
}

func TestHostFallback(t *testing.T) {
	b := brokertest.Run(t)
	be := &partial{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = be })
	r := newRaw(t, b, "fabric.ops.cpu-0.fb")
	r.sendJSON(`{"v":1,"ops":[
		{"op":"upload","out":[1],"shape":[2,3],"values":[1,2,3,4,5,6]},
		{"op":"slice","out":[2],"in":[1],"starts":[0,1],"ends":[2,3]},
		{"op":"add","out":[3],"in":[2,2]},
		{"op":"sum","out":[4],"in":[3],"axes":[1]},
		{"op":"read","in":[4],"tag":1}]}`)
	res := r.result()
	if len(res.Errors) > 0 || res.Tensor == nil {
		t.Fatalf("result %+v", res)
	}
	// slice [[2 3] [5 6]], doubled, row sums 10 and 22.
	if v := res.Tensor.Values; len(v) != 2 || v[0] != 10 || v[1] != 22 {
		t.Fatalf("values %v, want [10 22]", v)
	}
	if be.declined != 2 {
		t.Errorf("the backend declined %d ops, want 2 (slice, sum)", be.declined)
	}
}
