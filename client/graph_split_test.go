package client_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// inferOp is shape inference of a wire op, for SplitGraph.
func inferOp(op *codec.Op, in []codec.Placeholder) ([]codec.Placeholder, error) {
	metas := make([]kernels.Meta, len(in))
	for i, p := range in {
		dt, err := kernels.ParseDType(p.DType)
		if err != nil {
			return nil, err
		}
		metas[i] = kernels.Meta{DType: dt, Shape: p.Shape}
	}
	out, err := kernels.Infer(kernelOp(*op, 0), metas, kernels.DefaultLimits())
	if err != nil {
		return nil, err
	}
	ph := make([]codec.Placeholder, len(out))
	for i, m := range out {
		ph[i] = codec.Placeholder{DType: m.DType.String(), Shape: append([]int{}, m.Shape...)}
	}
	return ph, nil
}

// TestSplitGraphKeepsTheBits: random programs (without random ops, whose
// draws are keyed by the ids a replay mints), captured with scalars bound,
// cut at some of their outputs into two or three parts: the parts replayed
// in turn, with other ops between them, give the whole replay's outputs
// bit for bit, and leave the worker holding no tensor the parts handed on.
func TestSplitGraphKeepsTheBits(t *testing.T) {
	b := brokertest.Run(t)
	w := workertest.Run(t, b, workertest.CPUs(2))
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	shape := []int{4, 6}
	whole, split := open(t, c, "cpu-0"), open(t, c, "cpu-1")
	split.Seed(1) // a session's first op; the session then holds nothing
	if err := split.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	before := workertest.TensorBytes(t, w, "cpu-1")
	tried, parts, handed, early := 0, 0, 0, 0
	for seed := range uint64(16) {
		r := rand.New(rand.NewPCG(seed, 3))
		data := make([][]float32, 2)
		for i := range data {
			data[i] = make([]float32, 24)
			for j := range data[i] {
				data[i][j] = float32(r.NormFloat64())
			}
		}
		scalars := []float64{r.Float64(), 1 + r.Float64(), 0.5}
		progSeed := r.Uint64()
		g := c.NewGraph()
		gin := []*client.Tensor{g.Input("f32", shape), g.Input("f32", shape)}
		sc := []client.Scalar{g.Scalar(0.5), g.Scalar(2), g.Scalar(0.5)}
		gout := randomProgram(g.Session(), rand.New(rand.NewPCG(progSeed, 1)), gin, []float64{0.5, 2, 0.5}, func(t *client.Tensor, attr string, j int) {
			if err := g.Bind(t, attr, sc[j]); err != nil {
				panic(err)
			}
		}, false)
		def, err := g.Define(ctx, gout...)
		if err != nil {
			t.Fatal(err)
		}
		// Some of these cuts leave a part empty in some programs.
		var sp *client.GraphSplit
		tries := [][][]int{{{int(seed % 3)}}, {{2}, {0}}, {{0, 1}}, {{1}}}
		if seed%2 == 0 {
			tries[0], tries[1] = tries[1], tries[0] // three parts first
		}
		for _, cuts := range tries {
			if seed%4 < 2 {
				sp, err = client.SplitGraph(def, inferOp, cuts...)
			} else {
				// An early part first: the ops before the first that
				// reads the second input.
				sp, err = client.SplitGraphEarly(def, inferOp, reads(2), cuts...)
			}
			if err == nil {
				break
			}
			if !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "empty") && !strings.Contains(err.Error(), "no op to the last part") {
				t.Fatalf("seed %d: cuts %v: %v", seed, cuts, err)
			}
		}
		if sp == nil {
			continue
		}
		tried++
		parts += len(sp.Parts)
		if sp.Early {
			early++
			if slices.Contains(sp.Parts[0].Inputs, client.PartInput{Part: -1, Index: 1}) {
				t.Fatalf("seed %d: the early part reads the late input", seed)
			}
		}
		for _, p := range sp.Parts {
			if slices.ContainsFunc(p.Inputs, func(in client.PartInput) bool { return in.Part >= 0 }) {
				handed++
			}
		}
		for _, p := range sp.Parts {
			if err := c.StoreGraph(ctx, p.Def); err != nil {
				t.Fatal(err)
			}
		}

		win := []*client.Tensor{whole.FromFloat32(shape, data[0]), whole.FromFloat32(shape, data[1])}
		want := whole.Replay(def, win, scalars...)
		sin := []*client.Tensor{split.FromFloat32(shape, data[0]), split.FromFloat32(shape, data[1])}
		rp := split.ReplaySplit(sp, sin, scalars...)
		got := make([]*client.Tensor, len(want))
		var between []*client.Tensor
		for !rp.Done() {
			outs := rp.Next()
			for j, o := range outs {
				if o == nil {
					continue
				}
				if got[j] != nil {
					t.Fatalf("seed %d: output %d made by two parts", seed, j)
				}
				got[j] = o
				between = append(between, o.Neg()) // ops between the parts
			}
		}
		if rp.Next() != nil {
			t.Fatalf("seed %d: Next after the last part queued a replay", seed)
		}
		for j := range want {
			if got[j] == nil {
				t.Fatalf("seed %d: no part makes output %d", seed, j)
			}
			wd, err := want[j].Read(ctx)
			if err != nil {
				t.Fatalf("seed %d: whole output %d: %v", seed, j, err)
			}
			gd, err := got[j].Read(ctx)
			if err != nil {
				t.Fatalf("seed %d: split output %d: %v", seed, j, err)
			}
			if !bytes.Equal(wd.Bytes, gd.Bytes) || !slices.Equal(wd.Shape, gd.Shape) {
				t.Fatalf("seed %d: output %d differs:\nwhole %v\nsplit %v", seed, j, read(t, want[j]), read(t, got[j]))
			}
		}
		for _, ts := range [][]*client.Tensor{want, win, got, sin, between} {
			for _, x := range ts {
				x.Free()
			}
		}
		if err := split.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if held := workertest.TensorBytes(t, w, "cpu-1"); held != before {
			t.Fatalf("seed %d: the session holds %v bytes after the split replay, %v before", seed, held, before)
		}
	}
	if tried < 12 {
		t.Fatalf("only %d of 16 programs could be cut", tried)
	}
	if parts == 2*tried || handed == 0 || early == 0 {
		t.Fatalf("%d programs cut into %d parts, %d of which read tensors of earlier parts, %d with an early part: want some cut in three, some handed on and some early parts", tried, parts, handed, early)
	}
	t.Logf("%d programs cut into %d parts, %d of which read tensors of earlier parts, %d with an early part", tried, parts, handed, early)
}

