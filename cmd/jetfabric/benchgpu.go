package main

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// gpuBench is what the device benchmarks of `jetfabric bench --device
// gpu-N` measured through the fabric.
type gpuBench struct {
	MatmulN      int     `json:"matmul_n"`
	MatmulChain  int     `json:"matmul_chain"`
	MatmulOpsS   float64 `json:"matmul_ops_per_s"`
	MatmulTFLOPs float64 `json:"matmul_tflop_per_s"`
	ChainElems   int     `json:"chain_elements"`
	ChainRuns    int     `json:"chain_runs"`
	ChainMs      float64 `json:"chain_ms"`
	ChainGBs     float64 `json:"chain_gb_per_s"`
}

// benchDevice times, on session s, a chain of float32 matmuls of n x n
// (each product's input freed once used) and the 8-op elementwise chain of
// the CUDA backend's BenchmarkElementwise over elems float32 values (its
// intermediates freed in the same frame, so a fusing worker never writes
// them). Both are end to end: ops published, executed, a sync waited for.
func benchDevice(ctx context.Context, s *client.Session, n, chain, elems, runs int, rep *gpuBench, progress func(string, ...any)) error {
	rep.MatmulN, rep.MatmulChain, rep.ChainElems, rep.ChainRuns = n, chain, elems, runs
	progress("matmul chain: %d products of %dx%d f32", chain, n, n)
	a := s.Normal([]int{n, n}, 0, 1/math.Sqrt(float64(n)))
	x := s.Normal([]int{n, n}, 0, 1)
	// Warm up: compile, cuBLAS handles and algorithms.
	w := x.Matmul(a)
	if err := s.Sync(ctx); err != nil {
		return err
	}
	w.Free()
	t0 := time.Now()
	for range chain {
		y := x.Matmul(a)
		x.Free()
		x = y
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	el := time.Since(t0).Seconds()
	rep.MatmulOpsS = float64(chain) / el
	rep.MatmulTFLOPs = 2 * math.Pow(float64(n), 3) * float64(chain) / el / 1e12
	if v, err := x.Reduce("max", false).Float32s(ctx); err != nil {
		return err
	} else if math.IsNaN(float64(v[0])) || math.IsInf(float64(v[0]), 0) {
		return fmt.Errorf("matmul chain gave %v", v[0])
	}
	x.Free()
	a.Free()

	progress("elementwise chain: %d runs of 8 ops over %d f32", runs, elems)
	x = s.Normal([]int{elems}, 0, 1)
	b := s.Full([]int{}, 0.5)
	run := func() *client.Tensor {
		t2 := x.Mul(b)
		t3 := t2.Add(x)
		t4 := t3.Relu()
		t5 := t4.Sub(b)
		t6 := t5.Neg()
		t7 := t6.Mul(t6)
		t8 := t7.Add(b)
		t9 := t8.Tanh()
		for _, t := range []*client.Tensor{t2, t3, t4, t5, t6, t7, t8} {
			t.Free()
		}
		s.Flush() // one chain, one frame
		return t9
	}
	y := run()
	if err := s.Sync(ctx); err != nil {
		return err
	}
	t0 = time.Now()
	for range runs {
		y.Free()
		y = run()
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	el = time.Since(t0).Seconds()
	rep.ChainMs = el * 1e3 / float64(runs)
	rep.ChainGBs = float64(2*4*elems) * float64(runs) / el / 1e9
	y.Free()
	x.Free()
	b.Free()
	return s.Sync(ctx)
}
