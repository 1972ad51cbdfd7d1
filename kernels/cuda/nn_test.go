//go:build cgo && linux

package cuda

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// nnInput is a host tensor for the tests of this file.
type nnInput struct {
	dt    kernels.DType
	shape []int
	v     []float64
}

// execBytes runs op on be and returns its output's bytes.
func execBytes(t testing.TB, be kernels.Backend, op *kernels.Op, ins []nnInput) ([]byte, kernels.Meta, error) {
	t.Helper()
	metas := make([]kernels.Meta, len(ins))
	for i, in := range ins {
		metas[i] = kernels.Meta{DType: in.dt, Shape: in.shape}
	}
	want, err := kernels.Infer(op, metas, kernels.DefaultLimits())
	if err != nil {
		t.Fatalf("%s: %v", op.Name, err)
	}
	var ts []*kernels.Tensor
	defer func() {
		for _, x := range ts {
			be.Free(x.Buf)
		}
	}()
	mk := func(m kernels.Meta, v []float64) *kernels.Tensor {
		buf, err := be.Alloc(m.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		x := &kernels.Tensor{Meta: m, Buf: buf}
		ts = append(ts, x)
		if v != nil {
			raw, err := kernels.EncodeValues(m.DType, v)
			if err != nil {
				t.Fatal(err)
			}
			if err := be.Upload(buf, raw); err != nil {
				t.Fatal(err)
			}
		}
		return x
	}
	in := make([]*kernels.Tensor, len(ins))
	for i := range ins {
		in[i] = mk(metas[i], ins[i].v)
	}
	out := mk(want[0], nil)
	if err := be.Exec(op, in, []*kernels.Tensor{out}); err != nil {
		return nil, want[0], err
	}
	raw := make([]byte, out.Bytes())
	if err := be.Download(raw, out.Buf); err != nil {
		t.Fatal(err)
	}
	return raw, want[0], nil
}

// nnRandom is n normal numbers, rounded to multiples of 1/4 with ties,
// where set, so that max pools meet equal values.
func nnRandom(r *rand.Rand, n int, ties bool) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64()
		if ties {
			v[i] = math.Round(v[i]*2) / 4
		}
	}
	return v
}

// nnCase is one op on random inputs of the given shapes (targets for
// cross entropy are drawn in [0, classes)).
type nnCase struct {
	name   string
	op     kernels.Op
	shapes [][]int
	target bool // the second input is a target of the first's classes
	ties   bool
	nan    bool // a NaN in the first input
}

