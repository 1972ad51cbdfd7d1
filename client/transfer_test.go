package client_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// devices starts a broker and a worker serving n CPU devices.
func devices(t testing.TB, n int) (*broker.Broker, *client.Client) {
	t.Helper()
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(n))
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return b, c
}

func TestTransfer(t *testing.T) {
	_, c := devices(t, 2)
	a, b := open(t, c, "cpu-0"), open(t, c, "cpu-1")
	x := a.Arange(0, 6, 1).Reshape(2, 3)
	y := x.To(b)
	expect(t, "moved", read(t, y.Mul(y).Sum(1)), 5, 50)
	// Same device, other session.
	a2 := open(t, c, "cpu-0")
	expect(t, "same device", read(t, y.To(a2).Sum()), 15)
	// Big enough to be chunked.
	big := a.Full([]int{1 << 20}, 0.5)
	expect(t, "4 MiB", read(t, big.To(b).Sum()), 1<<19)
}

// TestTransferInline: a tensor of up to 128 KiB travels in its
// announcement, with no object in FABRIC_XFER; one a byte larger as an
// object. Both arrive whole.
func TestTransferInline(t *testing.T) {
	br, c := devices(t, 2)
	ctx := context.Background()
	a, b := open(t, c, "cpu-0"), open(t, c, "cpu-1")
	nc, err := nats.Connect(br.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	xfer, err := js.ObjectStore(ctx, "FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		id     string
		n      int // f32 elements
		inline bool
	}{
		{"a123456789abcdef0123456789abcdef", 4, true},
		{"b123456789abcdef0123456789abcdef", 32 << 10, true}, // 128 KiB
		{"c123456789abcdef0123456789abcdef", 32<<10 + 1, false},
	} {
		x := a.Full([]int{tt.n}, 1)
		x.Expose(tt.id, 1)
		y := b.Import(tt.id, 0)
		got, err := y.Sum().Float32s(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := float32(tt.n); got[0] != want {
			t.Fatalf("%d elements: sum %v, want %v", tt.n, got[0], want)
		}
		_, objErr := xfer.GetInfo(ctx, "xfer-"+tt.id)
		e, err := kv.Get(ctx, "xfer.xfer-"+tt.id)
		if err != nil {
			t.Fatal(err)
		}
		hasData := strings.Contains(string(e.Value()), `"data":`)
		if tt.inline != (errors.Is(objErr, jetstream.ErrObjectNotFound) && hasData) {
			t.Errorf("%d elements: inline %v, but object lookup %v and data in the announcement %v", tt.n, tt.inline, objErr, hasData)
		}
		// The read is counted apart from the announcement.
		if strings.Contains(string(e.Value()), "readers") {
			t.Errorf("%d elements: the announcement lists readers: %.200s", tt.n, e.Value())
		}
		reads, err := kv.Get(ctx, "xread.xfer-"+tt.id)
		if err != nil {
			t.Fatalf("%d elements: read list: %v", tt.n, err)
		}
		var rl struct{ Readers []string }
		if err := json.Unmarshal(reads.Value(), &rl); err != nil || len(rl.Readers) != 1 || !strings.HasPrefix(rl.Readers[0], "cpu-1/") {
			t.Errorf("%d elements: read list %s (%v), want the one import on cpu-1", tt.n, reads.Value(), err)
		}
	}
}

func TestTransferFaults(t *testing.T) {
	br, c := devices(t, 2)
	ctx := context.Background()
	a, b := open(t, c, "cpu-0"), open(t, c, "cpu-1")
	id := "0123456789abcdef0123456789abcdef"

	// Never exposed: the import times out, nothing hangs.
	t0 := time.Now()
	lost := b.Apply(codec.Op{Op: "import", Transfer: id, TimeoutMS: 300})
	if _, err := lost.Float32s(ctx); err == nil || !strings.Contains(err.Error(), "did not arrive") {
		t.Fatalf("import of a transfer never exposed: %v", err)
	}
	if el := time.Since(t0); el > time.Minute {
		t.Errorf("the timeout took %v", el)
	}

	// Read past its limit.
	x := a.Full([]int{4}, 2)
	id2 := "1123456789abcdef0123456789abcdef"
	x.Expose(id2, 1)
	expect(t, "first import", read(t, b.Import(id2, 0)), 2, 2, 2, 2)
	second := open(t, c, "cpu-1").Apply(codec.Op{Op: "import", Transfer: id2, TimeoutMS: 60000})
	if _, err := second.Float32s(ctx); err == nil || !strings.Contains(err.Error(), "already read 1 times") {
		t.Fatalf("second import: %v", err)
	}

	// dtype and shape mismatch.
	id3 := "2123456789abcdef0123456789abcdef"
	x.Expose(id3, 2)
	for _, op := range []codec.Op{{Op: "import", Transfer: id3, DType: "i32"}, {Op: "import", Transfer: id3, Shape: []int{2, 2}}} {
		bad := b.Apply(op)
		if _, err := bad.Float32s(ctx); err == nil || !strings.Contains(err.Error(), "expects") {
			t.Fatalf("import %+v: %v", op, err)
		}
	}

	// Bad ids.
	if _, err := b.Apply(codec.Op{Op: "import", Transfer: "xyz"}).Float32s(ctx); err == nil || !strings.Contains(err.Error(), "hex") {
		t.Fatalf("bad transfer id: %v", err)
	}

	// A corrupted chunk: the digest check catches it. (A tensor over
	// 128 KiB: smaller ones travel in their announcement, with no object.)
	id4 := "3123456789abcdef0123456789abcdef"
	y := a.Arange(0, 40000, 1)
	y.Expose(id4, 1)
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	nc, _ := nats.Connect(br.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	os, _ := js.ObjectStore(ctx, "FABRIC_XFER")
	info, err := os.GetInfo(ctx, "xfer-"+id4)
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := js.Stream(ctx, "OBJ_FABRIC_XFER")
	chunks := "$O.FABRIC_XFER.C." + info.NUID
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(chunks)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, chunks, make([]byte, 160000)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Apply(codec.Op{Op: "import", Transfer: id4, TimeoutMS: 60000}).Float32s(ctx); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("import of a corrupted transfer: %v", err)
	}
	// Forged announcements in FABRIC_CTRL: a chunk subject that is not a
	// token, a tensor over the limits, a dtype that does not exist.
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	// A well-formed inline announcement whose read list is missing, not
	// JSON, or full.
	inline := `{"max":1,"writer":"x","dtype":"f32","shape":"4","data":"AACAPwAAAEAAAEBAAACAQA=="}`
	for i, c := range []struct{ value, reads, want string }{
		{`{"max":1,"writer":"x","nuid":"a.b","dtype":"f32","shape":"4"}`, "", "chunk subject token"},
		{`{"max":1,"writer":"x","nuid":"ABC","dtype":"f32","shape":"1000000,1000000"}`, "", "limit"},
		{`{"max":1,"writer":"x","nuid":"ABC","dtype":"f99","shape":"4"}`, "", "not a tensor"},
		{`{"max":1,"writer":"x","nuid":"ABC","dtype":"f32","shape":"-4"}`, "", "shape"},
		{`{"max":1,"writer":"x","dtype":"f32","shape":"4","data":"AAAAAA=="}`, `{"readers":[]}`, "its announcement holds 4 bytes, f32 [4] needs 16"},
		{inline, "", "its writer made none"},
		{inline, `{"readers":`, "read list"},
		{inline, `{"readers":["someone/1/0"]}`, "already read 1 times"},
	} {
		id := fmt.Sprintf("4%031x", i)
		if c.reads != "" {
			if _, err := kv.Put(ctx, "xread.xfer-"+id, []byte(c.reads)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := kv.Put(ctx, "xfer.xfer-"+id, []byte(c.value)); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Apply(codec.Op{Op: "import", Transfer: id, TimeoutMS: 60000}).Float32s(ctx); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("import of forged announcement %s: %v, want %q", c.value, err, c.want)
		}
	}
	// An upload naming a chunk subject that is not a token.
	if _, err := b.Apply(codec.Op{Op: "upload", DType: "f32", Shape: []int{4}, Object: "upload-x", NUID: "a.b"}).Float32s(ctx); err == nil || !strings.Contains(err.Error(), "chunk subject token") {
		t.Errorf("upload with a bad chunk subject: %v", err)
	}

	// An upload whose writer gives up: the op fails with the writer's reason.
	st, err := objectstore.New(js, "FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	nuid := objectstore.NewNUID()
	up := b.Apply(codec.Op{Op: "upload", DType: "f32", Shape: []int{4}, Object: "upload-abandoned", NUID: nuid})
	b.Flush()
	if err := st.Abort(ctx, "upload-abandoned", nuid, "the disk is on fire"); err != nil {
		t.Fatal(err)
	}
	if _, err := up.Float32s(ctx); err == nil || !strings.Contains(err.Error(), "the disk is on fire") {
		t.Errorf("upload whose writer gave up: %v", err)
	}

	// The sessions still work.
	expect(t, "after", read(t, a.Full([]int{1}, 3)), 3)
	expect(t, "after", read(t, b.Full([]int{1}, 4)), 4)
}

func TestCollectives(t *testing.T) {
	_, c := devices(t, 4)
	ctx := context.Background()
	var ss []*client.Session
	var xs []*client.Tensor
	for r := range 4 {
		s := open(t, c, fmt.Sprintf("cpu-%d", r))
		s.Seed(uint64(r))
		ss = append(ss, s)
		xs = append(xs, s.Uniform([]int{4, 5}, -1, 1))
	}
	vals := make([][]float32, 4)
	for r := range xs {
		vals[r] = read(t, xs[r])
	}
	ref := func(f func(a, b float64) float64, div float64) []float64 {
		out := make([]float64, 20)
		for i := range out {
			acc := float64(vals[0][i])
			for r := 1; r < 4; r++ {
				acc = float64(float32(f(acc, float64(vals[r][i]))))
			}
			out[i] = acc / div
		}
		return out
	}
	sum := func(a, b float64) float64 { return a + b }
	for _, c := range []struct {
		reduce string
		f      func(a, b float64) float64
		div    float64
	}{{"sum", sum, 1}, {"mean", sum, 4}, {"max", math.Max, 1}, {"min", math.Min, 1}} {
		// Every algorithm gives every rank the bits of the default's rank 0.
		var first []float32
		for _, algo := range []string{"default", "naive", "scatter", "direct"} {
			var opts []client.CollectiveOption
			switch algo {
			case "naive":
				opts = append(opts, client.Naive())
			case "scatter":
				opts = append(opts, client.Scatter())
			case "direct":
				opts = append(opts, client.Direct())
			}
			out, err := client.AllReduce(c.reduce, xs, opts...)
			if err != nil {
				t.Fatal(err)
			}
			want := ref(c.f, c.div)
			if first == nil {
				first = read(t, out[0])
			}
			for r := range out {
				got := read(t, out[r])
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
						t.Fatalf("%s %s: rank %d differs from rank 0 of the default at %d", c.reduce, algo, r, i)
					}
					if math.Abs(float64(got[i])-want[i]) > 1e-5 {
						t.Fatalf("%s %s: rank %d [%d] = %v, want %v", c.reduce, algo, r, i, got[i], want[i])
					}
				}
			}
		}
	}
	g, err := client.AllGather(xs)
	if err != nil {
		t.Fatal(err)
	}
	all := read(t, g[2])
	for r := range 4 {
		for i := range 20 {
			if all[r*20+i] != vals[r][i] {
				t.Fatalf("all_gather [%d] wrong", r*20+i)
			}
		}
	}
	rs, err := client.ReduceScatter("sum", xs)
	if err != nil {
		t.Fatal(err)
	}
	full := ref(sum, 1)
	for r := range 4 {
		got := read(t, rs[r])
		for i := range got {
			if math.Abs(float64(got[i])-full[r*5+i]) > 1e-5 {
				t.Fatalf("reduce_scatter rank %d [%d] = %v, want %v", r, i, got[i], full[r*5+i])
			}
		}
	}
	bc, err := client.Broadcast(1, xs)
	if err != nil {
		t.Fatal(err)
	}
	for r := range 4 {
		got := read(t, bc[r])
		for i := range got {
			if got[i] != vals[1][i] {
				t.Fatalf("broadcast rank %d wrong", r)
			}
		}
	}
	// Bad groups are refused before anything is sent.
	if _, err := client.AllReduce("sum", []*client.Tensor{xs[0], ss[0].Full(nil, 1)}); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("two ranks on one device: %v", err)
	}
	if _, err := client.Broadcast(9, xs); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("root 9: %v", err)
	}
	_ = ctx
}

