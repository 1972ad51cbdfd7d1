package client_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// randomStep builds a random program on s over inputs of shape [4, 6]
// f32: elementwise ops, reductions that broadcast back, matrix products,
// random ops and frees. scalars are its scalar values; bind, when not nil,
// binds the attribute of the op that made a tensor to scalar j (capture).
// The same r gives the same program on a live session and in a graph.
func randomStep(s *client.Session, r *rand.Rand, in []*client.Tensor, scalars []float64, bind func(*client.Tensor, string, int)) []*client.Tensor {
	return randomProgram(s, r, in, scalars, bind, true)
}

// randomProgram is randomStep, without the random ops (uniform, normal,
// bernoulli) unless random.
func randomProgram(s *client.Session, r *rand.Rand, in []*client.Tensor, scalars []float64, bind func(*client.Tensor, string, int), random bool) []*client.Tensor {
	shape := []int{4, 6}
	pool := slices.Clone(in)
	var made []*client.Tensor
	pick := func() *client.Tensor { return pool[r.IntN(len(pool))] }
	add := func(t *client.Tensor) {
		pool = append(pool, t)
		made = append(made, t)
	}
	for range 12 + r.IntN(20) {
		k := r.IntN(19)
		if !random && slices.Contains([]int{6, 7, 8, 18}, k) {
			continue
		}
		switch k {
		case 0:
			add(pick().Add(pick()))
		case 1:
			add(pick().Mul(pick()))
		case 2:
			add(pick().Sub(pick().Tanh()))
		case 3:
			add(s.Apply(codec.Op{Op: "sigmoid"}, pick()))
		case 4:
			add(pick().Sub(pick().Reduce("max", true, 1)))
		case 5:
			add(pick().Matmul(pick().Permute(1, 0)).Matmul(pick()))
		case 6:
			u := s.Uniform(shape, -1, scalars[1])
			if bind != nil {
				bind(u, "high", 1)
			}
			add(u)
		case 7:
			add(s.Normal(shape, 0, 1).Mul(pick()))
		case 8:
			m := s.Apply(codec.Op{Op: "bernoulli", Shape: shape, P: 0.5, DType: "f32"})
			add(pick().Mul(m))
		case 9:
			f := s.Full(shape, scalars[0])
			if bind != nil {
				bind(f, "value", 0)
			}
			add(pick().Mul(f))
		case 10:
			// Free a tensor made here that is not among the last three.
			if len(made) > 4 {
				j := r.IntN(len(made) - 3)
				t := made[j]
				made = slices.Delete(made, j, j+1)
				pool = slices.DeleteFunc(pool, func(u *client.Tensor) bool { return u == t })
				t.Free()
			}
		case 11:
			add(s.Apply(codec.Op{Op: "log1p"}, pick().Exp()))
		case 12:
			// Several outputs: split in two along the columns, join again.
			parts := s.ApplyN(codec.Op{Op: "split", Axis: 1, Sizes: []int{2, 4}}, 2, pick())
			add(s.Apply(codec.Op{Op: "concat", Axis: 1}, parts[1], parts[0]))
			parts[0].Free()
			parts[1].Free()
		case 13:
			a, b := pick(), pick()
			add(s.Apply(codec.Op{Op: "where"}, s.Apply(codec.Op{Op: "gt"}, a, b), a, b))
		case 14:
			add(s.Apply(codec.Op{Op: "softmax", Axis: -1}, pick()))
		case 15:
			add(pick().Cast("f16").Cast("f32"))
		case 16:
			add(s.Apply(codec.Op{Op: "layer_norm"}, pick()).Reshape(6, 4).Reshape(4, 6))
		case 17:
			x := s.Apply(codec.Op{Op: "slice", Starts: []int{1, 0}, Ends: []int{3, 6}}, pick())
			add(s.Apply(codec.Op{Op: "pad", Pads: []int{1, 1, 0, 0}, Value: 0.5}, x))
		case 18:
			// p is scalar 2, out of [0, 1] in some runs: an error when
			// the op runs, and what reads the mask fails.
			m := s.Apply(codec.Op{Op: "bernoulli", Shape: shape, P: scalars[2], DType: "f32"})
			if bind != nil {
				bind(m, "p", 2)
			}
			add(pick().Add(m))
		}
	}
	for len(made) < 3 {
		made = append(made, pick().Neg())
	}
	return made[len(made)-3:]
}