func nnCases() []nnCase {
	conv := func(name string, x, w []int, op kernels.Op, bias bool) []nnCase {
		g, err := kernels.ConvWindow(&op, x, w)
		if err != nil {
			panic(err)
		}
		f := op
		f.Name = kernels.OpConv2D
		fs := [][]int{x, w}
		if bias {
			fs = append(fs, []int{w[0]})
		}
		ig := op
		ig.Name, ig.Shape = kernels.OpConv2DInputGrad, x
		wg := op
		wg.Name, wg.Shape = kernels.OpConv2DWeightGrad, w
		return []nnCase{
			{name: name + "/fwd", op: f, shapes: fs},
			{name: name + "/dx", op: ig, shapes: [][]int{g.YShape(), w}},
			{name: name + "/dw", op: wg, shapes: [][]int{x, g.YShape()}},
		}
	}
	var cs []nnCase
	cs = append(cs, conv("plain", []int{2, 3, 7, 8}, []int{4, 3, 3, 3}, kernels.Op{}, true)...)
	cs = append(cs, conv("strided", []int{3, 3, 9, 8}, []int{5, 3, 3, 2}, kernels.Op{Stride: []int{2, 1}, Padding: []int{1, 0}, Dilation: []int{1, 2}}, true)...)
	cs = append(cs, conv("groups", []int{2, 4, 6, 7}, []int{6, 2, 3, 3}, kernels.Op{Groups: 2, Padding: []int{1, 1}, Stride: []int{2, 2}}, false)...)
	cs = append(cs, conv("1x1", []int{2, 8, 5, 5}, []int{3, 8, 1, 1}, kernels.Op{}, true)...)
	cs = append(cs, conv("mnist", []int{8, 1, 28, 28}, []int{16, 1, 3, 3}, kernels.Op{}, true)...)
	pool := func(name string, x []int, op kernels.Op, ties, nan bool) []nnCase {
		g, err := kernels.PoolWindow(&op, x)
		if err != nil {
			panic(err)
		}
		f, gr := op, op
		gs := [][]int{g.YShape(), x}
		if op.Name == kernels.OpMaxPool2D {
			gr.Name = kernels.OpMaxPool2DGrad
		} else {
			gr.Name, gr.Shape, gs = kernels.OpAvgPool2DGrad, x, gs[:1]
		}
		return []nnCase{
			{name: name + "/fwd", op: f, shapes: [][]int{x}, ties: ties, nan: nan},
			{name: name + "/grad", op: gr, shapes: gs, ties: ties},
		}
	}
	cs = append(cs, pool("maxtiled", []int{2, 3, 8, 6}, kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 3}}, true, false)...)
	cs = append(cs, pool("max2", []int{3, 4, 8, 9}, kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{2, 2}}, true, false)...)
	cs = append(cs, pool("maxoverlap", []int{2, 3, 9, 8}, kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{3, 2}, Stride: []int{1, 2}, Padding: []int{1, 1}, Dilation: []int{2, 1}}, true, false)...)
	cs = append(cs, pool("maxnan", []int{2, 2, 6, 6}, kernels.Op{Name: kernels.OpMaxPool2D, Kernel: []int{3, 3}, Stride: []int{1, 1}}, false, true)...)
	cs = append(cs, pool("avg", []int{2, 3, 9, 8}, kernels.Op{Name: kernels.OpAvgPool2D, Kernel: []int{3, 2}, Stride: []int{2, 1}, Padding: []int{1, 1}}, false, false)...)
	for _, red := range []string{"", kernels.ReduceSum, kernels.ReduceNone} {
		for _, c := range [][2]int{{37, 10}, {5, 300}} {
			dy := []int{}
			if red == kernels.ReduceNone {
				dy = []int{c[0]}
			}
			cs = append(cs,
				nnCase{name: "ce" + red, op: kernels.Op{Name: kernels.OpCrossEntropy, Reduce: red}, shapes: [][]int{c[:], {c[0]}}, target: true},
				nnCase{name: "cegrad" + red, op: kernels.Op{Name: kernels.OpCrossEntropyGrad, Reduce: red}, shapes: [][]int{c[:], {c[0]}, dy}, target: true})
		}
	}
	return cs
}

// TestNN runs the convolution, pooling and cross-entropy ops on random
// inputs: the results agree with nnReference within rounding, and two
// runs give the same bits. The convolutions run again with the im2col
// matrix limited to a few images, chunk by chunk.
func TestNN(t *testing.T) {
	be := newBackend(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, chunked := range []bool{false, true} {
		if chunked {
			old := maxIm2col
			maxIm2col = 2 << 10
			t.Cleanup(func() { maxIm2col = old })
		}
		for _, c := range nnCases() {
			if chunked && c.op.Name != kernels.OpConv2D && c.op.Name != kernels.OpConv2DInputGrad && c.op.Name != kernels.OpConv2DWeightGrad {
				continue
			}
			for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16} {
				ins := make([]nnInput, len(c.shapes))
				for i, s := range c.shapes {
					ins[i] = nnInput{dt: dt, shape: s, v: nnRandom(r, kernels.Numel(s), c.ties)}
				}
				if c.target {
					ins[1].dt = kernels.Int32
					if ins[0].shape[1] > 32 {
						ins[1].dt = kernels.Int64
					}
					for i := range ins[1].v {
						ins[1].v[i] = float64(r.IntN(ins[0].shape[1]))
					}
				}
				if c.nan {
					ins[0].v[7] = math.NaN()
					ins[0].v[9] = math.NaN()
				}
				for i := range ins {
					ins[i].v = roundValues(t, ins[i].dt, ins[i].v)
				}
				name := c.name + "/" + dt.String()
				if chunked {
					name += "/chunked"
				}
				got, m, err := execBytes(t, be, &c.op, ins)
				if errors.Is(err, kernels.ErrNotImplemented) && dt != kernels.Float32 && dt != kernels.Float64 {
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				again, _, err := execBytes(t, be, &c.op, ins)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, again) {
					t.Errorf("%s: two runs differ", name)
				}
				want, err := kernels.EncodeValues(m.DType, nnReference(t, &c.op, ins, m.Shape))
				if err != nil {
					t.Fatal(err)
				}
				compareNN(t, name, m, got, want)
			}
		}
	}
}