// TestCollectiveMissingRank: a rank that never joins makes the others fail
// after their timeout; no worker blocks forever.
func TestCollectiveMissingRank(t *testing.T) {
	_, c := devices(t, 3)
	ctx := context.Background()
	var outs []*client.Tensor
	group := "4123456789abcdef0123456789abcdef"
	for r := range 2 { // of 3
		s := open(t, c, fmt.Sprintf("cpu-%d", r))
		x := s.Full([]int{6}, float64(r))
		outs = append(outs, s.Apply(codec.Op{Op: "all_reduce", Group: group, Rank: r, Size: 3, TimeoutMS: 500}, x))
		s.Flush()
	}
	for r, o := range outs {
		if _, err := o.Float32s(ctx); err == nil || !strings.Contains(err.Error(), "waiting for rank") {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// The devices serve again.
	s := open(t, c, "cpu-0")
	expect(t, "after", read(t, s.Full([]int{1}, 1)), 1)
	// Bad attributes.
	for _, op := range []codec.Op{
		{Op: "all_reduce", Group: group, Rank: 3, Size: 3},
		{Op: "all_reduce", Group: "short", Rank: 0, Size: 1},
		{Op: "all_reduce", Group: group, Rank: 0, Size: 1, Reduce: "median"},
		{Op: "all_reduce", Group: group, Rank: 0, Size: 1, Algo: "ring"},
	} {
		if _, err := s.Apply(op, s.Full([]int{2}, 1)).Float32s(ctx); err == nil || !strings.Contains(err.Error(), "attr") {
			t.Errorf("%+v: %v", op, err)
		}
	}
}

func TestGradSync(t *testing.T) {
	_, c := devices(t, 2)
	a, b := open(t, c, "cpu-0"), open(t, c, "cpu-1")
	g, err := client.NewGradSync(2, 2, "mean")
	if err != nil {
		t.Fatal(err)
	}
	// Gradients become ready in different orders on the two ranks.
	if err := g.Submit(0, 1, a.Full([]int{3}, 1)); err != nil {
		t.Fatal(err)
	}
	if err := g.Submit(1, 0, b.Full([]int{2}, 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Synced(); err == nil {
		t.Error("synced before every rank submitted")
	}
	if err := g.Submit(1, 1, b.Full([]int{3}, 3)); err != nil {
		t.Fatal(err)
	}
	// Param 1 is summed while param 0 still waits for rank 0.
	if _, err := g.Reduced(0); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("param 0 reduced before rank 0 submitted it: %v", err)
	}
	for _, p := range []int{-1, 2} {
		if _, err := g.Reduced(p); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("Reduced(%d): %v", p, err)
		}
	}
	one, err := g.Reduced(1)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "param 1 rank 1, before param 0", read(t, one[1]), 2, 2, 2)
	if err := g.Submit(0, 0, a.Full([]int{2}, 20)); err != nil {
		t.Fatal(err)
	}
	if err := g.Submit(0, 0, a.Full([]int{2}, 20)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("second submit: %v", err)
	}
	r, err := g.Synced()
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "param 0 rank 1", read(t, r[0][1]), 15, 15)
	expect(t, "param 1 rank 0", read(t, r[1][0]), 2, 2, 2)
}

