package cpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// TestExecFused checks that a fused group gives the bits of its ops run one
// by one, on shapes that take one block or many (and several cores), with
// inputs that broadcast over leading, trailing and middle axes, and that
// groups it cannot take are declined with ErrNotImplemented.
func TestExecFused(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(11, 12))
	f32 := kernels.Float32
	op := func(name string, args ...int) kernels.FusedOp {
		return kernels.FusedOp{Op: kernels.Op{Name: name}, Args: args}
	}
	cases := []struct {
		name    string
		shapes  [][]int
		ops     []kernels.FusedOp
		results []int
	}{
		// A ReLU's gradient: g·sign(y).
		{"relu-grad", [][]int{{128, 64, 24, 24}, {128, 64, 24, 24}}, []kernels.FusedOp{op(kernels.OpSign, 1), op(kernels.OpMul, 0, 2)}, []int{3}},
		{"relu-grad-small", [][]int{{3, 5}, {3, 5}}, []kernels.FusedOp{op(kernels.OpSign, 1), op(kernels.OpMul, 0, 2)}, []int{3}},
		// A bias, then ReLU, keeping both.
		{"bias-relu", [][]int{{300, 517}, {517}}, []kernels.FusedOp{op(kernels.OpAdd, 0, 1), op(kernels.OpRelu, 2)}, []int{2, 3}},
		// Per-row scale, exp, a scalar, a comparison and where.
		{"rows", [][]int{{70, 9, 130}, {70, 1, 1}, {}}, []kernels.FusedOp{
			op(kernels.OpMul, 0, 1), op(kernels.OpExp, 3), op(kernels.OpSub, 4, 2), op(kernels.OpGt, 5, 2), op(kernels.OpWhere, 6, 5, 0)}, []int{7}},
		// A middle axis broadcast: the block rows stop before it.
		{"middle", [][]int{{40, 30, 50}, {40, 1, 50}}, []kernels.FusedOp{op(kernels.OpDiv, 0, 1), op(kernels.OpNeg, 2)}, []int{3}},
		// Rank below the group's, and a cast.
		{"cast", [][]int{{20, 3000}, {3000}}, []kernels.FusedOp{op(kernels.OpMaximum, 0, 1), {Op: kernels.Op{Name: kernels.OpCast, DType: kernels.Float64}, Args: []int{2}}}, []int{3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var in []*kernels.Tensor
			for _, s := range c.shapes {
				in = append(in, tensor(t, b, r, f32, s...))
			}
			// One by one.
			vals := append([]*kernels.Tensor(nil), in...)
			for _, o := range c.ops {
				args := make([]*kernels.Tensor, len(o.Args))
				for j, a := range o.Args {
					args[j] = vals[a]
				}
				out := infer(t, b, &o.Op, args...)
				if err := b.Exec(&o.Op, args, out); err != nil {
					t.Fatal(err)
				}
				vals = append(vals, out[0])
			}
			g := &kernels.FusedGroup{Inputs: len(in), Ops: c.ops, Results: c.results}
			out := make([]*kernels.Tensor, len(c.results))
			for k, res := range c.results {
				out[k] = poisoned(t, b, vals[res].Meta)
			}
			if err := b.ExecFused(g, in, out); err != nil {
				t.Fatal(err)
			}
			for k, res := range c.results {
				want, got := vals[res].Buf.(*cpu.Buffer).Host(), out[k].Buf.(*cpu.Buffer).Host()
				if !bytes.Equal(want, got) {
					t.Fatalf("result %d: the fused bits differ from the ops one by one", k)
				}
			}
		})
	}
	// Declined: a reduction, results of two shapes, bad arity.
	x, y := tensor(t, b, r, f32, 4, 5), tensor(t, b, r, f32, 5)
	for i, c := range []struct {
		g   *kernels.FusedGroup
		in  []*kernels.Tensor
		out []kernels.Meta
		err error
	}{
		{&kernels.FusedGroup{Inputs: 1, Ops: []kernels.FusedOp{op(kernels.OpExp, 0), {Op: kernels.Op{Name: kernels.OpSum}, Args: []int{1}}}, Results: []int{2}},
			[]*kernels.Tensor{x}, []kernels.Meta{{DType: f32, Shape: []int{}}}, kernels.ErrNotImplemented},
		{&kernels.FusedGroup{Inputs: 1, Ops: []kernels.FusedOp{op(kernels.OpExp, 0), op(kernels.OpNeg, 1)}, Results: []int{1, 2}},
			[]*kernels.Tensor{y}, []kernels.Meta{{DType: f32, Shape: []int{5}}, {DType: f32, Shape: []int{4}}}, kernels.ErrNotImplemented},
		{&kernels.FusedGroup{Inputs: 2, Ops: []kernels.FusedOp{op(kernels.OpExp, 0), op(kernels.OpNeg, 1)}, Results: []int{2}},
			[]*kernels.Tensor{x}, []kernels.Meta{{DType: f32, Shape: []int{4, 5}}}, kernels.ErrArity},
	} {
		out := make([]*kernels.Tensor, len(c.out))
		for k, m := range c.out {
			out[k] = poisoned(t, b, m)
		}
		if err := b.ExecFused(c.g, c.in, out); !errors.Is(err, c.err) {
			t.Errorf("case %d: %v, want %v", i, err, c.err)
		}
	}
}

// poisoned allocates a tensor of m filled with 0xff bytes (NaN for floats).
func poisoned(t testing.TB, b *cpu.Backend, m kernels.Meta) *kernels.Tensor {
	t.Helper()
	buf, err := b.Alloc(m.Bytes())
	if err != nil {
		t.Fatal(fmt.Errorf("alloc %v: %w", m, err))
	}
	for i := range buf.(*cpu.Buffer).Host() {
		buf.(*cpu.Buffer).Host()[i] = 0xff
	}
	return &kernels.Tensor{Meta: m, Buf: buf}
}
