package nn

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
)

// Param is a layer's parameter: a leaf that requires a gradient, named as
// PyTorch names it in a state_dict ("weight", "0.bias", "2.1.weight"), so
// that Save writes a file that torch's load_state_dict reads. Optimizers
// and Load replace T with a new tensor and free the old one (tensors are
// immutable on the worker), so read T afresh after a step.
type Param struct {
	Name string
	T    *Tensor
}

// Layer is one stage of a model: a function of its input and its
// parameters. Forward enqueues the layer's ops and returns at once; a
// wrong input shape or dtype is an error that names the layer and both
// shapes (a *ShapeError).
type Layer interface {
	Forward(x *Tensor) (*Tensor, error)
	Params() []*Param
}

// Trainer is met by layers that behave differently while training (Dropout)
// and by the containers that hold them. Layers start in training mode, as
// PyTorch's modules do.
type Trainer interface {
	Train(on bool)
}

// ShapeError is a layer fed an input it cannot take. It wraps
// kernels.ErrShape (kernels.ErrDType for a wrong dtype).
type ShapeError struct {
	Layer string // the layer as its String method says, e.g. "Linear(784->512)"
	Got   string // the input's shape, or dtype and shape
	Want  string // what the layer takes, e.g. "[..., 784]"
	dtype bool
}

func (e *ShapeError) Error() string {
	return fmt.Sprintf("nn: %s fed %s: want %s", e.Layer, e.Got, e.Want)
}

// Unwrap returns kernels.ErrShape, or kernels.ErrDType for a dtype mismatch.
func (e *ShapeError) Unwrap() error {
	if e.dtype {
		return kernels.ErrDType
	}
	return kernels.ErrShape
}

func shapeErr(layer fmt.Stringer, x *Tensor, want string) error {
	return &ShapeError{Layer: layer.String(), Got: "shape " + fmtShape(x.Shape()), Want: want}
}

func dtypeErr(layer fmt.Stringer, x *Tensor, want string) error {
	return &ShapeError{Layer: layer.String(), Got: x.String(), Want: want, dtype: true}
}

// fmtShape prints a shape as Go prints a slice: [128 100].
func fmtShape(s []int) string { return fmt.Sprint(slices.Clone(s)) }

// dimsWant prints a wanted shape with named dims: [N, 3, H, W].
func dimsWant(dims ...string) string { return "[" + strings.Join(dims, ", ") + "]" }

// checkInput returns x's error, wrapped with the layer's name, if x failed.
func checkInput(layer fmt.Stringer, x *Tensor) error {
	if x == nil {
		return fmt.Errorf("%w: %s fed a nil tensor", ErrInvalidArgument, layer)
	}
	if err := x.Err(); err != nil {
		return err
	}
	if x.Freed() {
		return fmt.Errorf("%w: %s fed %v", ErrFreed, layer, x)
	}
	return nil
}

// result returns y and its error, wrapped with the layer's name.
func result(layer fmt.Stringer, y *Tensor) (*Tensor, error) {
	if err := y.Err(); err != nil {
		return y, fmt.Errorf("nn: %s: %w", layer, err)
	}
	return y, nil
}

// LayerOption adjusts a layer's construction.
type LayerOption func(*layerOptions) error

type layerOptions struct {
	dtype  kernels.DType
	noBias bool
}

// WithDType makes the layer's parameters of float dtype dt (f32 by
// default). They are drawn in f32 and cast.
func WithDType(dt kernels.DType) LayerOption {
	return func(o *layerOptions) error {
		if !dt.IsFloat() {
			return fmt.Errorf("%w: layer dtype %v, want a float dtype", ErrInvalidArgument, dt)
		}
		o.dtype = dt
		return nil
	}
}

// WithoutBias leaves out the layer's bias (PyTorch's bias=False).
func WithoutBias() LayerOption {
	return func(o *layerOptions) error {
		o.noBias = true
		return nil
	}
}