// TestTransferWriterStops: the source announces a transfer, writes part of
// it and stops (its process died). The target gives up on that chunk
// subject after the object timeout and follows the one a replacement
// announces when it replays the expose.
func TestTransferWriterStops(t *testing.T) {
	br := brokertest.Run(t)
	workertest.Run(t, br, workertest.CPUs(1), func(c *worker.Config) { c.ObjectTimeout = 300 * time.Millisecond })
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, _ := nats.Connect(br.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	st, err := objectstore.New(js, "FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	id := "5123456789abcdef0123456789abcdef"
	key, name := "xfer.xfer-"+id, "xfer-"+id
	dead := objectstore.NewNUID()
	if _, err := kv.Put(ctx, "xread."+name, []byte(`{"readers":[]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, key, []byte(`{"max":1,"writer":"ghost/7/0","nuid":"`+dead+`","dtype":"f32","shape":"4"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "$O.FABRIC_XFER.C."+dead, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	s := open(t, c, "cpu-0")
	y := s.Apply(codec.Op{Op: "import", Transfer: id, TimeoutMS: 30000})
	s.Flush()
	time.Sleep(time.Second) // past the object timeout: the target has given up on dead
	live := objectstore.NewNUID()
	if _, err := kv.Put(ctx, key, []byte(`{"max":1,"writer":"ghost/7/0","nuid":"`+live+`","dtype":"f32","shape":"4"}`)); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 16)
	for i, v := range []float32{1, 2, 3, 4} {
		b := math.Float32bits(v)
		data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	if _, err := st.Put(ctx, name, data, map[string]string{"dtype": "f32", "shape": "4"}, objectstore.WithNUID(live)); err != nil {
		t.Fatal(err)
	}
	got, err := y.Float32s(ctx)
	if err != nil {
		t.Fatalf("import after its writer stopped and another took over: %v", err)
	}
	expect(t, "imported", got, 1, 2, 3, 4)
}

// TestConcurrentIdenticalUploads: sessions on several clients upload the
// same bytes at once, each through the object store named by their digest;
// every one gets its tensor, bit for bit.
func TestConcurrentIdenticalUploads(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
	const n = 3 << 20 // f32: 12 MiB, over the inline limit
	data := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i%1000)))
	}
	var want float64
	for i := range n {
		want += float64(i % 1000)
	}
	for round := range 3 {
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		for k := range 5 {
			c, err := client.Connect(b.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				s, err := c.Open(ctx, "cpu-0")
				if err != nil {
					errs <- err
					return
				}
				defer s.Close(ctx)
				x, err := s.Upload(ctx, "f32", []int{n}, data)
				if err != nil {
					errs <- fmt.Errorf("round %d upload %d: %w", round, k, err)
					return
				}
				d, err := x.Cast("f64").Sum().Read(ctx)
				if err != nil {
					errs <- fmt.Errorf("round %d upload %d: %w", round, k, err)
					return
				}
				if v := math.Float64frombits(binary.LittleEndian.Uint64(d.Bytes)); v != want {
					errs <- fmt.Errorf("round %d upload %d: sum %v, want %v", round, k, v, want)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			return
		}
	}
}
