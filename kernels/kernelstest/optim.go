package kernelstest

import (
	"errors"
	"fmt"
	"math"

	"github.com/jetfabric/jetfabric/kernels"
)

// Tests of the fused optimizer updates.

func init() {
	opTests[kernels.OpAdamStep] = func(s *suite) { s.adamStep() }
	opTests[kernels.OpSGDStep] = func(s *suite) { s.sgdStep() }
	extraInferErrors = append(extraInferErrors, optimInferErrors...)
}

// optimInferErrors are the attribute, shape and dtype errors of adam_step
// and sgd_step.
var optimInferErrors = func() []struct {
	op   kernels.Op
	in   []kernels.Meta
	want error
} {
	adam := func(f func(*kernels.Op)) kernels.Op {
		op := kernels.Op{Name: kernels.OpAdamStep, LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1}
		f(&op)
		return op
	}
	sgd := func(f func(*kernels.Op)) kernels.Op {
		op := kernels.Op{Name: kernels.OpSGDStep, LR: 0.1, Momentum: 0.9}
		f(&op)
		return op
	}
	p4 := []kernels.Meta{f32(3), f32(3), f32(3), f32(3)}
	p3 := []kernels.Meta{f32(3), f32(3), f32(3)}
	return []struct {
		op   kernels.Op
		in   []kernels.Meta
		want error
	}{
		{adam(func(*kernels.Op) {}), p4[:3], kernels.ErrArity},
		{adam(func(*kernels.Op) {}), []kernels.Meta{f32(3), f32(3), f32(3), f32(3), f32(3)}, kernels.ErrArity},
		{adam(func(*kernels.Op) {}), []kernels.Meta{f32(3), f32(3), f32(3), f32(2)}, kernels.ErrShape},
		{adam(func(*kernels.Op) {}), []kernels.Meta{f32(3), f32(1), f32(3), f32(3)}, kernels.ErrShape},
		{adam(func(*kernels.Op) {}), []kernels.Meta{f32(3), f32(3), meta(kernels.Float64, 3), f32(3)}, kernels.ErrDType},
		{adam(func(*kernels.Op) {}), []kernels.Meta{meta(kernels.Int32, 3), meta(kernels.Int32, 3), meta(kernels.Int32, 3), meta(kernels.Int32, 3)}, kernels.ErrDType},
		{adam(func(op *kernels.Op) { op.T = 0 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.T = -3 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.LR = -1 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.LR = math.NaN() }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.Beta1 = 1 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.Beta2 = -0.1 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.Eps = math.Inf(1) }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.WeightDecay = -0.01 }), p4, kernels.ErrAttr},
		{adam(func(op *kernels.Op) { op.Momentum = 0.9 }), p4, kernels.ErrAttr},
		{sgd(func(*kernels.Op) {}), p4, kernels.ErrArity},
		{sgd(func(*kernels.Op) {}), p4[:1], kernels.ErrArity},
		{sgd(func(op *kernels.Op) { op.Momentum = 0 }), p3, kernels.ErrArity},
		{sgd(func(*kernels.Op) {}), []kernels.Meta{f32(3), f32(3), f32(4)}, kernels.ErrShape},
		{sgd(func(*kernels.Op) {}), []kernels.Meta{f32(3), meta(kernels.BFloat16, 3)}, kernels.ErrDType},
		{sgd(func(*kernels.Op) {}), []kernels.Meta{meta(kernels.Uint8, 3), meta(kernels.Uint8, 3)}, kernels.ErrDType},
		{sgd(func(op *kernels.Op) { op.LR = -0.1 }), p3, kernels.ErrAttr},
		{sgd(func(op *kernels.Op) { op.Momentum = -0.5 }), p3[:2], kernels.ErrAttr},
		{sgd(func(op *kernels.Op) { op.Dampening = math.Inf(-1) }), p3, kernels.ErrAttr},
		{sgd(func(op *kernels.Op) { op.Nesterov, op.Dampening = true, 0.1 }), p3, kernels.ErrAttr},
		{sgd(func(op *kernels.Op) { op.Nesterov, op.Momentum = true, 0 }), p3[:2], kernels.ErrAttr},
		{sgd(func(op *kernels.Op) { op.T = 1 }), p3, kernels.ErrAttr},
	}
}()

// optimShapes are the parameter shapes of the optimizer tests: a scalar,
// empty, small, and large enough to run in parallel.
var optimShapes = [][]int{{}, {0}, {7}, {3, 5}, {9000}}