// TestSplitGraphCutsTheBackward: a forward and backward by hand, cut at
// the last layer's gradient: the first part holds the forward (random
// draws included: it keeps the whole's ids) and the last layer's
// gradient, the second the first layer's; the outputs are the whole's bit
// for bit, and the parts hand on the tensors the second reads.
func TestSplitGraphCutsTheBackward(t *testing.T) {
	_, c := fabric(t)
	ctx := context.Background()
	g := c.NewGraph()
	s := g.Session()
	x, w1, w2 := g.Input("f32", []int{4, 6}), g.Input("f32", []int{6, 5}), g.Input("f32", []int{5, 3})
	// Forward: h = relu(x w1) * dropout mask; y = h w2; loss = sum(y).
	mask := s.Apply(codec.Op{Op: "bernoulli", Shape: []int{4, 5}, P: 0.5, DType: "f32"})
	a := x.Matmul(w1)
	h := a.Relu().Mul(mask)
	y := h.Matmul(w2)
	loss := y.Reduce("sum", false)
	// Backward: dy = ones; dw2 = h^T dy; dh = dy w2^T; da = dh*mask*(a>0); dw1 = x^T da.
	dy := s.Full([]int{4, 3}, 1)
	dw2 := h.Permute(1, 0).Matmul(dy)
	dh := dy.Matmul(w2.Permute(1, 0)).Mul(mask)
	da := s.Apply(codec.Op{Op: "where"}, s.Apply(codec.Op{Op: "gt"}, a, s.Full([]int{4, 5}, 0)), dh, s.Full([]int{4, 5}, 0))
	dw1 := x.Permute(1, 0).Matmul(da)
	def, err := g.Define(ctx, loss, dw2, dw1)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := client.SplitGraph(def, inferOp, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(sp.Parts) != 2 || !slices.Equal(sp.Parts[0].Outputs[:2], []int{0, 1}) || !slices.Equal(sp.Parts[1].Outputs, []int{2}) {
		t.Fatalf("parts' outputs %v and %v", sp.Parts[0].Outputs, sp.Parts[1].Outputs)
	}
	// The second part reads x and w2 and, from the first, the mask, a and dy.
	p1 := sp.Parts[1]
	var fromFirst int
	for _, in := range p1.Inputs {
		if in.Part == 0 {
			fromFirst++
			if sp.Parts[0].Outputs[in.Index] != -1 {
				t.Fatalf("the second part reads output %d of the first, a whole output", in.Index)
			}
		}
	}
	if !slices.Contains(p1.Inputs, client.PartInput{Part: -1, Index: 0}) || !slices.Contains(p1.Inputs, client.PartInput{Part: -1, Index: 2}) ||
		slices.Contains(p1.Inputs, client.PartInput{Part: -1, Index: 1}) || fromFirst != 3 {
		t.Fatalf("second part's inputs %v", p1.Inputs)
	}
	for _, p := range sp.Parts {
		if err := c.StoreGraph(ctx, p.Def); err != nil {
			t.Fatal(err)
		}
	}
	run := func(dev string, splitIt bool) [][]byte {
		s := open(t, c, dev)
		s.Seed(7)
		r := rand.New(rand.NewPCG(1, 2))
		vals := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(r.NormFloat64())
			}
			return v
		}
		in := []*client.Tensor{s.FromFloat32([]int{4, 6}, vals(24)), s.FromFloat32([]int{6, 5}, vals(30)), s.FromFloat32([]int{5, 3}, vals(15))}
		var outs []*client.Tensor
		if splitIt {
			rp := s.ReplaySplit(sp, in)
			first := rp.Next()
			// Read the first part's outputs before the second is queued.
			if _, err := first[1].Read(ctx); err != nil {
				t.Fatal(err)
			}
			second := rp.Next()
			outs = []*client.Tensor{first[0], first[1], second[2]}
		} else {
			outs = s.Replay(def, in)
		}
		var bits [][]byte
		for _, o := range outs {
			d, err := o.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			bits = append(bits, d.Bytes)
		}
		return bits
	}
	want, got := run("cpu-0", false), run("cpu-1", true)
	for j := range want {
		if !bytes.Equal(want[j], got[j]) {
			t.Fatalf("output %d differs", j)
		}
	}
}

