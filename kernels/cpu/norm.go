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

// bcastOffsets returns, for each element of a tensor of shape out, the
// offset of the element of a tensor of shape in (which broadcasts to out)
// that it reads.
func bcastOffsets(out, in []int) []int {
	n := kernels.Numel(out)
	r, ir := len(out), len(in)
	ist := strides(in)
	st := make([]int, r)
	for d := range r {
		if j := d - (r - ir); j >= 0 && in[j] == out[d] {
			st[d] = ist[j]
		}
	}
	offs := make([]int, n)
	var pos [maxRank]int
	o := 0
	for j := range n {
		offs[j] = o
		for k := r - 1; k >= 0; k-- {
			pos[k]++
			o += st[k]
			if pos[k] < out[k] {
				break
			}
			o -= st[k] * out[k]
			pos[k] = 0
		}
	}
	return offs
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
	var woff, boff []int
	if len(in) > 1 {
		w, woff = data(in[1]), bcastOffsets(x.Shape, in[1].Shape)
	}
	if len(in) > 2 {
		bias, boff = data(in[2]), bcastOffsets(x.Shape, in[2].Shape)
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
				r *= kernels.Value(dt, w, woff[j])
			}
			if bias != nil {
				r += kernels.Value(dt, bias, boff[j])
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
	f := make([]float64, y.Numel())
	for i := range f {
		f[i] = kernels.LinspaceAt(op.Start, op.Stop, op.Num, i)
	}
	storeFloat(data(y), y.DType, f, 0, len(f))
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
	for i := range y.Numel() {
		v := 0.0
		if kernels.UniformAt(op.Seed, op.Key, uint64(i), 0, 1) < op.P {
			v = 1
		}
		kernels.PutValue(y.DType, yd, i, v)
	}
	return nil
}