// runStep executes an optimizer update and compares every output with its
// want; a backend may decline dtypes other than float32.
func (s *suite) runStep(op *kernels.Op, ws []want, ins ...*host) {
	s.t.Helper()
	what := opString(op)
	for _, h := range ins {
		what += " " + h.String()
	}
	got, err := s.exec(op, ins...)
	if errors.Is(err, errNotImplemented) && s.opts.mayDecline(op.Name) && ins[0].dt != kernels.Float32 {
		s.skipped++
		return
	}
	if err != nil {
		s.t.Errorf("%s: %v", what, err)
		return
	}
	if len(got) != len(ws) {
		s.t.Errorf("%s: %d outputs, want %d", what, len(got), len(ws))
		return
	}
	for i, w := range ws {
		s.check(fmt.Sprintf("%s: output %d", what, i), got[i], w)
	}
}

// optimWant is a reference result with a tolerance of a few roundings of
// the magnitudes in scale, the result computed in dt's compute type.
func optimWant(dt kernels.DType, shape []int, v, scale []float64) want {
	w := rounded(dt, shape, v, tolerances[dt])
	w.terms, w.scale = 8, scale
	if dt == kernels.Float16 || dt == kernels.BFloat16 {
		// Computed in float32, rounded once to dt: tolerances[dt] allows
		// for the last rounding, the scale for those of float32.
		r := tolerances[kernels.Float32].unit / tolerances[dt].unit
		for j := range scale {
			scale[j] *= r
		}
	}
	return w
}

func (s *suite) adamStep() {
	attrs := []kernels.Op{
		{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1},
		{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 7, WeightDecay: 0.1},
		{LR: 1e-2, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, T: 3, WeightDecay: 0.05, Decoupled: true},
		{LR: 0.5, Beta1: 0.3, Beta2: 0.5, Eps: 0.1, T: 1000},
		{LR: 0, Beta1: 0, Beta2: 0, Eps: 1e-3, T: 2, Decoupled: true},
	}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
		for k, a := range attrs {
			for _, sh := range optimShapes {
				op := a
				op.Name = kernels.OpAdamStep
				p, g, m := random(s.r, dt, sh, distAny), random(s.r, dt, sh, distAny), random(s.r, dt, sh, distUnit)
				v := random(s.r, dt, sh, distPos)
				for j := range v.f {
					v.f[j] = roundFloat(v.f[j]*v.f[j]/16, dt)
				}
				if k == 0 { // a first step: the state is zero
					for j := range m.f {
						m.f[j], v.f[j] = 0, 0
					}
				}
				s.runStep(&op, refAdamStep(&op, p, g, m, v), p, g, m, v)
			}
		}
	}
	// A NaN gradient poisons only its own element.
	p, g := random(s.r, kernels.Float32, []int{5}, distAny), random(s.r, kernels.Float32, []int{5}, distAny)
	m, v := newHost(kernels.Float32, []int{5}), newHost(kernels.Float32, []int{5})
	g.f[2] = math.NaN()
	op := &kernels.Op{Name: kernels.OpAdamStep, LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1}
	s.runStep(op, refAdamStep(op, p, g, m, v), p, g, m, v)
}

// refAdamStep is torch.optim.Adam's (or AdamW's) update in float64.
func refAdamStep(op *kernels.Op, p, g, m, v *host) []want {
	c := op.Adam()
	n := p.numel()
	po, mo, vo := make([]float64, n), make([]float64, n), make([]float64, n)
	ps, ms, vs := make([]float64, n), make([]float64, n), make([]float64, n)
	for j := range n {
		gi := g.f[j] + c.L2*p.f[j]
		mi := m.f[j] + c.OneMinusBeta1*(gi-m.f[j])
		vi := v.f[j]*c.Beta2 + c.OneMinusBeta2*gi*gi
		denom := math.Sqrt(vi)/c.BC2Sqrt + c.Eps
		po[j] = p.f[j]*c.Decay - c.StepSize*mi/denom
		mo[j], vo[j] = mi, vi
		ms[j] = math.Abs(m.f[j]) + math.Abs(gi)
		vs[j] = math.Abs(v.f[j]) + gi*gi
		ps[j] = math.Abs(p.f[j]) + math.Abs(c.L2*p.f[j]) + c.StepSize*(ms[j]+math.Abs(mi))/denom
	}
	return []want{optimWant(p.dt, p.shape, po, ps), optimWant(p.dt, p.shape, mo, ms), optimWant(p.dt, p.shape, vo, vs)}
}

