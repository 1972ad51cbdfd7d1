package worker_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// storeGraph encodes g, stores it under its name and returns the name.
func storeGraph(t testing.TB, b *broker.Broker, g *codec.Graph) string {
	t.Helper()
	data, name, err := codec.EncodeGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	storeRaw(t, b, name, data)
	return name
}

// storeRaw stores data under key in the graph bucket as it is.
func storeRaw(t testing.TB, b *broker.Broker, key string, data []byte) {
	t.Helper()
	r := newRaw(t, b, "fabric.ops.cpu-0.store")
	kv, err := r.js.KeyValue(context.Background(), "FABRIC_GRAPHS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), key, data); err != nil {
		t.Fatal(err)
	}
}

func frame(t testing.TB, ops ...codec.Op) []byte {
	t.Helper()
	b, err := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// affine is x*w + b over [2, 3] f32 placeholders, with w's fill a scalar.
func affine() *codec.Graph {
	return &codec.Graph{
		V:       codec.Version,
		Inputs:  []codec.Placeholder{{DType: "f32", Shape: []int{2, 3}}, {DType: "f32", Shape: []int{3}}},
		Scalars: 1,
		Ops: []codec.Op{
			{Op: "full", Out: []uint64{3}, Shape: []int{2, 3}, Value: 1},
			{Op: "mul", Out: []uint64{4}, In: []uint64{1, 3}},
			{Op: "add", Out: []uint64{5}, In: []uint64{4, 2}},
		},
		Outputs: []uint64{5},
		Binds:   []codec.Bind{{Op: 0, Attr: "value", Scalar: 0}},
	}
}

// TestReplayRefusesBadInput: every kind of bad replay and bad definition
// gets an error naming its cause, and the device serves on.
func TestReplayRefusesBadInput(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b)
	good := storeGraph(t, b, affine())
	graph := func(edit func(g *codec.Graph)) string {
		g := affine()
		edit(g)
		return storeGraph(t, b, g)
	}
	deep := bytes.Repeat([]byte{0x81}, 200) // 200 nested one-element arrays
	storeRaw(t, b, codec.GraphName(deep), deep)
	wrongBytes, _, _ := codec.EncodeGraph(affine())
	wrongKey := codec.GraphName([]byte("something else"))
	storeRaw(t, b, wrongKey, wrongBytes)
	huge := affine()
	for len(huge.Ops) <= codec.MaxGraphOps {
		huge.Ops = append(huge.Ops, codec.Op{Op: "free"})
	}
	hugeData, _ := codecMarshalGraph(huge)

	inputs := []codec.Op{
		{Op: "upload", Out: []uint64{1}, DType: "f32", Shape: []int{2, 3}, Values: []float64{1, 2, 3, 4, 5, 6}},
		{Op: "upload", Out: []uint64{2}, DType: "f32", Shape: []int{3}, Values: []float64{1, 1, 1}},
		{Op: "upload", Out: []uint64{3}, DType: "f64", Shape: []int{3}, Values: []float64{1, 1, 1}},
		{Op: "upload", Out: []uint64{4}, DType: "f32", Shape: []int{2}, Values: []float64{1, 1}},
	}
	replay := func(name string, edit func(op *codec.Op)) codec.Op {
		op := codec.Op{Op: "replay", Graph: name, In: []uint64{1, 2}, Scalars: []float64{2}, Base: 10, Out: []uint64{12}}
		if edit != nil {
			edit(&op)
		}
		return op
	}
	cases := []struct {
		name           string
		op             codec.Op
		code, errOp    string
		mention        string
		stored, rawKey string
	}{
		{"bad name", replay("xyz", nil), codec.CodeAttr, "replay", "64 lower-case hex", "", ""},
		{"unknown graph", replay(codec.GraphName([]byte("never stored")), nil), codec.CodeUnknownGraph, "replay", "not stored", "", ""},
		{"too few inputs", replay(good, func(op *codec.Op) { op.In = op.In[:1] }), codec.CodeArity, "replay", "takes 2 inputs, 1 given", "", ""},
		{"wrong dtype", replay(good, func(op *codec.Op) { op.In[1] = 3 }), codec.CodeDType, "replay", "input 1", "", ""},
		{"wrong shape", replay(good, func(op *codec.Op) { op.In[1] = 4 }), codec.CodeShape, "replay", "input 1", "", ""},
		{"unknown input", replay(good, func(op *codec.Op) { op.In[0] = 99 }), codec.CodeUnknownID, "replay", "tensor 99", "", ""},
		{"no scalar", replay(good, func(op *codec.Op) { op.Scalars = nil }), codec.CodeArity, "replay", "takes 1 scalars", "", ""},
		{"wrong output id", replay(good, func(op *codec.Op) { op.Out = []uint64{7} }), codec.CodeAttr, "replay", "from base 10 it is 12", "", ""},
		{"no output id", replay(good, func(op *codec.Op) { op.Out = nil }), codec.CodeArity, "replay", "1 outputs, 0", "", ""},
		{"base 0", replay(good, func(op *codec.Op) { op.Base = 0 }), codec.CodeAttr, "replay", "base 0", "", ""},
		{"base overflows", replay(good, func(op *codec.Op) { op.Base, op.Out = 1<<64-2, []uint64{0} }), codec.CodeAttr, "replay", "no room", "", ""},
		{"ids taken", replay(good, func(op *codec.Op) { op.Base, op.Out = 1, []uint64{3} }), codec.CodeDuplicate, "full", "graph " + good[:12] + " op 0", "", ""},
		{"bad scalar at run time", replay(graph(func(g *codec.Graph) {
			g.Ops[0] = codec.Op{Op: "bernoulli", Out: []uint64{3}, Shape: []int{2, 3}, P: 0.5, DType: "f32"}
			g.Binds[0].Attr = "p"
		}), func(op *codec.Op) { op.Scalars = []float64{3} }), codec.CodeAttr, "bernoulli", "op 0", "", ""},
		{"forward reference", replay(graph(func(g *codec.Graph) { g.Ops[1].In[1] = 5 }), nil), codec.CodeInvalidGraph, "replay", "op 1 (mul) reads id 5, which no earlier op made", "", ""},
		{"cycle", replay(graph(func(g *codec.Graph) { g.Ops[1].In[1] = 4 }), nil), codec.CodeInvalidGraph, "replay", "reads id 4", "", ""},
		{"id 0", replay(graph(func(g *codec.Graph) { g.Ops[1].In[1] = 0 }), nil), codec.CodeInvalidGraph, "replay", "reads id 0", "", ""},
		{"use after free", replay(graph(func(g *codec.Graph) {
			g.Ops = append(g.Ops[:2], codec.Op{Op: "free", In: []uint64{4}}, g.Ops[2])
		}), nil), codec.CodeInvalidGraph, "replay", "after a free", "", ""},
		{"out of order ids", replay(graph(func(g *codec.Graph) { g.Ops[1].Out[0] = 7 }), nil), codec.CodeInvalidGraph, "replay", "next id is 4", "", ""},
		{"unknown op", replay(graph(func(g *codec.Graph) { g.Ops[1].Op = "frobnicate" }), nil), codec.CodeInvalidGraph, "replay", "frobnicate", "", ""},
		{"host op", replay(graph(func(g *codec.Graph) {
			g.Ops[1] = codec.Op{Op: "upload", Out: []uint64{4}, DType: "f32", Shape: []int{1}, Values: []float64{1}}
		}), nil), codec.CodeInvalidGraph, "replay", "upload", "", ""},
		{"nested replay", replay(graph(func(g *codec.Graph) {
			g.Ops[1] = codec.Op{Op: "replay", Graph: good, In: []uint64{1, 2}, Out: []uint64{4}}
		}), nil), codec.CodeInvalidGraph, "replay", "replay", "", ""},
		{"arity", replay(graph(func(g *codec.Graph) { g.Ops[1].In = g.Ops[1].In[:1] }), nil), codec.CodeArity, "replay", "op 1 (mul) does not validate", "", ""},
		{"shape", replay(graph(func(g *codec.Graph) { g.Inputs[1].Shape = []int{4} }), nil), codec.CodeShape, "replay", "op 2 (add) does not validate", "", ""},
		{"too many tensors", replay(graph(func(g *codec.Graph) {
			sizes := make([]int, 70000)
			out := make([]uint64, len(sizes))
			for i := range sizes {
				sizes[i], out[i] = 1, uint64(7+i)
			}
			g.Ops = append(g.Ops, codec.Op{Op: "full", Out: []uint64{6}, Shape: []int{len(sizes)}},
				codec.Op{Op: "split", In: []uint64{6}, Sizes: sizes, Out: out})
		}), nil), codec.CodeInvalidGraph, "replay", "over 65536 tensors", "", ""},
		{"huge placeholder", replay(graph(func(g *codec.Graph) { g.Inputs[1].Shape = []int{1 << 20, 1 << 20} }), nil), codec.CodeInvalidGraph, "replay", "input 1", "", ""},
		{"output not made", replay(graph(func(g *codec.Graph) { g.Outputs = []uint64{2} }), nil), codec.CodeInvalidGraph, "replay", "no op of the graph makes", "", ""},
		{"output twice", replay(graph(func(g *codec.Graph) { g.Outputs = []uint64{5, 5} }), nil), codec.CodeInvalidGraph, "replay", "an output already", "", ""},
		{"bind attr", replay(graph(func(g *codec.Graph) { g.Binds[0].Attr = "shape" }), nil), codec.CodeInvalidGraph, "replay", "cannot take a scalar", "", ""},
		{"bind scalar", replay(graph(func(g *codec.Graph) { g.Binds[0].Scalar = 3 }), nil), codec.CodeInvalidGraph, "replay", "scalar 3 of 1", "", ""},
		{"bind op", replay(graph(func(g *codec.Graph) { g.Binds[0].Op = 9 }), nil), codec.CodeInvalidGraph, "replay", "op 9 of 3", "", ""},
		{"version", replay(graph(func(g *codec.Graph) { g.V = 7 }), nil), codec.CodeInvalidGraph, "replay", "version 7", "", ""},
		{"deep", replay(codec.GraphName(deep), nil), codec.CodeInvalidGraph, "replay", "malformed", "", ""},
		{"not what its name says", replay(wrongKey, nil), codec.CodeInvalidGraph, "replay", "hashes to", "", ""},
		{"too many ops", replay(codec.GraphName(hugeData), nil), codec.CodeInvalidGraph, "replay", "too large", string(hugeData), codec.GraphName(hugeData)},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.rawKey != "" {
				storeRaw(t, b, c.rawKey, []byte(c.stored))
			}
			r := newRaw(t, b, "fabric.ops.cpu-0.graph"+strings.Repeat("x", i))
			ops := append(append([]codec.Op{}, inputs...), c.op, codec.Op{Op: "sync", Tag: 1})
			if err := r.send("", frame(t, ops...)); err != nil {
				t.Fatal(err)
			}
			res := r.result()
			if len(res.Errors) == 0 {
				t.Fatalf("no error reported: %+v", res)
			}
			e := res.Errors[0]
			if e.Code != c.code || e.Op != c.errOp || e.Index != len(inputs) || !strings.Contains(e.Message, c.mention) {
				t.Errorf("got %+v; want code %s, op %q at %d, message mentioning %q", e, c.code, c.errOp, len(inputs), c.mention)
			}
			// The replay's outputs report the cause on a read.
			if len(c.op.Out) == 1 && c.op.Out[0] != 0 && c.op.Out[0] != 3 {
				if err := r.send("", frame(t, codec.Op{Op: "read", In: c.op.Out, Tag: 2})); err != nil {
					t.Fatal(err)
				}
				if res := r.result(); len(res.Errors) == 0 || res.Errors[0].Code != c.code || res.Tensor != nil {
					t.Errorf("read of the output: %+v", res)
				}
			}
		})
	}

	t.Run("good", func(t *testing.T) {
		r := newRaw(t, b, "fabric.ops.cpu-0.good")
		ops := append(append([]codec.Op{}, inputs...), replay(good, nil), codec.Op{Op: "read", In: []uint64{12}, Tag: 1},
			// Internal ids were freed by the plan; the output stays.
			codec.Op{Op: "read", In: []uint64{10}, Tag: 2})
		if err := r.send("", frame(t, ops...)); err != nil {
			t.Fatal(err)
		}
		res := r.result()
		want := []float64{3, 5, 7, 9, 11, 13}
		if len(res.Errors) > 0 || res.Tensor == nil {
			t.Fatalf("%+v", res)
		}
		got, _ := decodeF32(res.Tensor.Data)
		for i := range want {
			if float64(got[i]) != want[i] {
				t.Fatalf("got %v, want %v", got, want)
			}
		}
		if res := r.result(); len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeUnknownID {
			t.Fatalf("read of an internal tensor: %+v", res)
		}
	})
}