func buildLayerOptions(opts []LayerOption) (layerOptions, error) {
	o := layerOptions{dtype: kernels.Float32}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// newParam makes parameter name from the freshly made f32 tensor t, cast to
// dt, as a leaf that requires a gradient.
func newParam(name string, t *Tensor, dt kernels.DType) (*Param, error) {
	if t.DType() != dt {
		c := Cast(t, dt)
		t.Free()
		t = c
	}
	if err := t.Err(); err != nil {
		return nil, fmt.Errorf("nn: parameter %s: %w", name, err)
	}
	return &Param{Name: name, T: t.RequireGrad()}, nil
}

// uniformParam draws parameter name of shape from U(-bound, bound), as
// PyTorch's default initialisation of Linear and Conv2d does (kaiming
// uniform with a = sqrt(5) gives bound 1/sqrt(fan_in) for the weight, and
// the bias uses the same bound). The draw is keyed by the session seed and
// the tensor id, so Session.Seed before building a model fixes its weights.
func uniformParam(s *client.Session, name string, shape []int, fanIn int, dt kernels.DType) (*Param, error) {
	bound := 1 / math.Sqrt(float64(fanIn))
	return newParam(name, Uniform(s, shape, -bound, bound), dt)
}

func positive(layer string, vals ...int) error {
	for _, v := range vals {
		if v <= 0 {
			return fmt.Errorf("%w: %s with size %d", ErrInvalidArgument, layer, v)
		}
	}
	return nil
}

// Sequential runs its layers in order. Its parameters are its layers',
// named with the layer's index first ("0.weight", "2.bias"), as
// torch.nn.Sequential names them.
type Sequential struct {
	Layers []Layer
}

// NewSequential chains layers and prefixes their parameters' names with
// their index. A layer may hold no parameters (ReLU) and still takes an
// index, as in PyTorch.
func NewSequential(layers ...Layer) *Sequential {
	for i, l := range layers {
		for _, p := range l.Params() {
			p.Name = strconv.Itoa(i) + "." + p.Name
		}
	}
	return &Sequential{Layers: layers}
}

// Forward runs x through every layer.
func (q *Sequential) Forward(x *Tensor) (*Tensor, error) {
	for _, l := range q.Layers {
		var err error
		if x, err = l.Forward(x); err != nil {
			return x, err
		}
	}
	return x, nil
}

// Params returns every layer's parameters, in layer order.
func (q *Sequential) Params() []*Param {
	var ps []*Param
	for _, l := range q.Layers {
		ps = append(ps, l.Params()...)
	}
	return ps
}

// Train sets training mode on every layer that has one.
func (q *Sequential) Train(on bool) {
	for _, l := range q.Layers {
		if t, ok := l.(Trainer); ok {
			t.Train(on)
		}
	}
}

func (q *Sequential) String() string {
	parts := make([]string, len(q.Layers))
	for i, l := range q.Layers {
		parts[i] = fmt.Sprint(l)
	}
	return "Sequential(" + strings.Join(parts, ", ") + ")"
}

// ReLU is max(x, 0) elementwise.
type ReLU struct{}

func (ReLU) Forward(x *Tensor) (*Tensor, error) { return activation(ReLU{}, x, Relu) }
func (ReLU) Params() []*Param                   { return nil }
func (ReLU) String() string                     { return "ReLU()" }

// GELU is x·Φ(x) elementwise, with the error function as PyTorch's default,
// or its tanh approximation when Approximate is "tanh".
type GELU struct {
	Approximate string // "" or "none": exact; "tanh": the approximation
}

func (g GELU) Forward(x *Tensor) (*Tensor, error) {
	switch g.Approximate {
	case "", "none":
		return activation(g, x, Gelu)
	case "tanh":
		return activation(g, x, GeluTanh)
	}
	return nil, fmt.Errorf("%w: %v: approximate %q, want \"none\" or \"tanh\"", ErrInvalidArgument, g, g.Approximate)
}
func (GELU) Params() []*Param { return nil }
func (g GELU) String() string {
	if g.Approximate == "" || g.Approximate == "none" {
		return "GELU()"
	}
	return fmt.Sprintf("GELU(approximate=%q)", g.Approximate)
}

// SiLU is x·sigmoid(x) elementwise.
type SiLU struct{}

func (SiLU) Forward(x *Tensor) (*Tensor, error) { return activation(SiLU{}, x, Silu) }
func (SiLU) Params() []*Param                   { return nil }
func (SiLU) String() string                     { return "SiLU()" }

func activation(layer fmt.Stringer, x *Tensor, f func(*Tensor) *Tensor) (*Tensor, error) {
	if err := checkInput(layer, x); err != nil {
		return x, err
	}
	if !x.DType().IsFloat() {
		return x, dtypeErr(layer, x, "a float tensor")
	}
	return result(layer, f(x))
}

// FlattenLayer reshapes the axes StartDim..EndDim (negative values count
// from the end) of its input into one, as torch.nn.Flatten; NewFlatten gives
// PyTorch's defaults, 1 and -1.
type FlattenLayer struct {
	StartDim, EndDim int
}

// NewFlatten flattens every axis but the first (the batch).
func NewFlatten() *FlattenLayer { return &FlattenLayer{StartDim: 1, EndDim: -1} }

func (f *FlattenLayer) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(f, x); err != nil {
		return x, err
	}
	shape := x.Shape()
	r := len(shape)
	start, end := f.StartDim, f.EndDim
	if start < 0 {
		start += r
	}
	if end < 0 {
		end += r
	}
	if r == 0 {
		return result(f, Reshape(x, 1))
	}
	if start < 0 || end >= r || start > end {
		return x, shapeErr(f, x, fmt.Sprintf("at least %d axes", max(f.StartDim, f.EndDim, -f.StartDim, -f.EndDim-1)+1))
	}
	n := 1
	for _, d := range shape[start : end+1] {
		n *= d
	}
	out := append(append(slices.Clone(shape[:start]), n), shape[end+1:]...)
	return result(f, Reshape(x, out...))
}
func (f *FlattenLayer) Params() []*Param { return nil }
func (f *FlattenLayer) String() string {
	return fmt.Sprintf("Flatten(start_dim=%d, end_dim=%d)", f.StartDim, f.EndDim)
}

// DropoutLayer zeroes each element with probability P while training and
// scales the rest by 1/(1-P); in evaluation it passes its input through.
// The mask is drawn on the worker, keyed by the session seed and the mask's
// id, so a replay draws the same one.
type DropoutLayer struct {
	P    float64
	eval bool
}

// NewDropout is a dropout layer in training mode.
func NewDropout(p float64) *DropoutLayer { return &DropoutLayer{P: p} }

func (d *DropoutLayer) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(d, x); err != nil {
		return x, err
	}
	if !(d.P >= 0 && d.P < 1) {
		return x, fmt.Errorf("%w: %v: p outside [0, 1)", ErrInvalidArgument, d)
	}
	if d.eval || d.P == 0 {
		return x, nil
	}
	if !x.DType().IsFloat() {
		return x, dtypeErr(d, x, "a float tensor")
	}
	return result(d, Dropout(x, d.P))
}
func (d *DropoutLayer) Params() []*Param { return nil }

// Train switches between training (dropping) and evaluation (identity).
func (d *DropoutLayer) Train(on bool)  { d.eval = !on }
func (d *DropoutLayer) String() string { return fmt.Sprintf("Dropout(p=%v)", d.P) }
