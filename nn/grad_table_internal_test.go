package nn

import (
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestRuleTable classifies every op of the op set: it has a gradient
// rule, a zero gradient, no float result that could need one, or no rule
// on purpose (Backward refuses it, naming it). An op added to the set
// fails here until it is classified.
func TestRuleTable(t *testing.T) {
	noFloatGrad := map[string]bool{ // creation ops, and ops with bool or integer results
		kernels.OpFull: true, kernels.OpArange: true, kernels.OpUniform: true, kernels.OpNormal: true,
		kernels.OpZeros: true, kernels.OpOnes: true, kernels.OpLinspace: true, kernels.OpEye: true,
		kernels.OpBernoulli: true, kernels.OpEq: true, kernels.OpNe: true, kernels.OpLt: true,
		kernels.OpLe: true, kernels.OpGt: true, kernels.OpGe: true, kernels.OpIsNaN: true,
		kernels.OpNot: true, kernels.OpAnd: true, kernels.OpOr: true, kernels.OpXor: true,
		kernels.OpArgmax: true, kernels.OpArgmin: true, kernels.OpOneHot: true,
	}
	refused := map[string]string{
		kernels.OpConv2DInputGrad:  "no second derivatives",
		kernels.OpConv2DWeightGrad: "no second derivatives",
		kernels.OpMaxPool2DGrad:    "no second derivatives",
		kernels.OpAvgPool2DGrad:    "no second derivatives",
		kernels.OpCrossEntropyGrad: "no second derivatives",
		kernels.OpAdamStep:         "an optimizer update, applied to leaves",
		kernels.OpSGDStep:          "an optimizer update, applied to leaves",
	}
	for _, name := range kernels.OpNames() {
		n := 0
		for _, in := range []bool{rules[name] != nil, zeroGrad[name], noFloatGrad[name], refused[name] != ""} {
			if in {
				n++
			}
		}
		if n != 1 {
			t.Errorf("op %s is in %d of: the rules, the zero-gradient ops, the ops without a float gradient, the refused ops; want exactly 1", name, n)
		}
	}
	for name := range rules {
		if !kernels.Known(name) {
			t.Errorf("rule for %s, which is not in the op set", name)
		}
	}
}
