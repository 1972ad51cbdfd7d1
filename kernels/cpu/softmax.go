package cpu

import (
	"fmt"
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execSoftmax, 1, kernels.OpSoftmax, kernels.OpLogSoftmax)
}

// execSoftmax computes softmax or log_softmax over op.Axis, in float64:
// y = exp(x - m) / s or y = x - m - log(s), with m the largest element and
// s the sum of exp(x - m) along the axis.
func execSoftmax(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	x, y := in[0], out[0]
	if y.DType != x.DType {
		return dtypeErr(op, "output", 0, y.DType)
	}
	if !sameShape(x.Shape, y.Shape) {
		return shapeErr(op, "input %v, output %v", x.Shape, y.Shape)
	}
	r := len(x.Shape)
	axis := op.Axis
	if axis < 0 {
		axis += r
	}
	if axis < 0 || axis >= r {
		return fmt.Errorf("%w: cpu: %s axis %d out of range for rank %d", kernels.ErrAttr, op.Name, op.Axis, r)
	}
	outer, n, inner := 1, x.Shape[axis], 1
	for _, d := range x.Shape[:axis] {
		outer *= d
	}
	for _, d := range x.Shape[axis+1:] {
		inner *= d
	}
	log := op.Name == kernels.OpLogSoftmax
	xd, yd := data(x), data(y)
	size := x.Numel()
	switch x.DType {
	case kernels.Float32:
		softmax(view[float32](xd, size), view[float32](yd, size), outer, n, inner, log)
	case kernels.Float64:
		softmax(view[float64](xd, size), view[float64](yd, size), outer, n, inner, log)
	case kernels.Float16, kernels.BFloat16:
		return b.viaF32(op, in, out)
	default:
		return dtypeErr(op, "input", 0, x.DType)
	}
	return nil
}

// softmaxCols is how many columns of an inner axis one task normalises.
const softmaxCols = 256

// softmax normalises x of shape [outer, n, inner] over n. Tasks are outer
// indices times chunks of inner columns; each column is summed in order.
func softmax[T float](x, y []T, outer, n, inner int, log bool) {
	if len(y) == 0 {
		return
	}
	chunks := (inner + softmaxCols - 1) / softmaxCols
	tasks := outer * chunks
	if w := split(tasks, n*min(inner, softmaxCols)*12); w > 1 {
		parallel(tasks, w, func(lo, hi int) { softmaxTasks(x, y, n, inner, log, lo, hi) })
		return
	}
	softmaxTasks(x, y, n, inner, log, 0, tasks)
}

func softmaxTasks[T float](x, y []T, n, inner int, log bool, lo, hi int) {
	chunks := (inner + softmaxCols - 1) / softmaxCols
	var mb, sb [softmaxCols]float64
	for t := lo; t < hi; t++ {
		o, c := t/chunks, t%chunks
		base := o * n * inner
		if inner == 1 {
			softmaxRow(x[base:base+n], y[base:base+n], log)
			continue
		}
		j0, j1 := c*softmaxCols, min(c*softmaxCols+softmaxCols, inner)
		m, s := mb[:j1-j0], sb[:j1-j0]
		for j := range m {
			m[j] = math.Inf(-1)
			s[j] = 0
		}
		for i := range n {
			row := x[base+i*inner+j0 : base+i*inner+j1]
			for j, v := range row[:len(m)] {
				if f := float64(v); f > m[j] || f != f {
					m[j] = f
				}
			}
		}
		for i := range n {
			row := x[base+i*inner+j0 : base+i*inner+j1]
			for j, v := range row[:len(m)] {
				s[j] += math.Exp(float64(v) - m[j])
			}
		}
		if log {
			for j := range s {
				s[j] = m[j] + math.Log(s[j])
			}
		}
		for i := range n {
			row := x[base+i*inner+j0 : base+i*inner+j1]
			yrow := y[base+i*inner+j0 : base+i*inner+j1]
			for j, v := range row[:len(m)] {
				if log {
					yrow[j] = T(float64(v) - s[j])
				} else {
					yrow[j] = T(math.Exp(float64(v)-m[j]) / s[j])
				}
			}
		}
	}
}

func softmaxRow[T float](x, y []T, log bool) {
	m := math.Inf(-1)
	for _, v := range x {
		if f := float64(v); f > m || f != f {
			m = f
		}
	}
	s := 0.0
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	y = y[:len(x)]
	if log {
		ls := m + math.Log(s)
		for i, v := range x {
			y[i] = T(float64(v) - ls)
		}
		return
	}
	for i, v := range x {
		y[i] = T(math.Exp(float64(v)-m) / s)
	}
}