// TestSplitGraphRefusesBadInput: SplitGraph names what is wrong with its
// arguments, and a split replay with the wrong number of inputs fails
// the session's next wait.
func TestSplitGraphRefusesBadInput(t *testing.T) {
	_, c := fabric(t)
	ctx := context.Background()
	g := c.NewGraph()
	x := g.Input("f32", []int{4, 6})
	a := x.Exp()
	parts := g.Session().ApplyN(codec.Op{Op: "split", Axis: 1, Sizes: []int{2, 4}}, 2, a)
	b := x.Neg()
	def, err := g.Build(parts[0], parts[1], b)
	if err != nil {
		t.Fatal(err)
	}
	freedOut := c.NewGraph()
	fx := freedOut.Input("f32", []int{2})
	fy := fx.Neg()
	fy.Free()
	freedDef, err := freedOut.Build(fy)
	if err != nil {
		t.Fatal(err)
	}
	phOut := c.NewGraph()
	px := phOut.Input("f32", []int{2})
	phDef, err := phOut.Build(px.Neg(), px)
	if err != nil {
		t.Fatal(err)
	}
	renumbered := *def
	renumbered.Def.Ops = slices.Clone(def.Def.Ops)
	renumbered.Def.Ops[1].Out = []uint64{7, 8}
	unknown := *def
	unknown.Def.Ops = slices.Clone(def.Def.Ops)
	unknown.Def.Ops[2].In = []uint64{42}
	refuse := func(*codec.Op, []codec.Placeholder) ([]codec.Placeholder, error) {
		return nil, errors.New("no inference here")
	}
	tests := []struct {
		name  string
		def   *client.GraphDef
		infer client.InferFunc
		cuts  [][]int
		want  string
	}{
		{"nil definition", nil, inferOp, [][]int{{0}}, "needs a definition"},
		{"nil infer", def, nil, [][]int{{0}}, "infer function"},
		{"no cut", def, inferOp, nil, "no cut"},
		{"empty cut", def, inferOp, [][]int{{}}, "cut 0 names no output"},
		{"unknown output", def, inferOp, [][]int{{3}}, "cut 0 names output 3; the graph has 3"},
		{"negative output", def, inferOp, [][]int{{-1}}, "names output -1"},
		{"output twice in a cut", def, inferOp, [][]int{{0, 0}}, "output 0 is named twice"},
		{"output twice across cuts", def, inferOp, [][]int{{2}, {2}}, "output 2 is named twice"},
		{"empty part", def, inferOp, [][]int{{0}, {1}}, "cut 1: earlier parts make all its outputs"},
		{"empty last part", def, inferOp, [][]int{{0, 2}}, "no op to the last part"},
		{"placeholder output", phDef, inferOp, [][]int{{0}}, "output 1 is id 1, which no op of the graph makes"},
		{"freed output", freedDef, inferOp, [][]int{{0}}, "which the graph frees"},
		{"not canonical", &renumbered, inferOp, [][]int{{0}}, "op 1 (split) output 0 has id 7, not the next id 3"},
		{"unknown id", &unknown, inferOp, [][]int{{0}}, "op 2 (neg) reads id 42"},
		{"inference fails", def, refuse, [][]int{{0}}, "op 0 (exp): no inference here"},
	}
	if sp, err := client.SplitGraphEarly(def, inferOp, nil, []int{2}); sp != nil || !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "no late function") {
		t.Fatalf("split with no late function: %v, %v", sp, err)
	}
	// Every op reads the late input: no early part, the split is SplitGraph's.
	if sp, err := client.SplitGraphEarly(def, inferOp, reads(1), []int{2}); err != nil || sp.Early || len(sp.Parts) != 2 {
		t.Fatalf("split with every op late: %+v, %v; want two parts and no early one", sp, err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, err := client.SplitGraph(tt.def, tt.infer, tt.cuts...)
			if sp != nil || !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("split %v, err %v: want ErrInvalidArgument with %q", sp, err, tt.want)
			}
		})
	}

	// A good cut of the same graph, replayed with one input too many.
	sp, err := client.SplitGraph(def, inferOp, []int{2})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range sp.Parts {
		if err := c.StoreGraph(ctx, p.Def); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, c, "cpu-0")
	in := s.FromFloat32([]int{4, 6}, make([]float32, 24))
	rp := s.ReplaySplit(sp, []*client.Tensor{in, in})
	for !rp.Done() {
		rp.Next()
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.Sync(sctx); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "takes 1 inputs, 2 given") {
		t.Fatalf("sync after a split replay with 2 inputs: %v", err)
	}
}

