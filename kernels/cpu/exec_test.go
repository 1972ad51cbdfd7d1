package cpu_test

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// tensor allocates a tensor of dtype dt and shape on b, filled with random
// values in [-2, 2) for floats and [-10, 10) otherwise.
func tensor(t testing.TB, b *cpu.Backend, r *rand.Rand, dt kernels.DType, shape ...int) *kernels.Tensor {
	t.Helper()
	m := kernels.Meta{DType: dt, Shape: shape}
	buf, err := b.Alloc(m.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	h := buf.(*cpu.Buffer).Host()
	for i := range m.Numel() {
		switch dt {
		case kernels.Float32:
			binary.LittleEndian.PutUint32(h[4*i:], math.Float32bits(float32(r.Float64()*4-2)))
		case kernels.Float64:
			binary.LittleEndian.PutUint64(h[8*i:], math.Float64bits(r.Float64()*4-2))
		case kernels.Int32:
			binary.LittleEndian.PutUint32(h[4*i:], uint32(r.IntN(20)-10))
		default:
			t.Fatalf("tensor: dtype %v", dt)
		}
	}
	return &kernels.Tensor{Meta: m, Buf: buf}
}

// infer allocates the outputs of op on ins.
func infer(t testing.TB, b *cpu.Backend, op *kernels.Op, ins ...*kernels.Tensor) []*kernels.Tensor {
	t.Helper()
	metas := make([]kernels.Meta, len(ins))
	for i, x := range ins {
		metas[i] = x.Meta
	}
	om, err := kernels.Infer(op, metas, kernels.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*kernels.Tensor, len(om))
	for i, m := range om {
		buf, err := b.Alloc(m.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		out[i] = &kernels.Tensor{Meta: m, Buf: buf}
	}
	return out
}

// TestTinyOpsDoNotAllocate: the fabric runs hundreds of thousands of tiny
// ops a second, so Exec on small tensors must not touch the heap.
func TestTinyOpsDoNotAllocate(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(1, 1))
	f32, f64, i32 := kernels.Float32, kernels.Float64, kernels.Int32
	x44, y44, x4 := tensor(t, b, r, f32, 4, 4), tensor(t, b, r, f32, 4, 4), tensor(t, b, r, f32, 4)
	s := tensor(t, b, r, f32)
	mask := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Bool, Shape: []int{4, 1}}, Buf: x4.Buf}
	cases := []struct {
		name string
		op   kernels.Op
		in   []*kernels.Tensor
	}{
		{"add", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x44, y44}},
		{"add row", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x44, x4}},
		{"mul scalar", kernels.Op{Name: kernels.OpMul}, []*kernels.Tensor{s, x44}},
		{"div column", kernels.Op{Name: kernels.OpDiv}, []*kernels.Tensor{tensor(t, b, r, f32, 4, 1), x4}},
		{"sub f64", kernels.Op{Name: kernels.OpSub}, []*kernels.Tensor{tensor(t, b, r, f64, 3), tensor(t, b, r, f64, 3)}},
		{"div i32", kernels.Op{Name: kernels.OpDiv}, []*kernels.Tensor{tensor(t, b, r, i32, 3), tensor(t, b, r, i32, 3)}},
		{"neg", kernels.Op{Name: kernels.OpNeg}, []*kernels.Tensor{x44}},
		{"exp", kernels.Op{Name: kernels.OpExp}, []*kernels.Tensor{x44}},
		{"relu", kernels.Op{Name: kernels.OpRelu}, []*kernels.Tensor{x44}},
		{"sum all", kernels.Op{Name: kernels.OpSum}, []*kernels.Tensor{x44}},
		{"sum rows", kernels.Op{Name: kernels.OpSum, Axes: []int{-1}}, []*kernels.Tensor{x44}},
		{"mean columns", kernels.Op{Name: kernels.OpMean, Axes: []int{0}, Keepdims: true}, []*kernels.Tensor{x44}},
		{"max middle", kernels.Op{Name: kernels.OpMax, Axes: []int{1}}, []*kernels.Tensor{tensor(t, b, r, f32, 2, 3, 4)}},
		{"sum scattered", kernels.Op{Name: kernels.OpSum, Axes: []int{0, 2}}, []*kernels.Tensor{tensor(t, b, r, f32, 2, 3, 4)}},
		{"matmul", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x44, y44}},
		{"matmul f64", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{tensor(t, b, r, f64, 2, 3), tensor(t, b, r, f64, 3, 5)}},
		{"matvec", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x44, x4}},
		{"matmul batched", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{tensor(t, b, r, f32, 2, 3, 4), x44}},
		{"permute", kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}, []*kernels.Tensor{x44}},
		{"reshape", kernels.Op{Name: kernels.OpReshape, Shape: []int{-1}}, []*kernels.Tensor{x44}},
		{"cast i32", kernels.Op{Name: kernels.OpCast, DType: i32}, []*kernels.Tensor{x44}},
		{"cast f16", kernels.Op{Name: kernels.OpCast, DType: kernels.Float16}, []*kernels.Tensor{x44}},
		{"full", kernels.Op{Name: kernels.OpFull, Shape: []int{4, 4}, Value: 2}, nil},
		{"maximum", kernels.Op{Name: kernels.OpMaximum}, []*kernels.Tensor{x44, x4}},
		{"mod", kernels.Op{Name: kernels.OpMod}, []*kernels.Tensor{x44, s}},
		{"lt", kernels.Op{Name: kernels.OpLt}, []*kernels.Tensor{x44, x4}},
		{"where", kernels.Op{Name: kernels.OpWhere}, []*kernels.Tensor{mask, x44, s}},
		{"clamp", kernels.Op{Name: kernels.OpClamp}, []*kernels.Tensor{x44, s, x4}},
		{"sigmoid", kernels.Op{Name: kernels.OpSigmoid}, []*kernels.Tensor{x44}},
		{"isnan", kernels.Op{Name: kernels.OpIsNaN}, []*kernels.Tensor{x44}},
		{"softmax", kernels.Op{Name: kernels.OpSoftmax, Axis: -1}, []*kernels.Tensor{x44}},
		{"log_softmax", kernels.Op{Name: kernels.OpLogSoftmax, Axis: 0}, []*kernels.Tensor{x44}},
		{"argmax", kernels.Op{Name: kernels.OpArgmax, Axes: []int{0}}, []*kernels.Tensor{x44}},
		{"var", kernels.Op{Name: kernels.OpVar, Correction: 1}, []*kernels.Tensor{x44}},
		{"arange", kernels.Op{Name: kernels.OpArange, Stop: 10, Step: 1}, nil},
		{"uniform", kernels.Op{Name: kernels.OpUniform, Shape: []int{16}, High: 1}, nil},
		{"normal", kernels.Op{Name: kernels.OpNormal, Shape: []int{16}, Std: 1}, nil},
	}
	for _, c := range cases {
		out := infer(t, b, &c.op, c.in...)
		if err := b.Exec(&c.op, c.in, out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n := testing.AllocsPerRun(100, func() { _ = b.Exec(&c.op, c.in, out) }); n != 0 {
			t.Errorf("%s: %v allocations per Exec, want 0", c.name, n)
		}
	}
}