func TestReplayEqualsOpByOp(t *testing.T) {
	_, c := fabric(t)
	ctx := context.Background()
	failures := 0
	for seed := range uint64(10) {
		r := rand.New(rand.NewPCG(seed, 7))
		data := make([][]float32, 2)
		for i := range data {
			data[i] = make([]float32, 24)
			for j := range data[i] {
				data[i][j] = float32(r.NormFloat64())
			}
		}
		scalars := []float64{r.Float64(), 1 + r.Float64(), []float64{0.25, 1.5}[seed%2]}
		progSeed := r.Uint64()

		// Op by op.
		a := open(t, c, "cpu-0")
		a.Seed(99)
		ain := []*client.Tensor{a.FromFloat32([]int{4, 6}, data[0]), a.FromFloat32([]int{4, 6}, data[1])}
		want := randomStep(a, rand.New(rand.NewPCG(progSeed, 1)), ain, scalars, nil)

		// Captured with other scalars, replayed with these.
		g := c.NewGraph()
		gin := []*client.Tensor{g.Input("f32", []int{4, 6}), g.Input("f32", []int{4, 6})}
		s0, s1, s2 := g.Scalar(0.5), g.Scalar(2), g.Scalar(0.5)
		gout := randomStep(g.Session(), rand.New(rand.NewPCG(progSeed, 1)), gin, []float64{0.5, 2, 0.5}, func(t *client.Tensor, attr string, j int) {
			if err := g.Bind(t, attr, []client.Scalar{s0, s1, s2}[j]); err != nil {
				panic(err)
			}
		})
		def, err := g.Define(ctx, gout...)
		if err != nil {
			t.Fatal(err)
		}
		b := open(t, c, "cpu-1")
		b.Seed(99)
		bin := []*client.Tensor{b.FromFloat32([]int{4, 6}, data[0]), b.FromFloat32([]int{4, 6}, data[1])}
		got := b.Replay(def, bin, scalars...)
		for j := range want {
			if got[j].ID() != want[j].ID() {
				t.Errorf("seed %d: output %d has id %d in the replay, %d op by op", seed, j, got[j].ID(), want[j].ID())
			}
			wd, werr := want[j].Read(ctx)
			gd, gerr := got[j].Read(ctx)
			if werr != nil || gerr != nil {
				// The same failure: the same op and code, the replay's
				// message naming the op of the graph.
				var we, ge *codec.Error
				if !errors.As(werr, &we) || !errors.As(gerr, &ge) || we.Op != ge.Op || we.Code != ge.Code || !strings.Contains(ge.Message, "graph "+def.Name[:12]+" op ") {
					t.Fatalf("seed %d: output %d: op by op %v, replay %v", seed, j, werr, gerr)
				}
				failures++
				continue
			}
			if !bytes.Equal(wd.Bytes, gd.Bytes) || !slices.Equal(wd.Shape, gd.Shape) {
				t.Fatalf("seed %d: output %d differs:\nop by op %v\nreplay   %v", seed, j, read(t, want[j]), read(t, got[j]))
			}
		}
	}
	t.Logf("%d reads failed alike", failures)
}

// TestReplayAfterTakeover: a worker dies after running replays; a standby
// takes the device over and replays its stream, loading the graph from the
// bucket; the outputs, and a replay after the takeover, have the bits of
// the same ops sent one by one.
func TestReplayAfterTakeover(t *testing.T) {
	b := brokertest.Run(t)
	fast := func(id string) func(*worker.Config) {
		return func(c *worker.Config) {
			c.ID, c.LeaseTTL, c.CheckpointInterval, c.Heartbeat = id, 200*time.Millisecond, 0, 100*time.Millisecond
		}
	}
	// The first worker, on a connection of its own that the test cuts.
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.Devices, cfg.Logf = workertest.CPUs(1), t.Logf
	fast("first")(&cfg)
	first, err := worker.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background()) })
	workertest.Run(t, b, workertest.CPUs(1), fast("second")) // the standby
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	data := [][]float32{make([]float32, 24), make([]float32, 24)}
	for i := range data[0] {
		data[0][i], data[1][i] = float32(i)/10, 1-float32(i)/20
	}
	shape := []int{4, 6}
	scalars := []float64{0.25, 1.5, 0.5}
	const progSeed = 11
	g := c.NewGraph()
	gin := []*client.Tensor{g.Input("f32", shape), g.Input("f32", shape)}
	s0, s1, s2 := g.Scalar(0.5), g.Scalar(2), g.Scalar(0.5)
	gout := randomStep(g.Session(), rand.New(rand.NewPCG(progSeed, 1)), gin, []float64{0.5, 2, 0.5}, func(t *client.Tensor, attr string, j int) {
		_ = g.Bind(t, attr, []client.Scalar{s0, s1, s2}[j])
	})
	def, err := g.Define(ctx, gout...)
	if err != nil {
		t.Fatal(err)
	}
	// step runs the program three times, chained, replayed or op by op.
	step := func(s *client.Session, replay bool, mid func()) [][]byte {
		s.Seed(5)
		x := []*client.Tensor{s.FromFloat32(shape, data[0]), s.FromFloat32(shape, data[1])}
		var bits [][]byte
		for k := range 3 {
			var out []*client.Tensor
			if replay {
				out = s.Replay(def, x, scalars...)
			} else {
				out = randomStep(s, rand.New(rand.NewPCG(progSeed, 1)), x, scalars, nil)
			}
			x = out[1:]
			d, err := out[0].Read(ctx)
			if err != nil {
				t.Fatalf("step %d: %v", k, err)
			}
			bits = append(bits, d.Bytes)
			if k == 1 && mid != nil {
				mid()
				// Read again what the dead worker computed.
				d, err := out[0].Read(ctx)
				if err != nil || !bytes.Equal(d.Bytes, bits[k]) {
					t.Fatalf("step %d read again after the takeover: %v, bits differ: %v", k, err, !bytes.Equal(d.Bytes, bits[k]))
				}
			}
		}
		return bits
	}
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	got := step(s, true, func() { nc.Close() }) // the first worker is cut off
	clean, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	want := step(clean, false, nil)
	for k := range want {
		if !bytes.Equal(got[k], want[k]) {
			t.Errorf("step %d: the replays across a takeover differ from the ops one by one", k)
		}
	}
}