// TestSplitGraphEarlyRebind: the early part of a split replay runs before
// the late input exists; the input is bound to its tensor afterwards, and
// the later parts read that one. An input the early part read cannot be
// bound again.
func TestSplitGraphEarlyRebind(t *testing.T) {
	_, c := fabric(t)
	ctx := context.Background()
	g := c.NewGraph()
	x, w := g.Input("f32", []int{3}), g.Input("f32", []int{3})
	y := x.Exp().Add(w)
	def, err := g.Build(y, y.Neg())
	if err != nil {
		t.Fatal(err)
	}
	sp, err := client.SplitGraphEarly(def, inferOp, reads(2), []int{0})
	if err != nil {
		t.Fatal(err)
	}
	if !sp.Early || len(sp.Parts) != 3 || len(sp.Parts[0].Def.Def.Ops) != 1 {
		t.Fatalf("split: early %v, %d parts, the first of %d ops; want an early part of the exp and 3 parts", sp.Early, len(sp.Parts), len(sp.Parts[0].Def.Def.Ops))
	}
	for _, p := range sp.Parts {
		if err := c.StoreGraph(ctx, p.Def); err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, c, "cpu-0")
	in := s.FromFloat32([]int{3}, []float32{0, 1, 2})
	stale := s.FromFloat32([]int{3}, []float32{100, 100, 100})
	rp := s.ReplaySplit(sp, []*client.Tensor{in, stale})
	rp.Next() // the exp, before w's tensor is made
	late := s.FromFloat32([]int{3}, []float32{1, 2, 3})
	if err := rp.Rebind(0, late); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "part 0, queued, read it") {
		t.Fatalf("rebind of the input the early part read: %v", err)
	}
	for _, i := range []int{-1, 2} {
		if err := rp.Rebind(i, late); !errors.Is(err, client.ErrInvalidArgument) {
			t.Fatalf("rebind of placeholder %d: %v", i, err)
		}
	}
	if err := rp.Rebind(1, late); err != nil {
		t.Fatal(err)
	}
	var got []*client.Tensor
	for !rp.Done() {
		for _, o := range rp.Next() {
			if o != nil {
				got = append(got, o)
			}
		}
	}
	if len(got) != 2 {
		t.Fatalf("%d outputs, want 2", len(got))
	}
	v, err := got[0].Float32s(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{1 + 1, float32(math.Exp(1)) + 2, float32(math.Exp(2)) + 3} {
		if math.Abs(float64(v[i]-want)) > 1e-5 {
			t.Fatalf("exp(x) + w = %v: the later part did not read the rebound input", v)
		}
	}
}

// reads is a late function for SplitGraphEarly: an op is late when it
// reads the graph's id (a placeholder's).
func reads(id uint64) func(op *codec.Op) bool {
	return func(op *codec.Op) bool { return slices.Contains(op.In, id) }
}