// TestSameBitsOnAnyCores: results must not depend on how many cores split
// the work, so that replay on another machine gives the same bits.
func TestSameBitsOnAnyCores(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(2, 2))
	x := tensor(t, b, r, kernels.Float32, 600, 700)
	y := tensor(t, b, r, kernels.Float32, 700, 300)
	cases := []struct {
		op kernels.Op
		in []*kernels.Tensor
	}{
		{kernels.Op{Name: kernels.OpSum}, []*kernels.Tensor{x}},
		{kernels.Op{Name: kernels.OpMean, Axes: []int{0}}, []*kernels.Tensor{x}},
		{kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []*kernels.Tensor{x}},
		{kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x, y}},
		{kernels.Op{Name: kernels.OpExp}, []*kernels.Tensor{x}},
		{kernels.Op{Name: kernels.OpNormal, Shape: []int{100000}, Std: 1, Seed: 7, Key: 9}, nil},
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, c := range cases {
		var first []byte
		for _, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			out := infer(t, b, &c.op, c.in...)
			if err := b.Exec(&c.op, c.in, out); err != nil {
				t.Fatal(err)
			}
			got := out[0].Buf.(*cpu.Buffer).Host()
			if first == nil {
				first = got
			} else if !bytes.Equal(first, got) {
				t.Errorf("%s: GOMAXPROCS=%d gives different bits than GOMAXPROCS=1", c.op.Name, procs)
			}
		}
	}
}

