package cpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// transposedShapes are matmul shapes m, k, n that take every path of the
// product: the unpacked one (small, a column vector, few rows), the packed
// ones on one core and on several, with B read in place or packed, k in
// one block, in several, and not a multiple of the block, edge rows and
// columns, single rows and columns, and the roles of A and B swapped.
var transposedShapes = [][3]int{
	{1, 1, 1}, {1, 7, 1}, {1, 300, 40}, {40, 300, 1}, {3, 5, 7}, {6, 1, 16}, {7, 3, 17},
	{12, 1, 32}, {13, 5, 33}, {11, 200, 48}, {12, 256, 32}, {25, 257, 70}, {70, 70, 70},
	{128, 784, 512}, {128, 512, 10}, {10, 128, 512}, {512, 128, 784}, {193, 600, 130},
	{37, 1030, 64}, {300, 40, 1100}, {5, 300, 2048}, {2000, 20, 64},
	// B transposed, run as Cᵀ = Bᵀ·Aᵀ: k in one block, in several, and
	// not a multiple of the block; C's edges.
	{64, 300, 200}, {32, 1000, 100}, {96, 257, 300}, {128, 20, 300}, {30, 100, 45},
}

// TestMatmulTransposed: a matmul of operands given as their transposes
// gives the bits of the permutes then the matmul, for float32 and float64,
// on one core and on several.
func TestMatmulTransposed(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(21, 22))
	perm := &kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}
	mm := &kernels.Op{Name: kernels.OpMatmul}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, s := range transposedShapes {
		m, k, n := s[0], s[1], s[2]
		for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64} {
			for _, trans := range [][2]bool{{true, false}, {false, true}, {true, true}} {
				name := fmt.Sprintf("%v/%dx%dx%d/%v", dt, m, k, n, trans)
				// The operands as stored, and as the matmul alone takes them.
				x, z := tensor(t, b, r, dt, m, k), tensor(t, b, r, dt, k, n)
				in := []*kernels.Tensor{x, z}
				if trans[0] {
					x = tensor(t, b, r, dt, k, m)
					in[0] = infer(t, b, perm, x)[0]
					if err := b.Exec(perm, []*kernels.Tensor{x}, in[:1]); err != nil {
						t.Fatal(err)
					}
				}
				if trans[1] {
					z = tensor(t, b, r, dt, n, k)
					in[1] = infer(t, b, perm, z)[0]
					if err := b.Exec(perm, []*kernels.Tensor{z}, in[1:]); err != nil {
						t.Fatal(err)
					}
				}
				for _, procs := range []int{1, 2, 3} {
					runtime.GOMAXPROCS(procs)
					want := infer(t, b, mm, in...)
					if err := b.Exec(mm, in, want); err != nil {
						t.Fatal(err)
					}
					got := infer(t, b, mm, in...)
					if err := b.ExecMatmulT(mm, trans, []*kernels.Tensor{x, z}, got); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if !bytes.Equal(host(got[0]), host(want[0])) {
						t.Fatalf("%s GOMAXPROCS=%d: other bits than permute then matmul", name, procs)
					}
				}
			}
		}
	}
}

func host(t *kernels.Tensor) []byte { return t.Buf.(*cpu.Buffer).Host() }

// TestMatmulTransposedRefuses: bad operands fail as Exec fails them, and
// what the backend does not take is refused with ErrNotImplemented; either
// way the output is left as it was.
func TestMatmulTransposedRefuses(t *testing.T) {
	b := cpu.New()
	r := rand.New(rand.NewPCG(23, 24))
	mm := &kernels.Op{Name: kernels.OpMatmul}
	f32 := func(shape ...int) *kernels.Tensor { return tensor(t, b, r, kernels.Float32, shape...) }
	x, z := f32(4, 3), f32(5, 4) // xᵀ [3, 4], zᵀ [4, 5]
	y := f32(3, 5)
	i32 := func(shape ...int) *kernels.Tensor { return tensor(t, b, r, kernels.Int32, shape...) }
	f16 := func(shape ...int) *kernels.Tensor {
		m := kernels.Meta{DType: kernels.Float16, Shape: shape}
		buf, err := b.Alloc(m.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return &kernels.Tensor{Meta: m, Buf: buf}
	}
	both := [2]bool{true, true}
	for _, c := range []struct {
		name    string
		op      *kernels.Op
		trans   [2]bool
		in, out []*kernels.Tensor
		want    error
	}{
		{"not a matmul", &kernels.Op{Name: kernels.OpAdd}, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{y}, kernels.ErrNotImplemented},
		{"nil op", nil, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{y}, kernels.ErrNotImplemented},
		{"one input", mm, both, []*kernels.Tensor{x}, []*kernels.Tensor{y}, kernels.ErrArity},
		{"nil input", mm, both, []*kernels.Tensor{x, nil}, []*kernels.Tensor{y}, kernels.ErrArity},
		{"inner dims differ", mm, [2]bool{true, false}, []*kernels.Tensor{x, z}, []*kernels.Tensor{y}, kernels.ErrShape},
		{"wrong output", mm, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{f32(5, 3)}, kernels.ErrShape},
		{"dtypes differ", mm, both, []*kernels.Tensor{x, tensor(t, b, r, kernels.Float64, 5, 4)}, []*kernels.Tensor{y}, kernels.ErrDType},
		{"output dtype", mm, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{tensor(t, b, r, kernels.Float64, 3, 5)}, kernels.ErrDType},
		{"three axes", mm, both, []*kernels.Tensor{f32(2, 4, 3), z}, []*kernels.Tensor{f32(2, 3, 5)}, kernels.ErrNotImplemented},
		{"a vector", mm, both, []*kernels.Tensor{f32(4), z}, []*kernels.Tensor{f32(5)}, kernels.ErrNotImplemented},
		{"integers", mm, both, []*kernels.Tensor{i32(4, 3), i32(5, 4)}, []*kernels.Tensor{i32(3, 5)}, kernels.ErrNotImplemented},
		{"float16", mm, both, []*kernels.Tensor{f16(4, 3), f16(5, 4)}, []*kernels.Tensor{f16(3, 5)}, kernels.ErrNotImplemented},
		{"output over an input", mm, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{{Meta: y.Meta, Buf: z.Buf}}, kernels.ErrNotImplemented},
	} {
		before := make([][]byte, len(c.out))
		for i, o := range c.out {
			before[i] = bytes.Clone(host(o))
		}
		err := b.ExecMatmulT(c.op, c.trans, c.in, c.out)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		for i, o := range c.out {
			if !bytes.Equal(host(o), before[i]) {
				t.Errorf("%s: output %d written", c.name, i)
			}
		}
	}
	// The good call, for contrast: xᵀ·zᵀ.
	if err := b.ExecMatmulT(mm, both, []*kernels.Tensor{x, z}, []*kernels.Tensor{y}); err != nil {
		t.Fatal(err)
	}
}
