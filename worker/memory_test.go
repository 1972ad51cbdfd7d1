package worker_test

import (
	"fmt"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestMemoryBudget: a session whose op would take the device past its
// budget gets resource_exhausted for that op; it and the other sessions
// go on, and memory freed by one session is there for another. The
// metrics show the bytes of the device and of each session.
func TestMemoryBudget(t *testing.T) {
	b := brokertest.Run(t)
	dev := worker.Device{Name: "cpu-0", Kind: "cpu", Backend: cpu.New(), Budget: 1 << 20}
	w := workertest.Run(t, b, []worker.Device{dev}, func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond })
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()

	a, c := newRaw(t, b, "fabric.ops.cpu-0.budgeta"), newRaw(t, b, "fabric.ops.cpu-0.budgetc")
	// 640 KiB for a: under the 1 MiB budget.
	a.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[163840],"value":1},{"op":"sync","tag":1}]}`)
	if res := a.result(); len(res.Errors) > 0 {
		t.Fatalf("a: %+v", res.Errors)
	}
	// 400 KiB more for c: over it.
	c.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[102400],"value":2},{"op":"sync","tag":1}]}`)
	res := c.result()
	if len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeResourceExhausted || !strings.Contains(res.Errors[0].Message, "budget") {
		t.Fatalf("c over the budget: %+v", res)
	}
	// c goes on: a small tensor fits.
	c.sendJSON(`{"v":1,"ops":[{"op":"full","out":[2],"shape":[4],"value":3},{"op":"read","in":[2],"tag":2}]}`)
	if res := c.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 3 {
		t.Fatalf("c after the refusal: %+v", res)
	}
	// a is untouched.
	a.sendJSON(`{"v":1,"ops":[{"op":"sum","out":[2],"in":[1]},{"op":"read","in":[2],"tag":2}]}`)
	if res := a.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 163840 {
		t.Fatalf("a after c's refusal: %+v", res)
	}
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		m := scrape(t, srv.URL)
		want := map[string]float64{
			`jetfabric_device_tensor_bytes{device="cpu-0"}`:                    163840*4 + 4 + 16,
			`jetfabric_device_memory_budget_bytes{device="cpu-0"}`:             1 << 20,
			`jetfabric_session_tensor_bytes{device="cpu-0",session="budgeta"}`: 163840*4 + 4,
			`jetfabric_session_tensor_bytes{device="cpu-0",session="budgetc"}`: 16,
		}
		for k, v := range want {
			if m[k] != v {
				return fmt.Errorf("%s = %v, want %v", k, m[k], v)
			}
		}
		return nil
	})
	// Once a frees its tensor, c's asks fit.
	a.sendJSON(`{"v":1,"ops":[{"op":"free","in":[1]},{"op":"sync","tag":3}]}`)
	a.result()
	c.sendJSON(`{"v":1,"ops":[{"op":"full","out":[3],"shape":[102400],"value":2},{"op":"sum","out":[4],"in":[3]},{"op":"read","in":[4],"tag":3}]}`)
	if res := c.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 204800 {
		t.Fatalf("c once a freed its tensor: %+v", res)
	}
}

// retained is the memory the Go runtime holds from the system for its
// heap: what it has not given back.
func retained() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapSys - ms.HeapReleased
}

// TestFreedMemoryReturns: memory of sessions freed for being idle goes
// back to the system, the backend's buffer cache included, with no
// further frames to make the collector run.
func TestFreedMemoryReturns(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b, func(c *worker.Config) {
		c.IdleTimeout = 200 * time.Millisecond
		c.Reclaim = 100 * time.Millisecond
	})
	runtime.GC()
	base := retained()
	const n = 8 << 20 // f32 elements: 32 MiB a tensor
	for i := range 3 {
		r := newRaw(t, b, fmt.Sprintf("fabric.ops.cpu-0.big%d", i))
		r.sendJSON(fmt.Sprintf(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[%d],"value":1},{"op":"exp","out":[2],"in":[1]},{"op":"sync","tag":1}]}`, n))
		if res := r.resultWithin(30 * time.Second); len(res.Errors) > 0 {
			t.Fatal(res.Errors)
		}
	}
	held := uint64(3 * 2 * 4 * n)
	if peak := retained(); peak < base+held/2 {
		t.Logf("retained %d MiB at the peak (base %d MiB)", peak>>20, base>>20)
	}
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if r := retained(); r > base+held/4 {
			return fmt.Errorf("retained %d MiB, base %d MiB, the sessions held %d MiB", r>>20, base>>20, held>>20)
		}
		return nil
	})
}
