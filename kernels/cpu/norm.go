package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	defVar(execNorm, -1, 1, kernels.OpLayerNorm, kernels.OpRMSNorm)
	def(execConst, 0, kernels.OpZeros, kernels.OpOnes)
	def(execLinspace, 0, kernels.OpLinspace)
	def(execEye, 0, kernels.OpEye)
	def(execBernoulli, 0, kernels.OpBernoulli)
}

// bcastIter walks the elements of a tensor of shape out in order and
// tracks the offset of the element of a tensor of shape in (which
// broadcasts to out) that each one reads.
type bcastIter struct {
	out, st []int
	pos     [maxRank]int
	off     int
}

func newBcastIter(out, in []int) *bcastIter {
	r, ir := len(out), len(in)
	ist := strides(in)
	st := make([]int, r)
	for d := range r {
		if j := d - (r - ir); j >= 0 && in[j] == out[d] {
			st[d] = ist[j]
		}
	}
	return &bcastIter{out: out, st: st}
}

// next moves to the following element.
func (it *bcastIter) next() {
	for k := len(it.out) - 1; k >= 0; k-- {
		it.pos[k]++
		it.off += it.st[k]
		if it.pos[k] < it.out[k] {
			return
		}
		it.off -= it.st[k] * it.out[k]
		it.pos[k] = 0
	}
}

// execNorm runs layer_norm and rms_norm in float64 over groups of
// trailing elements, rounding each result once:
// layer_norm: (x - mean) / sqrt(var + eps) · weight + bias, var the
// population variance; rms_norm: x / sqrt(mean(x²) + eps) · weight + bias.
func execNorm(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	x, y := in[0], out[0]
	k, err := kernels.NormGroup(op, len(x.Shape))
	if err != nil {
		return err
	}
	g := kernels.Numel(x.Shape[len(x.Shape)-k:])
	n := x.Numel()
	if n == 0 {
		return nil
	}
	xd, yd, dt := data(x), data(y), x.DType
	var w, bias []byte
	var wi, bi *bcastIter
	if len(in) > 1 {
		w, wi = data(in[1]), newBcastIter(x.Shape, in[1].Shape)
	}
	if len(in) > 2 {
		bias, bi = data(in[2]), newBcastIter(x.Shape, in[2].Shape)
	}
	vals := make([]float64, g)
	for base := 0; base < n; base += g {
		for i := range vals {
			vals[i] = kernels.Value(dt, xd, base+i)
		}
		mean := 0.0
		if op.Name == kernels.OpLayerNorm {
			for _, v := range vals {
				mean += v
			}
			mean /= float64(g)
		}
		ss := 0.0
		for _, v := range vals {
			ss += (v - mean) * (v - mean)
		}
		rstd := 1 / math.Sqrt(ss/float64(g)+op.Eps)
		for i, v := range vals {
			j := base + i
			r := (v - mean) * rstd
			if w != nil {
				r *= kernels.Value(dt, w, wi.off)
				wi.next()
			}
			if bias != nil {
				r += kernels.Value(dt, bias, bi.off)
				bi.next()
			}
			kernels.PutValue(dt, yd, j, r)
		}
	}
	return nil
}

func execConst(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	v := 0.0
	if op.Name == kernels.OpOnes {
		v = 1
	}
	return execFull(b, &kernels.Op{Name: kernels.OpFull, Value: v}, nil, out)
}

func execLinspace(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	y := out[0]
	n := y.Numel()
	var fb [castChunk]float64
	for c := 0; c < n; c += castChunk {
		e := min(c+castChunk, n)
		f := fb[:e-c]
		for i := range f {
			f[i] = kernels.LinspaceAt(op.Start, op.Stop, op.Num, c+i)
		}
		storeFloat(data(y), y.DType, f, c, e)
	}
	return nil
}

func execEye(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	y := out[0]
	yd := data(y)
	clear(yd)
	rows, cols := y.Shape[0], y.Shape[1]
	k := clampInt(op.K, -rows-1, cols+1)
	for i := range rows {
		if j := i + k; j >= 0 && j < cols {
			kernels.PutValue(y.DType, yd, i*cols+j, 1)
		}
	}
	return nil
}

func execBernoulli(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	y := out[0]
	yd := data(y)
	n := y.Numel()
	switch y.DType {
	case kernels.Float32:
		bernoulli(view[float32](yd, n), op.Seed, op.Key, op.P)
	case kernels.Float64:
		bernoulli(view[float64](yd, n), op.Seed, op.Key, op.P)
	default:
		for i := range n {
			v := 0.0
			if kernels.UniformAt(op.Seed, op.Key, uint64(i), 0, 1) < op.P {
				v = 1
			}
			kernels.PutValue(y.DType, yd, i, v)
		}
	}
	return nil
}

// bernoulli fills y with the draws of kernels.UniformAt(seed, key, i, 0,
// 1) < p as 0 or 1 (the same bits), in parallel, without a branch on the
// draw.
func bernoulli[T float](y []T, seed, key uint64, p float64) {
	s := kernels.RandomStream(seed, key)
	parallel(len(y), split(len(y), 8), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			y[i] = T(b2u(kernels.Uniform01(kernels.RandomAt(s, uint64(i))) < p))
		}
	})
}
