package cpu_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// TestNewOpsWireInput gives the movement, indexing, norm and creation ops
// random attributes, extreme ones included, as a wire client might: Infer
// must answer with an error or metas, and Exec on what Infer accepts must
// succeed or fail with kernels.ErrIndex (or ErrTooLarge, for an empty
// tensor with dims too large for the backend), never panic.
func TestNewOpsWireInput(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	b := cpu.New()
	extremes := []int{0, 1, -1, 2, -2, 3, 7, -7, math.MaxInt, math.MinInt, math.MaxInt32, 1 << 40}
	num := func() int {
		if r.IntN(3) == 0 {
			return extremes[r.IntN(len(extremes))]
		}
		return r.IntN(9) - 4
	}
	ints := func() []int {
		if r.IntN(5) == 0 {
			return nil
		}
		v := make([]int, r.IntN(7))
		for i := range v {
			v[i] = num()
		}
		return v
	}
	var names []string
	for _, l := range [][]string{kernels.Movement, kernels.Indexing, kernels.Norms, kernels.Creation} {
		names = append(names, l...)
	}
	dtypes := []kernels.DType{kernels.Float32, kernels.Float16, kernels.Int64, kernels.Int32, kernels.Bool, kernels.Uint8}
	accepted := 0
	for range 60000 {
		op := &kernels.Op{Name: names[r.IntN(len(names))], Shape: ints(), Axes: ints(), Starts: ints(), Ends: ints(),
			Steps: ints(), Pads: ints(), Sizes: ints(), Axis: num(), K: num(), Depth: num(), Num: num(), N: num(), M: num(),
			Eps: []float64{0, 1e-5, -1, math.NaN(), math.Inf(1)}[r.IntN(5)], P: []float64{0, 0.5, 1, -0.1, math.NaN()}[r.IntN(5)],
			Value: r.NormFloat64(), Start: r.NormFloat64(), Stop: r.NormFloat64()}
		if r.IntN(2) == 0 {
			op.DType = dtypes[r.IntN(len(dtypes))]
		}
		in := make([]*kernels.Tensor, r.IntN(4))
		metas := make([]kernels.Meta, len(in))
		for i := range in {
			shape := make([]int, r.IntN(4))
			for d := range shape {
				shape[d] = r.IntN(4)
			}
			m := kernels.Meta{DType: dtypes[r.IntN(len(dtypes))], Shape: shape}
			buf, err := b.Alloc(m.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			if m.DType == kernels.Int64 || m.DType == kernels.Int32 {
				v := make([]float64, m.Numel())
				for j := range v {
					v[j] = float64(num())
				}
				data, _ := kernels.EncodeValues(m.DType, v)
				if err := b.Upload(buf, data); err != nil {
					t.Fatal(err)
				}
			}
			in[i], metas[i] = &kernels.Tensor{Meta: m, Buf: buf}, m
		}
		var outm []kernels.Meta
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("Infer(%+v, %v) panicked: %v", op, metas, p)
				}
			}()
			var err error
			if outm, err = kernels.Infer(op, metas, kernels.Limits{MaxRank: 8, MaxElements: 1 << 16}); err != nil {
				outm = nil
			}
		}()
		if outm == nil {
			continue
		}
		accepted++
		out := make([]*kernels.Tensor, len(outm))
		for i, m := range outm {
			buf, err := b.Alloc(m.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			out[i] = &kernels.Tensor{Meta: m, Buf: buf}
		}
		err := b.Exec(op, in, out)
		refused := errors.Is(err, kernels.ErrIndex) || errors.Is(err, kernels.ErrTooLarge) // dims past the backend's, 0 elements
		if err != nil && (!refused || strings.Contains(err.Error(), "internal")) {
			t.Fatalf("Exec(%+v, %v): %v", op, metas, err)
		}
	}
	t.Logf("%d of 60000 random ops accepted", accepted)
	if accepted < 1000 {
		t.Errorf("only %d of 60000 random ops accepted", accepted)
	}
}
