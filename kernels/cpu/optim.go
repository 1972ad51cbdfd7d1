package cpu

import (
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	defVar(execAdamStep, 4, 3, kernels.OpAdamStep)
	defVar(execSGDStep, -1, -1, kernels.OpSGDStep)
	// Element i of every output reads only element i of the inputs, all of
	// them before any output is written, so outputs may take the inputs'
	// buffers.
	elementwise[kernels.OpAdamStep] = true
	elementwise[kernels.OpSGDStep] = true
}

// execAdamStep runs adam_step in one pass: float64 for f64, float32
// otherwise (f16 and bf16 widened, each result rounded once), with the
// per-step scalars computed in float64 and rounded to that type, as
// PyTorch's Adam does.
func execAdamStep(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	c := op.Adam()
	switch in[0].DType {
	case kernels.Float32:
		runAdam[float32](in, out, c)
	case kernels.Float64:
		runAdam[float64](in, out, c)
	default:
		return b.viaF32(op, in, out)
	}
	return nil
}

func runAdam[T float](in, out []*kernels.Tensor, c kernels.AdamCoefs) {
	n := in[0].Numel()
	p, g, m, v := view[T](data(in[0]), n), view[T](data(in[1]), n), view[T](data(in[2]), n), view[T](data(in[3]), n)
	po, mo, vo := view[T](data(out[0]), n), view[T](data(out[1]), n), view[T](data(out[2]), n)
	decay, l2 := T(c.Decay), T(c.L2)
	w1, b2, w2 := T(c.OneMinusBeta1), T(c.Beta2), T(c.OneMinusBeta2)
	lerpLow := w1 < 0.5
	w1c := 1 - w1 // torch.lerp's weight for the other end
	step, bc2, eps := T(c.StepSize), T(c.BC2Sqrt), T(c.Eps)
	parallel(n, split(n, 12), func(lo, hi int) {
		if pf, ok := any(p).([]float32); ok && lerpLow {
			c := [8]float32{float32(decay), float32(w1), float32(b2), float32(w2), float32(step), float32(bc2), float32(eps), float32(l2)}
			lo += adamVec(pf[lo:hi], any(g).([]float32)[lo:hi], any(m).([]float32)[lo:hi], any(v).([]float32)[lo:hi],
				any(po).([]float32)[lo:hi], any(mo).([]float32)[lo:hi], any(vo).([]float32)[lo:hi], &c, l2 != 0)
		}
		for i := lo; i < hi; i++ {
			pi, gi, mi, vi := p[i], g[i], m[i], v[i]
			if l2 != 0 {
				gi += l2 * pi
			}
			pi *= decay
			if lerpLow {
				mi += w1 * (gi - mi)
			} else {
				mi = gi - (gi-mi)*w1c
			}
			vi = vi*b2 + w2*gi*gi
			denom := T(math.Sqrt(float64(vi)))/bc2 + eps
			po[i], mo[i], vo[i] = pi-step*(mi/denom), mi, vi
		}
	})
}

// execSGDStep runs sgd_step in one pass, typed as execAdamStep.
func execSGDStep(b *Backend, op *kernels.Op, in, out []*kernels.Tensor) error {
	if err := checkMetas(op, in, out); err != nil {
		return err
	}
	switch in[0].DType {
	case kernels.Float32:
		runSGD[float32](op, in, out)
	case kernels.Float64:
		runSGD[float64](op, in, out)
	default:
		return b.viaF32(op, in, out)
	}
	return nil
}

func runSGD[T float](op *kernels.Op, in, out []*kernels.Tensor) {
	n := in[0].Numel()
	p, g, po := view[T](data(in[0]), n), view[T](data(in[1]), n), view[T](data(out[0]), n)
	var buf, bo []T
	if len(in) == 3 {
		buf = view[T](data(in[2]), n)
	}
	if len(out) == 2 {
		bo = view[T](data(out[1]), n)
	}
	lr, wd, mom, damp := T(op.LR), T(op.WeightDecay), T(op.Momentum), T(1-op.Dampening)
	nesterov := op.Nesterov
	parallel(n, split(n, 6), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			pi, gi := p[i], g[i]
			if wd != 0 {
				gi += wd * pi
			}
			if bo != nil {
				b := gi
				if buf != nil {
					b = buf[i]*mom + damp*gi
				}
				bo[i] = b
				if nesterov {
					gi += mom * b
				} else {
					gi = b
				}
			}
			po[i] = pi - lr*gi
		}
	})
}
