package cpu

import (
	"fmt"

	"github.com/jetfabric/jetfabric/kernels"
)

func init() {
	def(execFull, 0, kernels.OpFull)
	def(execArange, 0, kernels.OpArange)
	def(execRandom, 0, kernels.OpUniform, kernels.OpNormal)
}

func execFull(b *Backend, op *kernels.Op, _, out []*kernels.Tensor) error {
	y := out[0]
	d := data(y)
	if len(d) == 0 {
		return nil
	}
	one := [1]float64{op.Value}
	storeFloat(d, y.DType, one[:], 0, 1)
	// Double the filled prefix until it covers d.
	for k := y.DType.Size(); k < len(d); k *= 2 {
		copy(d[k:], d[:k])
	}
	return nil
}

func execArange(b *Backend, op *kernels.Op, _, out []*kernels.Tensor) error {
	y := out[0]
	if len(y.Shape) != 1 {
		return shapeErr(op, "output %v is not a vector", y.Shape)
	}
	generate(y, generator{kind: genArange, a: op.Start, b: op.Step})
	return nil
}

func execRandom(b *Backend, op *kernels.Op, _, out []*kernels.Tensor) error {
	y := out[0]
	if !y.DType.IsFloat() {
		return fmt.Errorf("%w: cpu: %s output is %v, want a float dtype", kernels.ErrDType, op.Name, y.DType)
	}
	g := generator{kind: genNormal, a: op.Mean, b: op.Std, seed: op.Seed, key: op.Key}
	if op.Name == kernels.OpUniform {
		g = generator{kind: genUniform, a: op.Low, b: op.High, seed: op.Seed, key: op.Key}
	}
	generate(y, g)
	return nil
}

const (
	genArange  = iota // a + i*b
	genUniform        // UniformAt(seed, key, i, a, b)
	genNormal         // NormalAt(seed, key, i, a, b)
)

// generator computes element values in float64.
type generator struct {
	kind      int
	a, b      float64
	seed, key uint64
}

func (g *generator) cost() int {
	return [...]int{genArange: 1, genUniform: 8, genNormal: 30}[g.kind]
}

// values computes elements [lo, lo+len(f)).
func (g *generator) values(f []float64, lo int) {
	switch g.kind {
	case genArange:
		for i := range f {
			f[i] = g.a + float64(lo+i)*g.b
		}
	case genUniform:
		for i := range f {
			f[i] = kernels.UniformAt(g.seed, g.key, uint64(lo+i), g.a, g.b)
		}
	case genNormal:
		for i := range f {
			f[i] = kernels.NormalAt(g.seed, g.key, uint64(lo+i), g.a, g.b)
		}
	}
}

// generate fills y with the generator's values rounded to y's dtype as
// cast rounds.
func generate(y *kernels.Tensor, g generator) {
	n := y.Numel()
	d, dt := data(y), y.DType
	if w := split(n, g.cost()); w > 1 {
		gg := g
		parallel(n, w, func(lo, hi int) { generateRange(d, dt, &gg, lo, hi) })
		return
	}
	generateRange(d, dt, &g, 0, n)
}

func generateRange(d []byte, dt kernels.DType, g *generator, lo, hi int) {
	var fb [castChunk]float64
	for c := lo; c < hi; c += castChunk {
		e := min(c+castChunk, hi)
		f := fb[:e-c]
		g.values(f, c)
		storeFloat(d, dt, f, c, e)
	}
}