// compareNN checks got against want within a tolerance of dt scaled by
// the largest magnitude of want; NaNs must match.
func compareNN(t *testing.T, name string, m kernels.Meta, got, want []byte) {
	t.Helper()
	g, err := kernels.DecodeValues(m.DType, got)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kernels.DecodeValues(m.DType, want)
	if err != nil {
		t.Fatal(err)
	}
	scale := 1.0
	for _, v := range w {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			scale = max(scale, math.Abs(v))
		}
	}
	tol := map[kernels.DType]float64{kernels.Float32: 1e-5, kernels.Float64: 1e-12, kernels.Float16: 2e-3, kernels.BFloat16: 1.6e-2}[m.DType] * scale
	bad := 0
	for i := range w {
		if math.IsNaN(w[i]) != math.IsNaN(g[i]) || (!math.IsNaN(w[i]) && math.Abs(g[i]-w[i]) > tol && g[i] != w[i]) {
			if bad < 3 {
				t.Errorf("%s%v: element %d is %v, want %v", name, m.Shape, i, g[i], w[i])
			}
			bad++
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d elements differ", name, bad)
	}
}

// TestCrossEntropyTargetOutOfRange: a target outside [0, C) fails with
// kernels.ErrIndex, in the loss and its gradient.
func TestCrossEntropyTargetOutOfRange(t *testing.T) {
	be := newBackend(t)
	for _, tv := range []float64{-1, 4} {
		for _, op := range []kernels.Op{{Name: kernels.OpCrossEntropy}, {Name: kernels.OpCrossEntropyGrad, Reduce: kernels.ReduceSum}} {
			ins := []nnInput{
				{kernels.Float32, []int{3, 4}, make([]float64, 12)},
				{kernels.Int64, []int{3}, []float64{0, tv, 1}},
			}
			if op.Name == kernels.OpCrossEntropyGrad {
				ins = append(ins, nnInput{kernels.Float32, []int{}, []float64{1}})
			}
			if _, _, err := execBytes(t, be, &op, ins); !errors.Is(err, kernels.ErrIndex) {
				t.Errorf("%s with target %v: %v, want ErrIndex", op.Name, tv, err)
			}
		}
	}
}

// TestConvDeterministic: at the MNIST CNN's sizes, where cuBLAS picks
// split and batched kernels, two runs of each convolution give the same
// bits.
func TestConvDeterministic(t *testing.T) {
	be := newBackend(t)
	r := rand.New(rand.NewPCG(3, 4))
	x, w, dy := []int{128, 32, 26, 26}, []int{64, 32, 3, 3}, []int{128, 64, 24, 24}
	in := func(shapes ...[]int) []nnInput {
		var l []nnInput
		for _, s := range shapes {
			l = append(l, nnInput{kernels.Float32, s, nnRandom(r, kernels.Numel(s), false)})
		}
		return l
	}
	for _, c := range []struct {
		op  kernels.Op
		ins []nnInput
	}{
		{kernels.Op{Name: kernels.OpConv2D}, in(x, w, []int{64})},
		{kernels.Op{Name: kernels.OpConv2DInputGrad, Shape: x}, in(dy, w)},
		{kernels.Op{Name: kernels.OpConv2DWeightGrad, Shape: w}, in(x, dy)},
		{kernels.Op{Name: kernels.OpMaxPool2DGrad, Kernel: []int{2, 2}}, in([]int{128, 64, 12, 12}, dy)},
	} {
		a, _, err := execBytes(t, be, &c.op, c.ins)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := execBytes(t, be, &c.op, c.ins)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s: two runs differ", c.op.Name)
		}
	}
}
