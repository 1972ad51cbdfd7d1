package cpu

import (
	"fmt"
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execCrossEntropy, 2, kernels.OpCrossEntropy)
	def(execCrossEntropy, 3, kernels.OpCrossEntropyGrad)
}

// execCrossEntropy runs cross_entropy and its gradient, in float64, one
// task per range of rows; the loss of "mean" and "sum" is summed over rows
// in order.
func execCrossEntropy(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	red, err := kernels.CrossEntropyReduce(op)
	if err != nil {
		return err
	}
	n, c := in[0].Shape[0], in[0].Shape[1]
	target := make([]int, n)
	for i := range target {
		var v int64
		if in[1].DType == kernels.Int32 {
			v = int64(view[int32](data(in[1]), n)[i])
		} else {
			v = view[int64](data(in[1]), n)[i]
		}
		if v < 0 || v >= int64(c) {
			return fmt.Errorf("%w: %w: cpu: %s target %d of row %d is outside [0, %d)", kernels.ErrIndex, kernels.ErrShape, op.Name, v, i, c)
		}
		target[i] = int(v)
	}
	switch in[0].DType {
	case kernels.Float32:
		runCrossEntropy[float32](op.Name, red, in, out, target, c)
	case kernels.Float64:
		runCrossEntropy[float64](op.Name, red, in, out, target, c)
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, in[0].DType)
	}
	return nil
}

// logSumExp is log(sum(exp(row))), NaN if the row holds one.
func logSumExp[T float](row []T) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		if f := float64(v); f > m || f != f {
			m = f
		}
	}
	if math.IsInf(m, 0) || m != m {
		return m
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

func runCrossEntropy[T float](name, red string, in, out []*kernels.Tensor, target []int, c int) {
	n := len(target)
	logits := view[T](data(in[0]), n*c)
	y := view[T](data(out[0]), out[0].Numel())
	if name == kernels.OpCrossEntropy {
		loss := make([]float64, n)
		f := func(lo, hi int) {
			for i := lo; i < hi; i++ {
				row := logits[i*c : (i+1)*c]
				loss[i] = logSumExp(row) - float64(row[target[i]])
			}
		}
		if w := split(n, 4*c); w > 1 {
			parallel(n, w, f)
		} else {
			f(0, n)
		}
		if red == kernels.ReduceNone {
			for i, l := range loss {
				y[i] = T(l)
			}
			return
		}
		s := 0.0
		for _, l := range loss {
			s += l
		}
		if red == kernels.ReduceMean {
			s /= float64(n)
		}
		y[0] = T(s)
		return
	}
	dy := view[T](data(in[2]), in[2].Numel())
	f := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var g float64
			switch red {
			case kernels.ReduceNone:
				g = float64(dy[i])
			case kernels.ReduceSum:
				g = float64(dy[0])
			default:
				g = float64(dy[0]) / float64(n)
			}
			row, dst := logits[i*c:(i+1)*c], y[i*c:(i+1)*c]
			lse := logSumExp(row)
			for j, v := range row {
				p := math.Exp(float64(v) - lse)
				if j == target[i] {
					p--
				}
				dst[j] = T(p * g)
			}
		}
	}
	if w := split(n, 4*c); w > 1 {
		parallel(n, w, f)
		return
	}
	f(0, n)
}
