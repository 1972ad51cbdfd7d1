package client_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// fabric starts a broker and a worker serving cpu-0 and cpu-1, and returns
// a client connected over TCP.
func fabric(t testing.TB, opts ...client.Option) (*broker.Broker, *client.Client) {
	t.Helper()
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(2), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
	c, err := client.Connect(b.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return b, c
}

func open(t testing.TB, c *client.Client, device string) *client.Session {
	t.Helper()
	s, err := c.Open(context.Background(), device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func read(t testing.TB, x *client.Tensor) []float32 {
	t.Helper()
	v, err := x.Float32s(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Max(1, math.Abs(b)) }

func expect(t *testing.T, what string, got []float32, want ...float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
	for i := range got {
		if !near(float64(got[i]), want[i]) {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
	}
}

func TestDevices(t *testing.T) {
	_, c := fabric(t)
	devs, err := c.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Name != "cpu-0" || devs[1].Name != "cpu-1" || !client.Live(devs[0], time.Now()) {
		t.Fatalf("devices %+v", devs)
	}
	if _, err := c.Open(context.Background(), "gpu-7"); !errors.Is(err, client.ErrNoDevice) {
		t.Errorf("open of a missing device: %v", err)
	}
	if _, err := c.Open(context.Background(), "cpu.0"); err == nil {
		t.Error("opened a device with a dot in its name")
	}
}

func TestOps(t *testing.T) {
	_, c := fabric(t)
	s := open(t, c, "cpu-0")
	a := s.FromFloat32([]int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	row := s.FromFloat32([]int{3}, []float32{10, 20, 30})
	expect(t, "add broadcast", read(t, a.Add(row)), 11, 22, 33, 14, 25, 36)
	expect(t, "sub", read(t, a.Sub(row)), -9, -18, -27, -6, -15, -24)
	expect(t, "mul", read(t, a.Mul(s.Full(nil, 2))), 2, 4, 6, 8, 10, 12)
	expect(t, "div", read(t, row.Div(s.Full([]int{1}, 10))), 1, 2, 3)
	expect(t, "neg", read(t, row.Neg()), -10, -20, -30)
	expect(t, "exp log", read(t, a.Log().Exp()), 1, 2, 3, 4, 5, 6)
	expect(t, "sqrt", read(t, s.FromFloat32([]int{2}, []float32{4, 9}).Sqrt()), 2, 3)
	expect(t, "relu", read(t, s.FromFloat32([]int{3}, []float32{-1, 0, 2}).Relu()), 0, 0, 2)
	expect(t, "tanh", read(t, s.FromFloat32([]int{1}, []float32{0.5}).Tanh()), math.Tanh(0.5))
	expect(t, "sum all", read(t, a.Sum()), 21)
	expect(t, "sum axis 0", read(t, a.Sum(0)), 5, 7, 9)
	expect(t, "mean axis -1", read(t, a.Mean(-1)), 2, 5)
	expect(t, "max axis 1 keepdims", read(t, a.Reduce("max", true, 1)), 3, 6)
	expect(t, "matmul", read(t, a.Matmul(a.Permute(1, 0))), 14, 32, 32, 77)
	expect(t, "reshape", read(t, a.Reshape(3, -1).Sum(1)), 3, 7, 11)
	expect(t, "arange", read(t, s.Arange(0, 5, 2)), 0, 2, 4)
	expect(t, "cast round trip", read(t, s.FromFloat32([]int{2}, []float32{1.7, -2.2}).Cast("i32").Cast("f32")), 1, -2)
	// Batched matmul: [2,2,2] x [2,2].
	batch := s.FromFloat32([]int{2, 2, 2}, []float32{1, 0, 0, 1, 2, 0, 0, 2})
	m := s.FromFloat32([]int{2, 2}, []float32{1, 2, 3, 4})
	expect(t, "batched matmul", read(t, batch.Matmul(m)), 1, 2, 3, 4, 2, 4, 6, 8)
	d, err := batch.Matmul(m).Read(context.Background())
	if err != nil || d.DType != "f32" || len(d.Shape) != 3 || d.Shape[0] != 2 {
		t.Fatalf("read meta %+v %v", d, err)
	}
	if _, err := a.Cast("i32").Float32s(context.Background()); !errors.Is(err, client.ErrDType) {
		t.Errorf("Float32s of an i32 tensor: %v", err)
	}
}

func TestRandomIsDeterministic(t *testing.T) {
	_, c := fabric(t)
	run := func(device string) []float32 {
		s := open(t, c, device)
		s.Seed(1234)
		s.Full([]int{1}, 0) // ids are part of the key: same program, same ids
		return read(t, s.Uniform([]int{64}, -1, 1).Add(s.Normal([]int{64}, 0, 1)))
	}
	x, y, z := run("cpu-0"), run("cpu-0"), run("cpu-1")
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) || math.Float32bits(x[i]) != math.Float32bits(z[i]) {
			t.Fatalf("element %d differs: %v %v %v", i, x[i], y[i], z[i])
		}
	}
	s := open(t, c, "cpu-0")
	s.Seed(99)
	s.Full([]int{1}, 0)
	w := read(t, s.Uniform([]int{64}, -1, 1).Add(s.Normal([]int{64}, 0, 1)))
	if w[0] == x[0] && w[1] == x[1] {
		t.Error("another seed gave the same numbers")
	}
}

// TestOrdering runs 10,000 dependent ops whose result is exact only if they
// ran in order.
func TestOrdering(t *testing.T) {
	_, c := fabric(t)
	s := open(t, c, "cpu-0")
	x := s.Full([]int{1}, 0)
	one, two := s.Full([]int{1}, 1), s.Full([]int{1}, 2)
	want := 0.0
	for i := range 10000 {
		if i%3 == 2 {
			x = x.Mul(two)
			want *= 2
		} else {
			x = x.Add(one)
			want++
		}
		if want > 1e6 {
			x = x.Sub(s.Full([]int{1}, 1e6))
			want -= 1e6
		}
	}
	expect(t, "chain", read(t, x), want)
}

func TestErrorsSurfaceOnRead(t *testing.T) {
	_, c := fabric(t)
	s := open(t, c, "cpu-0")
	a := s.Full([]int{2, 3}, 1)
	bad := a.Add(s.Full([]int{4}, 1)) // does not broadcast
	good := a.Sum()
	// The bad op is reported on the next read, even of an unrelated tensor.
	if _, err := good.Float32s(context.Background()); err == nil || !strings.Contains(err.Error(), "op add") {
		t.Fatalf("next read after a bad op: %v", err)
	}
	expect(t, "read again", read(t, good), 6)
	if _, err := bad.Float32s(context.Background()); err == nil || !strings.Contains(err.Error(), "op add") {
		t.Fatalf("read of the bad op's output: %v", err)
	}
	s2 := open(t, c, "cpu-0")
	x := s2.Full([]int{2, 3}, 1)
	y := x.Add(s2.Full([]int{4}, 1)).Exp()
	_, err := y.Float32s(context.Background())
	var ce *codec.Error
	if !errors.As(err, &ce) || ce.Op != "add" || ce.Code != codec.CodeShape || !strings.Contains(err.Error(), "broadcast") {
		t.Fatalf("read of a tensor downstream of a bad add: %v", err)
	}
	// The error is reported once; the session goes on.
	if err := s2.Sync(context.Background()); err != nil {
		t.Fatalf("sync after the error was reported: %v", err)
	}
	expect(t, "after", read(t, x.Sum()), 6)
	// Mixing sessions is caught here, before anything is sent.
	z := x.Add(s.Full([]int{1}, 1))
	if _, err := z.Float32s(context.Background()); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("cross-session op: %v", err)
	}
	if _, err := s2.FromFloat32([]int{3}, []float32{1}).Float32s(context.Background()); !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("shape/data mismatch: %v", err)
	}
}

func TestSyncReportsErrors(t *testing.T) {
	_, c := fabric(t)
	s := open(t, c, "cpu-0")
	s.Full([]int{2}, 1).Matmul(s.Full([]int{3}, 1))
	err := s.Sync(context.Background())
	var ce *codec.Error
	if !errors.As(err, &ce) || ce.Op != "matmul" {
		t.Fatalf("sync: %v", err)
	}
	if err := s.Sync(context.Background()); err != nil {
		t.Fatalf("second sync: %v", err)
	}
}

func TestLargeTensorsGoThroughTheObjectStore(t *testing.T) {
	_, c := fabric(t, client.WithInlineUpload(64<<10))
	s := open(t, c, "cpu-0")
	n := 1 << 20 // 4 MiB of f32, over both inline limits
	data := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		v := math.Float32bits(float32(i % 1000))
		data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	ctx := context.Background()
	x, err := s.Upload(ctx, "f32", []int{n}, data)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(c.Conn())
	objects, err := js.ObjectStore(ctx, "FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	first, err := objects.GetInfo(ctx, "upload-"+hex.EncodeToString(sum[:]))
	if err != nil || first.Size != uint64(len(data)) {
		t.Fatalf("the upload is not named by its digest: %v", err)
	}
	// The same bytes again are stored once (named by their digest), and
	// the stored object is kept, not replaced: a worker may be reading its
	// chunks.
	y, err := s.Upload(ctx, "f32", []int{n}, data)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := objects.GetInfo(ctx, "upload-"+hex.EncodeToString(sum[:])); err != nil || info.NUID != first.NUID {
		t.Fatalf("the second upload replaced the first (chunks %s, then %s): %v", first.NUID, info.NUID, err)
	}
	st, err := js.Stream(ctx, "OBJ_FABRIC_XFER")
	if err != nil {
		t.Fatal(err)
	}
	si, err := st.Info(ctx, jetstream.WithSubjectFilter("$O.FABRIC_XFER.C.>"))
	if err != nil || len(si.State.Subjects) != 1 {
		t.Fatalf("two uploads of the same bytes left chunks on %d subjects (%v), want 1", len(si.State.Subjects), err)
	}
	z := x.Add(y).Add(s.Full(nil, 0.5))
	got := read(t, z)
	if len(got) != n || got[999] != 1998.5 || got[1000] != 0.5 {
		t.Fatalf("%d values, [999]=%v [1000]=%v", len(got), got[999], got[1000])
	}
	// 8 MiB comes back through the object store, the client copying the
	// chunks while the worker writes them.
	w := s.Arange(0, float64(2*n), 1)
	back := read(t, w)
	if len(back) != 2*n || back[0] != 0 || back[2*n-1] != float32(2*n-1) || back[123457] != 123457 {
		t.Fatalf("%d values read back, [123457]=%v", len(back), back[123457])
	}
}

func TestClosedSession(t *testing.T) {
	_, c := fabric(t)
	s, err := c.Open(context.Background(), "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Full([]int{1}, 1)
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Float32s(context.Background()); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
}

func TestBadOptions(t *testing.T) {
	for name, o := range map[string]client.Option{
		"prefix":    client.WithPrefix("a.b"),
		"delay":     client.WithFlushDelay(0),
		"frame":     client.WithMaxFrame(0, 1<<20),
		"bytes":     client.WithMaxFrame(10, 1<<30),
		"inline":    client.WithInlineUpload(100 << 20),
		"window0":   client.WithPublishWindow(0),
		"objects":   client.WithObjectTimeout(0),
		"heartbeat": client.WithHeartbeat(-time.Second),
		"device":    client.WithDeviceTimeout(-time.Second),
		"lanes0":    client.WithLanes(0),
		"lanes17":   client.WithLanes(17),
	} {
		if _, err := client.Connect("nats://127.0.0.1:1", o); !errors.Is(err, client.ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestReadAsksAgainWhenTheWriterStops: a large result whose writer stops
// mid-object (its worker died) is asked for again, and the second answer
// is the one returned. The device is served here by a stand-in for a
// worker, over the real broker, so that the first answer can stop.
func TestReadAsksAgainWhenTheWriterStops(t *testing.T) {
	br := brokertest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(br.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	entry, _ := json.Marshal(codec.Device{Name: "fake-0", Kind: "cpu", State: "serving", Beat: time.Now()})
	if _, err := kv.Put(ctx, "device.fake-0", entry); err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, "FABRIC_OPS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"fabric.ops.fake-0.>"}})
	if err != nil {
		t.Fatal(err)
	}
	var reads atomic.Int32
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var f codec.Frame
		if err := codec.Unmarshal(codec.CBOR, m.Data(), &f); err != nil {
			t.Errorf("stand-in: frame: %v", err)
			return
		}
		for _, op := range f.Ops {
			if op.Op != "read" {
				continue
			}
			res := codec.Result{V: codec.Version, Tag: op.Tag, Tensor: &codec.Tensor{DType: "f32", Shape: []int{2}}}
			if reads.Add(1) == 1 {
				// Announce the object, write half of it, and stop.
				nuid := objectstore.NewNUID()
				res.Tensor.Object, res.Tensor.NUID = "result-stalled", nuid
				if _, err := js.Publish(ctx, "$O.FABRIC_XFER.C."+nuid, make([]byte, 4)); err != nil {
					t.Errorf("stand-in: %v", err)
				}
			} else {
				res.Tensor.Data = []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40} // 1, 2
			}
			b, _ := codec.Marshal(codec.CBOR, &res)
			_ = nc.Publish(m.Headers().Get(subjects.HeaderReply), b)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	c, err := client.Connect(br.ClientURL(), client.WithObjectTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, "fake-0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Full([]int{2}, 0).Float32s(ctx)
	if err != nil {
		t.Fatalf("read whose first writer stopped: %v", err)
	}
	expect(t, "second answer", got, 1, 2)
	if n := reads.Load(); n != 2 {
		t.Errorf("the stand-in answered %d reads, want 2", n)
	}
}

// TestSessionLiveness: a client that beats keeps an idle session; one that
// does not (its process died, say) has it freed after the worker's idle
// timeout, and its next read says so.
func TestSessionLiveness(t *testing.T) {
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.IdleTimeout = time.Second
	})
	connect := func(opts ...client.Option) *client.Client {
		c, err := client.Connect(b.ClientURL(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alive, silent := connect(client.WithHeartbeat(50*time.Millisecond)), connect(client.WithHeartbeat(0))
	ctx := context.Background()
	sa, ss := open(t, alive, "cpu-0"), open(t, silent, "cpu-0")
	xa, xs := sa.Full([]int{2}, 3), ss.Full([]int{2}, 5)
	if err := sa.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ss.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait until the worker has freed one of the two sessions.
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		devs, err := alive.Devices(ctx)
		if err != nil || len(devs) != 1 || devs[0].Sessions != 1 {
			return fmt.Errorf("devices %+v, %v; want one session", devs, err)
		}
		return nil
	})
	expect(t, "the beating session", read(t, xa), 3, 3)
	if _, err := xs.Float32s(ctx); !errors.Is(err, client.ErrSessionFreed) {
		t.Fatalf("read on a freed session: %v, want ErrSessionFreed", err)
	}
}

// checkFor polls fn every step until it returns nil or total passes.
var checkFor = poll.Until

// TestNoWorkerFailsTheCall: a read on a device that no worker serves any
// more (its worker stopped, no standby) fails with ErrNoDevice after the
// device timeout, not at the caller's deadline.
func TestNoWorkerFailsTheCall(t *testing.T) {
	b := brokertest.Run(t)
	w := workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond })
	c, err := client.Connect(b.ClientURL(), client.WithDeviceTimeout(500*time.Millisecond), client.WithFrameCheck(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := open(t, c, "cpu-0")
	x := s.Full([]int{2}, 1)
	if err := s.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = x.Float32s(ctx)
	if !errors.Is(err, client.ErrNoDevice) || ctx.Err() != nil {
		t.Fatalf("read with no worker: %v after %v, want ErrNoDevice before the deadline", err, time.Since(start))
	}
	t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
}