func (s *suite) sgdStep() {
	attrs := []kernels.Op{
		{LR: 0.1},
		{LR: 0.1, WeightDecay: 0.01},
		{LR: 0.05, Momentum: 0.9},
		{LR: 0.05, Momentum: 0.9, Dampening: 0.1, WeightDecay: 1e-3},
		{LR: 0.01, Momentum: 0.5, Nesterov: true},
		{LR: 0.01, Momentum: 0.99, Dampening: -0.5},
	}
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
		for _, a := range attrs {
			for _, sh := range optimShapes {
				op := a
				op.Name = kernels.OpSGDStep
				p, g := random(s.r, dt, sh, distAny), random(s.r, dt, sh, distAny)
				s.runStep(&op, refSGDStep(&op, p, g, nil), p, g)
				if op.Momentum != 0 {
					buf := random(s.r, dt, sh, distAny)
					s.runStep(&op, refSGDStep(&op, p, g, buf), p, g, buf)
				}
			}
		}
	}
}

// refSGDStep is torch.optim.SGD's update in float64; buf nil is the
// first step.
func refSGDStep(op *kernels.Op, p, g, buf *host) []want {
	n := p.numel()
	po, bo, ps, bs := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	for j := range n {
		gi := g.f[j] + op.WeightDecay*p.f[j]
		gs := math.Abs(g.f[j]) + math.Abs(op.WeightDecay*p.f[j])
		if op.Momentum != 0 {
			b, sc := gi, gs
			if buf != nil {
				b = buf.f[j]*op.Momentum + (1-op.Dampening)*gi
				sc = math.Abs(buf.f[j]*op.Momentum) + math.Abs((1-op.Dampening)*gi) + gs
			}
			bo[j], bs[j] = b, sc
			if op.Nesterov {
				gi, gs = gi+op.Momentum*b, gs+math.Abs(op.Momentum)*sc
			} else {
				gi, gs = b, sc
			}
		}
		po[j] = p.f[j] - op.LR*gi
		ps[j] = math.Abs(p.f[j]) + op.LR*(gs+math.Abs(gi))
	}
	ws := []want{optimWant(p.dt, p.shape, po, ps)}
	if op.Momentum != 0 {
		ws = append(ws, optimWant(p.dt, p.shape, bo, bs))
	}
	return ws
}

// optimExecErrors hands Exec optimizer updates whose tensors do not fit:
// each must fail without panicking.
func optimExecErrors(s *suite) {
	b := s.b
	buf, err := b.Alloc(8 * 12)
	if err != nil {
		s.t.Fatal(err)
	}
	defer b.Free(buf)
	t := func(dt kernels.DType, shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(dt, shape...), Buf: buf}
	}
	f := func(shape ...int) *kernels.Tensor { return t(kernels.Float32, shape...) }
	ts := func(t ...*kernels.Tensor) []*kernels.Tensor { return t }
	adam := kernels.Op{Name: kernels.OpAdamStep, LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, T: 1}
	sgd := kernels.Op{Name: kernels.OpSGDStep, LR: 0.1, Momentum: 0.9}
	noT := adam
	noT.T = 0
	cases := []execCase{
		{"adam_step two outputs", adam, ts(f(3), f(3), f(3), f(3)), ts(f(3), f(3))},
		{"adam_step output shape", adam, ts(f(3), f(3), f(3), f(3)), ts(f(3), f(2), f(3))},
		{"adam_step output dtype", adam, ts(f(3), f(3), f(3), f(3)), ts(f(3), f(3), t(kernels.Float64, 3))},
		{"adam_step short input", adam, ts(f(3), f(3), f(3), f(30)), ts(f(3), f(3), f(3))},
		{"adam_step no step", noT, ts(f(3), f(3), f(3), f(3)), ts(f(3), f(3), f(3))},
		{"sgd_step no buffer output", sgd, ts(f(3), f(3), f(3)), ts(f(3))},
		{"sgd_step integer", sgd, ts(t(kernels.Int32, 3), t(kernels.Int32, 3)), ts(t(kernels.Int32, 3), t(kernels.Int32, 3))},
	}
	expectExecErrors(s, cases)
}