// TestInPlace: an output may share its buffer with an input, elementwise
// or not.
func TestInPlace(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(3, 3))
	for _, c := range []struct {
		op    kernels.Op
		shape []int
	}{
		{kernels.Op{Name: kernels.OpAdd}, []int{300, 300}},
		{kernels.Op{Name: kernels.OpExp}, []int{5, 3}},
		{kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}, []int{30, 20}},
		{kernels.Op{Name: kernels.OpMatmul}, []int{20, 20}},
		{kernels.Op{Name: kernels.OpSum, Axes: []int{0}, Keepdims: true}, []int{20, 20}},
		{kernels.Op{Name: kernels.OpCast, DType: kernels.Int32}, []int{7}},
	} {
		x := tensor(t, b, r, kernels.Float32, c.shape...)
		in := []*kernels.Tensor{x}
		if c.op.Name == kernels.OpAdd || c.op.Name == kernels.OpMatmul {
			in = append(in, x)
		}
		want := infer(t, b, &c.op, in...)
		if err := b.Exec(&c.op, in, want); err != nil {
			t.Fatal(err)
		}
		out := &kernels.Tensor{Meta: want[0].Meta, Buf: x.Buf}
		if err := b.Exec(&c.op, in, []*kernels.Tensor{out}); err != nil {
			t.Fatal(err)
		}
		n := want[0].Bytes()
		if !bytes.Equal(x.Buf.(*cpu.Buffer).Host()[:n], want[0].Buf.(*cpu.Buffer).Host()[:n]) {
			t.Errorf("%s in place differs from out of place", c.op.Name)
		}
	}
}

func TestBuffers(t *testing.T) {
	b := cpu.New()
	if _, err := b.Alloc(-1); err == nil {
		t.Error("Alloc(-1) succeeded")
	}
	if _, err := b.Alloc(1 << 50); err == nil {
		t.Error("Alloc(1<<50) succeeded")
	}
	buf, err := b.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(buf, make([]byte, 9)); err == nil {
		t.Error("Upload of 9 bytes into 8 succeeded")
	}
	if err := b.Download(make([]byte, 9), buf); err == nil {
		t.Error("Download of 9 bytes from 8 succeeded")
	}
	b.Free(buf)
	b.Free(nil)
	if err := b.Upload(buf, []byte{1}); err == nil {
		t.Error("Upload into a freed buffer succeeded")
	}
	x := &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Float32, Shape: []int{2}}, Buf: buf}
	if err := b.Exec(&kernels.Op{Name: kernels.OpNeg}, []*kernels.Tensor{x}, []*kernels.Tensor{x}); err == nil {
		t.Error("Exec on a freed buffer succeeded")
	}
}

// TestIsRandomIsTheKeyedOps: the creation ops whose output changes with
// the op's key (its output's id) are the ones kernels.IsRandom names.
func TestIsRandomIsTheKeyedOps(t *testing.T) {
	b := cpu.New()
	ops := []kernels.Op{
		{Name: kernels.OpUniform, Low: -1, High: 1},
		{Name: kernels.OpNormal, Mean: 0, Std: 1},
		{Name: kernels.OpBernoulli, P: 0.5},
		{Name: kernels.OpFull, Value: 3},
		{Name: kernels.OpArange},
	}
	for _, name := range kernels.Creation {
		if name != kernels.OpBernoulli {
			ops = append(ops, kernels.Op{Name: name})
		}
	}
	for _, op := range ops {
		op.Shape, op.DType, op.Seed = []int{64}, kernels.Float32, 7
		if op.Name == kernels.OpEye {
			op.Shape = []int{8, 8}
		}
		if op.Name == kernels.OpArange || op.Name == kernels.OpLinspace {
			op.Start, op.Stop, op.Step, op.Num = 0, 64, 1, 64
			op.Shape = nil
		}
		var got [2][]byte
		for k := range got {
			op.Key = uint64(k + 1)
			out := infer(t, b, &op)
			if err := b.Exec(&op, nil, out); err != nil {
				t.Fatalf("%s: %v", op.Name, err)
			}
			got[k] = out[0].Buf.(*cpu.Buffer).Host()
		}
		if keyed := !bytes.Equal(got[0], got[1]); keyed != kernels.IsRandom(op.Name) {
			t.Errorf("%s: output changes with the key: %v; IsRandom: %v", op.Name, keyed, kernels.IsRandom(op.Name))
		}
	}
}