// codecMarshalGraph encodes g without the size check of EncodeGraph.
func codecMarshalGraph(g *codec.Graph) ([]byte, error) { return codec.Marshal(codec.CBOR, g) }

func decodeF32(b []byte) ([]float32, error) {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}

// TestReplayFuses: on a backend that fuses, a replay's elementwise runs
// reach it as fused groups (the plan's frees let the fusion drop the
// intermediates), with the bits of the replay on a backend that does not.
func TestReplayFuses(t *testing.T) {
	b := brokertest.Run(t)
	ff := &fakeFuser{Backend: cpu.New()}
	startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{
			{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()},
			{Name: "cpu-1", Kind: "cpu", Backend: ff},
		}
	})
	// x*w + b, then tanh, exp, a sum: only the sum is an output.
	g := affine()
	g.Ops = append(g.Ops,
		codec.Op{Op: "tanh", Out: []uint64{6}, In: []uint64{5}},
		codec.Op{Op: "exp", Out: []uint64{7}, In: []uint64{6}},
		codec.Op{Op: "sum", Out: []uint64{8}, In: []uint64{7}})
	g.Outputs = []uint64{8}
	name := storeGraph(t, b, g)
	ops := []codec.Op{
		{Op: "upload", Out: []uint64{1}, DType: "f32", Shape: []int{2, 3}, Values: []float64{1, 2, 3, 4, 5, 6}},
		{Op: "upload", Out: []uint64{2}, DType: "f32", Shape: []int{3}, Values: []float64{-1, 0, 1}},
		{Op: "replay", Graph: name, In: []uint64{1, 2}, Scalars: []float64{0.1}, Base: 3, Out: []uint64{8}},
		{Op: "read", In: []uint64{8}, Tag: 1},
	}
	plain := newRaw(t, b, "fabric.ops.cpu-0.fuse")
	fused := newRaw(t, b, "fabric.ops.cpu-1.fuse")
	for _, r := range []*rawSession{plain, fused} {
		if err := r.send("", frame(t, ops...)); err != nil {
			t.Fatal(err)
		}
	}
	want, got := plain.result(), fused.result()
	if !sameResult(want, got) || len(want.Errors) > 0 {
		t.Fatalf("op by op %s, fused %s", describe(want), describe(got))
	}
	groups := ff.taken()
	if len(groups) != 1 || len(groups[0].Ops) != 5 {
		t.Fatalf("fused groups %+v, want one of the 5 ops after full", groups)
	}
}
