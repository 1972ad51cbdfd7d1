package client_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// TestCollectivesInFlightMatchTheLoop runs every collective on four
// devices whose worker runs them beside the device loop and on four whose
// worker runs them in the loop (Config.SyncCollectives), with ops after
// each that read its output and ops that do not: every result has the same
// bits on both, over two ranks and over four.
func TestCollectivesInFlightMatchTheLoop(t *testing.T) {
	b := brokertest.Run(t)
	devs := workertest.CPUs(8)
	workertest.Run(t, b, devs[:4], func(c *worker.Config) { c.ID = "async" })
	workertest.Run(t, b, devs[4:], func(c *worker.Config) { c.ID, c.SyncCollectives = "sync", true })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	const n = 3 << 16 // 768 KiB of f32: the default all_reduce of 4 ranks is direct
	shape := []int{8, n / 8}
	type fabric struct {
		ss []*client.Session
		xs []*client.Tensor
	}
	var fabrics [2]fabric
	for k := range fabrics {
		for r := range 4 {
			s := open(t, c, fmt.Sprintf("cpu-%d", 4*k+r))
			s.Seed(uint64(r + 1))
			fabrics[k].ss = append(fabrics[k].ss, s)
			fabrics[k].xs = append(fabrics[k].xs, s.Normal(shape, 0, 1))
		}
	}
	// bits reads every tensor of outs, on both fabrics, and fails unless
	// they match.
	bits := func(what string, outs [2][]*client.Tensor) {
		t.Helper()
		for r := range outs[0] {
			a, err := outs[0][r].Read(ctx)
			if err != nil {
				t.Fatalf("%s rank %d, beside the loop: %v", what, r, err)
			}
			s, err := outs[1][r].Read(ctx)
			if err != nil {
				t.Fatalf("%s rank %d, in the loop: %v", what, r, err)
			}
			if !bytes.Equal(a.Bytes, s.Bytes) || a.DType != s.DType || fmt.Sprint(a.Shape) != fmt.Sprint(s.Shape) {
				t.Fatalf("%s rank %d: %v%v beside the loop, %v%v in the loop, bits equal: %v", what, r, a.DType, a.Shape, s.DType, s.Shape, bytes.Equal(a.Bytes, s.Bytes))
			}
		}
	}
	for _, ranks := range []int{2, 4} {
		for _, red := range []string{"sum", "mean", "max", "min"} {
			for _, algo := range []string{"default", "direct", "scatter", "naive"} {
				var opts []client.CollectiveOption
				switch algo {
				case "direct":
					opts = append(opts, client.Direct())
				case "scatter":
					opts = append(opts, client.Scatter())
				case "naive":
					opts = append(opts, client.Naive())
				}
				var outs, after, beside [2][]*client.Tensor
				for k, f := range fabrics {
					xs := f.xs[:ranks]
					out, err := client.AllReduce(red, xs, opts...)
					if err != nil {
						t.Fatal(err)
					}
					outs[k] = out
					for r, x := range xs {
						// Independent of the all_reduce, then reading it.
						beside[k] = append(beside[k], x.Mul(x).Sum(1))
						after[k] = append(after[k], out[r].Mul(x).Sum(1))
					}
				}
				what := fmt.Sprintf("%d ranks %s %s", ranks, red, algo)
				bits(what+": the op after, independent", beside)
				bits(what+": the op after, reading the output", after)
				bits(what, outs)
			}
		}
		var gather, scatter, bcast [2][]*client.Tensor
		for k, f := range fabrics {
			xs := f.xs[:ranks]
			var err error
			if gather[k], err = client.AllGather(xs); err != nil {
				t.Fatal(err)
			}
			if scatter[k], err = client.ReduceScatter("sum", xs); err != nil {
				t.Fatal(err)
			}
			if bcast[k], err = client.Broadcast(1, xs); err != nil {
				t.Fatal(err)
			}
		}
		bits(fmt.Sprintf("%d ranks all_gather", ranks), gather)
		bits(fmt.Sprintf("%d ranks reduce_scatter", ranks), scatter)
		bits(fmt.Sprintf("%d ranks broadcast", ranks), bcast)
	}
	for _, f := range fabrics {
		for _, s := range f.ss {
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCollectiveInFlight: three ranks of four start an all_reduce of 2 MiB
// (reduce-scatter then all-gather) and go on: they free its input and
// allocate tensors of its size (which reuse freed buffers), and rank 0
// frees its output. While the fourth rank has
// not joined, the devices answer other sessions, and rank 0's session
// exposes a tensor after its all_reduce that rank 3's device imports
// before it joins: neither could happen if the all_reduce held the loop.
// Then rank 3 joins and every rank gets the sum of the inputs as they were
// when the op was issued, as does an op that reads it.
func TestCollectiveInFlight(t *testing.T) {
	_, c := devices(t, 4)
	ctx := context.Background()
	const n = 1 << 19
	val := func(r, i int) float32 { return float32(i%7 + r) }
	group := "5123456789abcdef0123456789abcdef"
	ss := make([]*client.Session, 4)
	outs := make([]*client.Tensor, 4)
	after := make([]*client.Tensor, 4)
	for r := range 4 {
		ss[r] = open(t, c, fmt.Sprintf("cpu-%d", r))
	}
	allReduce := func(r int) {
		data := make([]float32, n)
		for i := range data {
			data[i] = val(r, i)
		}
		x := ss[r].FromFloat32([]int{n}, data)
		outs[r] = ss[r].Apply(codec.Op{Op: "all_reduce", Group: group, Rank: r, Size: 4, Algo: "scatter"}, x)
		x.Free()
		// Tensors of the input's size, in the memory it would have freed.
		for k := range 3 {
			y := ss[r].Full([]int{n}, float64(1000+k))
			y.Mul(y).Free()
			y.Free()
		}
		if r == 0 {
			outs[r].Free()
			outs[r] = nil
		}
	}
	for r := range 3 {
		allReduce(r)
	}
	xfer := "6123456789abcdef0123456789abcdef"
	ss[0].Full([]int{4}, 7).Expose(xfer, 1)
	for r := range 3 {
		ss[r].Flush()
	}
	// Other sessions of the devices are served meanwhile.
	for r := range 3 {
		other := open(t, c, fmt.Sprintf("cpu-%d", r))
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		v, err := other.Full([]int{1}, float64(r)).Float32s(rctx)
		cancel()
		if err != nil {
			t.Fatalf("cpu-%d answered no other session while its all_reduce waited for rank 3: %v", r, err)
		}
		expect(t, "other session", v, float64(r))
	}
	// The expose after rank 0's all_reduce ran: rank 3 imports it first.
	expect(t, "import", read(t, ss[3].Import(xfer, 30*time.Second)), 7, 7, 7, 7)
	allReduce(3)
	for r := 1; r < 3; r++ {
		// An op that reads the output waits for it.
		after[r] = outs[r].Mul(ss[r].Full([]int{n}, 2))
	}
	for r := 1; r < 4; r++ {
		got := read(t, outs[r])
		for i := range got {
			if want := 4*float32(i%7) + 6; got[i] != want {
				t.Fatalf("rank %d [%d] = %v, want %v", r, i, got[i], want)
			}
		}
		if r < 3 {
			got = read(t, after[r])
			for i := range got {
				if want := 2 * (4*float32(i%7) + 6); got[i] != want {
					t.Fatalf("rank %d: the op after the all_reduce [%d] = %v, want %v", r, i, got[i], want)
				}
			}
		}
	}
	for r := range 4 {
		if err := ss[r].Sync(ctx); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
