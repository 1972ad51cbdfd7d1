package kernels

import (
	"fmt"
	"math"
	"slices"
)

// Fused optimizer updates: one pass over a parameter and its state.
// Their attributes are LR, Beta1, Beta2, Eps, WeightDecay, Decoupled, T,
// Momentum, Dampening and Nesterov on Op, documented there and in
// docs/PROTOCOL.md. Each output has the parameter's dtype and shape; the
// results are a pure function of the inputs and the attributes.
const (
	// OpAdamStep is adam_step(param, grad, m, v) -> (param', m', v'):
	// torch.optim.Adam, or AdamW when Decoupled, at step T.
	OpAdamStep = "adam_step"
	// OpSGDStep is sgd_step(param, grad[, buf]) -> param', or
	// (param', buf') when Momentum is not 0: torch.optim.SGD.
	OpSGDStep = "sgd_step"
)

// Optimizers lists the fused optimizer updates: float dtypes, every input
// of the parameter's dtype and shape.
var Optimizers = []string{OpAdamStep, OpSGDStep}

func init() {
	register(OpAdamStep, 4, inferAdamStep)
	register(OpSGDStep, -1, inferSGDStep)
}

// AdamCoefs are the per-step scalars of adam_step, computed in float64
// from its attributes as PyTorch computes them in Python: a backend
// rounds them to its compute type.
type AdamCoefs struct {
	// Decay multiplies the parameter before the update (AdamW): 1 - LR·WeightDecay,
	// or 1 when not decoupled.
	Decay float64
	// L2 is the weight decay added to the gradient (Adam): WeightDecay, or 0
	// when decoupled.
	L2 float64
	// OneMinusBeta1 is the weight of the gradient in m's lerp; Beta2 and
	// OneMinusBeta2 weigh v and the squared gradient.
	OneMinusBeta1, Beta1, Beta2, OneMinusBeta2 float64
	// StepSize is LR/(1-Beta1^T); BC2Sqrt is sqrt(1-Beta2^T).
	StepSize, BC2Sqrt float64
	Eps               float64
}

// Adam returns the scalars of an adam_step op, whose attributes passed
// Infer.
func (op *Op) Adam() AdamCoefs {
	c := AdamCoefs{Decay: 1, OneMinusBeta1: 1 - op.Beta1, Beta1: op.Beta1, Beta2: op.Beta2, OneMinusBeta2: 1 - op.Beta2, Eps: op.Eps}
	if op.Decoupled {
		c.Decay = 1 - op.LR*op.WeightDecay
	} else {
		c.L2 = op.WeightDecay
	}
	t := float64(op.T)
	c.StepSize = op.LR / (1 - math.Pow(op.Beta1, t))
	c.BC2Sqrt = math.Sqrt(1 - math.Pow(op.Beta2, t))
	return c
}

// finiteAttr checks that an optimizer attribute is finite and at least lo.
func finiteAttr(name, attr string, v, lo float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < lo {
		return fmt.Errorf("%w: %s %s %v must be finite and >= %v", ErrAttr, name, attr, v, lo)
	}
	return nil
}

// sameParam checks that every input is a float tensor of the parameter's
// dtype and shape.
func sameParam(name string, in []Meta) error {
	if err := requireFloat(name, in...); err != nil {
		return err
	}
	if err := sameDType(name, in...); err != nil {
		return err
	}
	for i := 1; i < len(in); i++ {
		if !slices.Equal(in[i].Shape, in[0].Shape) {
			return fmt.Errorf("%w: %s input %d is %v, the parameter %v", ErrShape, name, i, in[i].Shape, in[0].Shape)
		}
	}
	return nil
}

func inferAdamStep(op *Op, in []Meta) ([]Meta, error) {
	if op.T < 1 {
		return nil, fmt.Errorf("%w: %s step t %d must be >= 1", ErrAttr, op.Name, op.T)
	}
	for _, a := range []struct {
		name string
		v    float64
	}{{"lr", op.LR}, {"eps", op.Eps}, {"weight_decay", op.WeightDecay}, {"beta1", op.Beta1}, {"beta2", op.Beta2}} {
		if err := finiteAttr(op.Name, a.name, a.v, 0); err != nil {
			return nil, err
		}
	}
	if op.Beta1 >= 1 || op.Beta2 >= 1 {
		return nil, fmt.Errorf("%w: %s betas (%v, %v) must lie in [0, 1)", ErrAttr, op.Name, op.Beta1, op.Beta2)
	}
	if op.Momentum != 0 || op.Dampening != 0 || op.Nesterov {
		return nil, fmt.Errorf("%w: %s takes no momentum, dampening or nesterov", ErrAttr, op.Name)
	}
	if err := sameParam(op.Name, in); err != nil {
		return nil, err
	}
	out := same(in[0])
	return append(out, out[0], out[0]), nil
}

func inferSGDStep(op *Op, in []Meta) ([]Meta, error) {
	if len(in) != 2 && len(in) != 3 {
		return nil, fmt.Errorf("%w: %s takes 2 or 3 (param, grad[, buf]), got %d", ErrArity, op.Name, len(in))
	}
	for _, a := range []struct {
		name  string
		v, lo float64
	}{{"lr", op.LR, 0}, {"momentum", op.Momentum, 0}, {"weight_decay", op.WeightDecay, 0}, {"dampening", op.Dampening, math.Inf(-1)}} {
		if err := finiteAttr(op.Name, a.name, a.v, a.lo); err != nil {
			return nil, err
		}
	}
	switch {
	case op.Nesterov && (op.Momentum == 0 || op.Dampening != 0):
		return nil, fmt.Errorf("%w: %s nesterov needs a momentum and no dampening", ErrAttr, op.Name)
	case len(in) == 3 && op.Momentum == 0:
		return nil, fmt.Errorf("%w: %s takes a momentum buffer only with a momentum", ErrArity, op.Name)
	case op.Beta1 != 0 || op.Beta2 != 0 || op.Eps != 0 || op.Decoupled || op.T != 0:
		return nil, fmt.Errorf("%w: %s takes no beta1, beta2, eps, decoupled or t", ErrAttr, op.Name)
	}
	if err := sameParam(op.Name, in); err != nil {
		return nil, err
	}
	out := same(in[0])
	if op.Momentum != 0 {
		out = append(out, out[0])
	}
	return out, nil
}
