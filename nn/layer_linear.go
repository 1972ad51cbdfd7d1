package nn

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// Linear is y = x·Wᵀ + b over the last axis, as torch.nn.Linear: weight
// [Out, In] and bias [Out], both drawn from U(-1/sqrt(In), 1/sqrt(In)).
type Linear struct {
	In, Out int
	Weight  *Param
	Bias    *Param // nil when built WithoutBias
}

// NewLinear builds a Linear layer on s, its parameters drawn on the worker
// (see uniformParam for the seeding). It fails with ErrInvalidArgument for
// a size below 1 or a bad option.
func NewLinear(s *client.Session, in, out int, opts ...LayerOption) (*Linear, error) {
	o, err := buildLayerOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := positive("Linear", in, out); err != nil {
		return nil, err
	}
	l := &Linear{In: in, Out: out}
	if l.Weight, err = uniformParam(s, "weight", []int{out, in}, in, o.dtype); err != nil {
		return nil, err
	}
	if !o.noBias {
		if l.Bias, err = uniformParam(s, "bias", []int{out}, in, o.dtype); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Forward maps x [..., In] to [..., Out].
func (l *Linear) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(l, x); err != nil {
		return x, err
	}
	sh := x.Shape()
	if len(sh) == 0 || sh[len(sh)-1] != l.In {
		return x, shapeErr(l, x, fmt.Sprintf("[..., %d]", l.In))
	}
	if x.DType() != l.Weight.T.DType() {
		return x, dtypeErr(l, x, fmt.Sprintf("%v[..., %d]", l.Weight.T.DType(), l.In))
	}
	y := Matmul(x, Transpose(l.Weight.T, 0, 1))
	if l.Bias != nil {
		y = Add(y, l.Bias.T)
	}
	return result(l, y)
}

// Params returns the weight and, unless built WithoutBias, the bias.
func (l *Linear) Params() []*Param { return params(l.Weight, l.Bias) }

func (l *Linear) String() string { return fmt.Sprintf("Linear(%d->%d)", l.In, l.Out) }

func params(ps ...*Param) []*Param {
	out := ps[:0:0]
	for _, p := range ps {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// Embedding maps integer indices to rows of a table, as torch.nn.Embedding:
// weight [Num, Dim] drawn from N(0, 1).
type Embedding struct {
	Num, Dim int
	Weight   *Param
}

// NewEmbedding builds a table of num vectors of dim elements on s.
func NewEmbedding(s *client.Session, num, dim int, opts ...LayerOption) (*Embedding, error) {
	o, err := buildLayerOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := positive("Embedding", num, dim); err != nil {
		return nil, err
	}
	w, err := newParam("weight", Normal(s, []int{num, dim}, 0, 1), o.dtype)
	if err != nil {
		return nil, err
	}
	return &Embedding{Num: num, Dim: dim, Weight: w}, nil
}

// Forward maps indices x (i32 or i64, any shape) to x's shape plus [Dim]. An
// index outside [0, Num) fails on the worker with kernels.ErrIndex.
func (e *Embedding) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(e, x); err != nil {
		return x, err
	}
	if dt := x.DType(); dt != kernels.Int32 && dt != kernels.Int64 {
		return x, dtypeErr(e, x, "i32 or i64 indices")
	}
	flat := x
	if len(x.Shape()) != 1 {
		flat = Reshape(x, x.Numel())
	}
	y := IndexSelect(e.Weight.T, 0, flat)
	if len(x.Shape()) != 1 {
		y = Reshape(y, append(slices.Clone(x.Shape()), e.Dim)...)
	}
	return result(e, y)
}

// Params returns the table.
func (e *Embedding) Params() []*Param { return []*Param{e.Weight} }

func (e *Embedding) String() string { return fmt.Sprintf("Embedding(%d, %d)", e.Num, e.Dim) }

// LayerNormLayer normalises over its trailing axes, of shape Shape, to zero
// mean and unit variance, then scales and shifts elementwise, as
// torch.nn.LayerNorm: weight and bias of Shape, initialised to 1 and 0.
type LayerNormLayer struct {
	Shape  []int
	Eps    float64
	Weight *Param
	Bias   *Param // nil when built WithoutBias
}

// NewLayerNorm builds a LayerNorm over trailing axes of shape (eps 0 means
// PyTorch's 1e-5).
func NewLayerNorm(s *client.Session, shape []int, eps float64, opts ...LayerOption) (*LayerNormLayer, error) {
	o, err := buildLayerOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(shape) == 0 {
		return nil, fmt.Errorf("%w: LayerNorm over no axes", ErrInvalidArgument)
	}
	if err := positive("LayerNorm", shape...); err != nil {
		return nil, err
	}
	if eps == 0 {
		eps = DefaultEps
	}
	l := &LayerNormLayer{Shape: slices.Clone(shape), Eps: eps}
	if l.Weight, err = newParam("weight", Ones(s, o.dtype, shape), o.dtype); err != nil {
		return nil, err
	}
	if !o.noBias {
		if l.Bias, err = newParam("bias", Zeros(s, o.dtype, shape), o.dtype); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Forward normalises x [..., Shape...].
func (l *LayerNormLayer) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(l, x); err != nil {
		return x, err
	}
	sh, k := x.Shape(), len(l.Shape)
	if len(sh) < k || !slices.Equal(sh[len(sh)-k:], l.Shape) {
		return x, shapeErr(l, x, "[..., "+strings.Trim(fmtShape(l.Shape), "[]")+"]")
	}
	axes := make([]int, k)
	for i := range axes {
		axes[i] = len(sh) - k + i
	}
	var b *Tensor
	if l.Bias != nil {
		b = l.Bias.T
	}
	return result(l, LayerNorm(x, l.Weight.T, b, axes, l.Eps))
}

// Params returns the weight and, unless built WithoutBias, the bias.
func (l *LayerNormLayer) Params() []*Param { return params(l.Weight, l.Bias) }

func (l *LayerNormLayer) String() string {
	dims := make([]string, len(l.Shape))
	for i, d := range l.Shape {
		dims[i] = strconv.Itoa(d)
	}
	return "LayerNorm(" + strings.Join(dims, ", ") + ")"
}
