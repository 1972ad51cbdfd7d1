package worker_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// open opens a session on device, closed at the end of the test.
func open(t testing.TB, c *client.Client, device string) *client.Session {
	t.Helper()
	s, err := c.Open(context.Background(), device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

// metric is the sample of name for device on w.
func metric(t testing.TB, w *worker.Worker, name, device string) float64 {
	t.Helper()
	return workertest.Metric(t, w, name, device)
}

// programStep is the graph the program tests replay: a matmul, elementwise
// ops, a reduction, a permute and a reshape over x [4,6] and w [6,5], with
// x freed by the graph when free is set. It returns [sum over rows,
// relu(x@w)*2+1 permuted and flattened].
func programStep(s *client.Session, x, w *client.Tensor, free bool) []*client.Tensor {
	y := x.Matmul(w)
	if free {
		x.Free()
	}
	z := y.Relu().Mul(s.Full(nil, 2)).Add(s.Full(nil, 1))
	u := z.Exp().Neg().Add(z).Tanh()
	return []*client.Tensor{u.Sum(1), z.Permute(1, 0).Reshape(20)}
}

// checkPrograms replays programStep on device and sends the same ops one
// by one in another session of it: the same bits every time, replays run
// as programs (from the third on where exact is set: a backend may refuse
// a recording for now, as the CUDA backend does while a fused kernel it
// would use compiles), and nothing is left once the sessions close. Then
// the cases that must not run as programs.
func checkPrograms(t *testing.T, w *worker.Worker, c *client.Client, device string, exact bool) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	data := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	for _, free := range []bool{false, true} {
		g := c.NewGraph()
		gx, gw := g.Input("f32", []int{4, 6}), g.Input("f32", []int{6, 5})
		def, err := g.Define(ctx, programStep(g.Session(), gx, gw, free)...)
		if err != nil {
			t.Fatal(err)
		}
		rs, os := open(t, c, device), open(t, c, device)
		runs0 := metric(t, w, "jetfabric_device_program_replays_total", device)
		programs := func() float64 { return metric(t, w, "jetfabric_device_program_replays_total", device) - runs0 }
		const replays = 6
		for k := 0; k < replays || !exact && programs() < 3 && k < maxReplays; k++ {
			xd, wd := data(24), data(30)
			rx, rw := rs.FromFloat32([]int{4, 6}, xd), rs.FromFloat32([]int{6, 5}, wd)
			got := rs.Replay(def, []*client.Tensor{rx, rw})
			ox, ow := os.FromFloat32([]int{4, 6}, xd), os.FromFloat32([]int{6, 5}, wd)
			want := programStep(os, ox, ow, free)
			for j := range want {
				gd, err := got[j].Read(ctx)
				if err != nil {
					t.Fatalf("free=%v replay %d output %d: %v", free, k, j, err)
				}
				wdd, err := want[j].Read(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(gd.Bytes, wdd.Bytes) {
					t.Fatalf("free=%v replay %d output %d: replay %x, one by one %x", free, k, j, gd.Bytes, wdd.Bytes)
				}
				got[j].Free()
				want[j].Free()
			}
			// The graph's free of x holds in both.
			_, rerr := rx.Read(ctx)
			_, oerr := ox.Read(ctx)
			var re, oe *codec.Error
			if free {
				if !errors.As(rerr, &re) || !errors.As(oerr, &oe) || re.Code != codec.CodeUnknownID || oe.Code != re.Code {
					t.Fatalf("replay %d: reading x freed by the graph: %v, one by one %v", k, rerr, oerr)
				}
			} else if rerr != nil || oerr != nil {
				t.Fatalf("replay %d: reading x: %v, one by one %v", k, rerr, oerr)
			}
			rw.Free()
			ow.Free()
			if !free {
				rx.Free()
				ox.Free()
			}
		}
		if err := rs.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if n := programs(); exact && n != replays-2 || n < 3 {
			t.Errorf("free=%v: %v replays ran as programs, want %d (from the third on)", free, n, replays-2)
		}
		if n := metric(t, w, "jetfabric_device_programs", device); n != 1 {
			t.Errorf("free=%v: %v programs held, want 1", free, n)
		}
		if err := rs.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := os.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if n := metric(t, w, "jetfabric_device_programs", device); n != 0 {
			t.Errorf("after close: %v programs held", n)
		}
		if n := metric(t, w, "jetfabric_device_program_bytes", device); n != 0 {
			t.Errorf("after close: %v bytes of programs held", n)
		}
		if n := metric(t, w, "jetfabric_device_tensor_bytes", device); n != 0 {
			t.Errorf("after close: %v bytes of tensors held", n)
		}
	}

	// Replays that run op by op: a graph that draws from the generator,
	// one whose input failed, one whose internal id is taken; each as one
	// by one would end.
	t.Run("not programs", func(t *testing.T) {
		g := c.NewGraph()
		gx := g.Input("f32", []int{3})
		def, err := g.Define(ctx, gx.Add(g.Session().Normal([]int{3}, 0, 1)))
		if err != nil {
			t.Fatal(err)
		}
		s := open(t, c, device)
		s.Seed(5)
		runs0 := metric(t, w, "jetfabric_device_program_replays_total", device)
		var prev []byte
		for k := range 4 {
			x := s.FromFloat32([]int{3}, []float32{1, 2, 3})
			y := s.Replay(def, []*client.Tensor{x})[0]
			d, err := y.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if k > 0 && bytes.Equal(d.Bytes, prev) {
				t.Fatalf("replay %d drew what replay %d drew: a random graph must not be recorded", k, k-1)
			}
			prev = d.Bytes
		}
		if n := metric(t, w, "jetfabric_device_program_replays_total", device) - runs0; n != 0 {
			t.Errorf("%v replays of a random graph ran as programs", n)
		}

		// A graph recorded, then replayed on a failed input and on an
		// input freed: the errors of one by one.
		g = c.NewGraph()
		gx = g.Input("f32", []int{2})
		def, err = g.Define(ctx, gx.Mul(gx).Add(gx))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			x := s.FromFloat32([]int{2}, []float32{1, 2})
			y := s.Replay(def, []*client.Tensor{x})[0]
			if v, err := y.Float32s(ctx); err != nil || v[0] != 2 || v[1] != 6 {
				t.Fatalf("replay: %v %v", v, err)
			}
		}
		bad := s.FromFloat32([]int{2}, []float32{1, 2}).Reshape(3) // fails: 2 elements into 3
		y := s.Replay(def, []*client.Tensor{bad})[0]
		var e *codec.Error
		if _, err := y.Read(ctx); !errors.As(err, &e) || e.Code != codec.CodeShape && e.Code != codec.CodeFailedID {
			t.Fatalf("replay on a failed input: %v", err)
		}
		x := s.FromFloat32([]int{2}, []float32{1, 2})
		x.Free()
		y = s.Replay(def, []*client.Tensor{x})[0]
		if _, err := y.Read(ctx); !errors.As(err, &e) || e.Code != codec.CodeUnknownID {
			t.Fatalf("replay on a freed input: %v", err)
		}
		// Still a program afterwards (the next replay where exact is set).
		before := metric(t, w, "jetfabric_device_program_replays_total", device)
		for k := 0; ; k++ {
			x = s.FromFloat32([]int{2}, []float32{3, 4})
			y = s.Replay(def, []*client.Tensor{x})[0]
			if v, err := y.Float32s(ctx); err != nil || v[0] != 12 || v[1] != 20 {
				t.Fatalf("replay after the failures: %v %v", v, err)
			}
			n := metric(t, w, "jetfabric_device_program_replays_total", device) - before
			if n == 1 {
				break
			}
			if exact || k == maxReplays {
				t.Fatalf("%d replays after the failures ran %v times as a program, want 1", k+1, n)
			}
		}
	})
}

// maxReplays bounds the replays checkPrograms waits through for programs
// where a backend may refuse recordings for a while.
const maxReplays = 5000

// TestPrograms runs checkPrograms on a CPU device.
func TestPrograms(t *testing.T) {
	b := brokertest.Run(t)
	w := startWorker(t, b)
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	checkPrograms(t, w, c, "cpu-0", true)
}

// TestProgramLimit: a program runs only where the replay op by op would
// stay within the session's limit all along; over it, the replay runs op
// by op and fails as it would, though the program's outputs alone would
// fit.
func TestProgramLimit(t *testing.T) {
	b := brokertest.Run(t)
	w := startWorker(t, b, func(c *worker.Config) { c.Limits.MaxSessionBytes = 2000 })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	// Three products (which nothing fuses): two 400-byte tensors alive at
	// once on top of the input, op by op.
	g := c.NewGraph()
	gx := g.Input("f32", []int{10, 10})
	y := gx.Matmul(gx)
	def, err := g.Define(ctx, y.Matmul(y).Matmul(gx))
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, c, "cpu-0")
	x := s.FromFloat32([]int{10, 10}, make([]float32, 100))
	replay := func() error {
		out := s.Replay(def, []*client.Tensor{x})[0]
		_, err := out.Read(ctx)
		out.Free()
		return err
	}
	runs := func() float64 { return metric(t, w, "jetfabric_device_program_replays_total", "cpu-0") }
	for range 3 {
		if err := replay(); err != nil {
			t.Fatal(err)
		}
	}
	if runs() != 1 {
		t.Fatalf("%v replays ran as programs, want 1", runs())
	}
	// 400 (x) + 800 (filler) + 800 (the replay's peak) = 2000: fits.
	filler := s.FromFloat32([]int{200}, make([]float32, 200))
	if err := replay(); err != nil {
		t.Fatalf("replay at the limit: %v", err)
	}
	if runs() != 2 {
		t.Fatalf("the replay at the limit did not run as a program")
	}
	filler.Free()
	// 400 + 1000 + 800 > 2000 op by op, though 400 + 1000 + 400 for the
	// output alone would fit.
	s.FromFloat32([]int{250}, make([]float32, 250))
	err = replay()
	var e *codec.Error
	if !errors.As(err, &e) || e.Code != codec.CodeLimit && e.Code != codec.CodeFailedID {
		t.Fatalf("replay over the limit op by op: %v, want its limit error", err)
	}
	if runs() != 2 {
		t.Errorf("the replay over the limit ran as a program")
	}
}
