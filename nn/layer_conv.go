package nn

import (
	"fmt"
	"strconv"

	"github.com/jetfabric/jetfabric/client"
)

// Conv2dLayer is a 2-D convolution over NCHW inputs, as torch.nn.Conv2d:
// weight [Out, In/Groups, KH, KW] and bias [Out], both drawn from
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = In/Groups·KH·KW.
type Conv2dLayer struct {
	In, Out int
	Kernel  [2]int
	Opts    Conv2dOpts
	Weight  *Param
	Bias    *Param // nil when built WithoutBias
}

// NewConv2d builds a convolution from in to out channels with a kernel of
// kernel [KH, KW] and the stride, padding, dilation and groups of conv (zero
// values: the defaults).
func NewConv2d(s *client.Session, in, out int, kernel [2]int, conv Conv2dOpts, opts ...LayerOption) (*Conv2dLayer, error) {
	o, err := buildLayerOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := positive("Conv2d", in, out, kernel[0], kernel[1]); err != nil {
		return nil, err
	}
	g := max(conv.Groups, 1)
	if in%g != 0 || out%g != 0 {
		return nil, fmt.Errorf("%w: Conv2d(%d, %d) with %d groups: channels must divide", ErrInvalidArgument, in, out, g)
	}
	l := &Conv2dLayer{In: in, Out: out, Kernel: kernel, Opts: conv}
	fanIn := in / g * kernel[0] * kernel[1]
	if l.Weight, err = uniformParam(s, "weight", []int{out, in / g, kernel[0], kernel[1]}, fanIn, o.dtype); err != nil {
		return nil, err
	}
	if !o.noBias {
		if l.Bias, err = uniformParam(s, "bias", []int{out}, fanIn, o.dtype); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Forward convolves x [N, In, H, W] to [N, Out, OH, OW].
func (l *Conv2dLayer) Forward(x *Tensor) (*Tensor, error) {
	if err := checkInput(l, x); err != nil {
		return x, err
	}
	if sh := x.Shape(); len(sh) != 4 || sh[1] != l.In {
		return x, shapeErr(l, x, dimsWant("N", strconv.Itoa(l.In), "H", "W"))
	}
	if x.DType() != l.Weight.T.DType() {
		return x, dtypeErr(l, x, fmt.Sprintf("%v%s", l.Weight.T.DType(), dimsWant("N", strconv.Itoa(l.In), "H", "W")))
	}
	var b *Tensor
	if l.Bias != nil {
		b = l.Bias.T
	}
	return result(l, Conv2d(x, l.Weight.T, b, l.Opts))
}

// Params returns the weight and, unless built WithoutBias, the bias.
func (l *Conv2dLayer) Params() []*Param { return params(l.Weight, l.Bias) }

func (l *Conv2dLayer) String() string {
	s := fmt.Sprintf("Conv2d(%d, %d, kernel_size=%v", l.In, l.Out, l.Kernel)
	if o := l.Opts; o.Stride != [2]int{} && o.Stride != [2]int{1, 1} {
		s += fmt.Sprintf(", stride=%v", o.Stride)
	}
	if o := l.Opts; o.Padding != [2]int{} {
		s += fmt.Sprintf(", padding=%v", o.Padding)
	}
	if o := l.Opts; o.Dilation != [2]int{} && o.Dilation != [2]int{1, 1} {
		s += fmt.Sprintf(", dilation=%v", o.Dilation)
	}
	if l.Opts.Groups > 1 {
		s += fmt.Sprintf(", groups=%d", l.Opts.Groups)
	}
	return s + ")"
}

// MaxPool2dLayer takes the maximum over windows of NCHW inputs, as
// torch.nn.MaxPool2d (floor mode).
type MaxPool2dLayer struct{ Opts PoolOpts }

// NewMaxPool2d pools with the window, stride (zero: the window), padding
// and dilation of o.
func NewMaxPool2d(o PoolOpts) *MaxPool2dLayer { return &MaxPool2dLayer{Opts: o} }

// Forward pools x [N, C, H, W].
func (l *MaxPool2dLayer) Forward(x *Tensor) (*Tensor, error) {
	return pool(l, x, func() *Tensor { return MaxPool2d(x, l.Opts) })
}
func (l *MaxPool2dLayer) Params() []*Param { return nil }
func (l *MaxPool2dLayer) String() string   { return "MaxPool2d(" + poolString(l.Opts) + ")" }

// AvgPool2dLayer averages over windows of NCHW inputs, as torch.nn.AvgPool2d
// (floor mode, padding counted in the divisor).
type AvgPool2dLayer struct{ Opts PoolOpts }

// NewAvgPool2d pools with the window, stride (zero: the window) and padding
// of o.
func NewAvgPool2d(o PoolOpts) *AvgPool2dLayer { return &AvgPool2dLayer{Opts: o} }

// Forward pools x [N, C, H, W].
func (l *AvgPool2dLayer) Forward(x *Tensor) (*Tensor, error) {
	return pool(l, x, func() *Tensor { return AvgPool2d(x, l.Opts) })
}
func (l *AvgPool2dLayer) Params() []*Param { return nil }
func (l *AvgPool2dLayer) String() string   { return "AvgPool2d(" + poolString(l.Opts) + ")" }

// pool checks x for a pooling layer, then pools it with f.
func pool(l fmt.Stringer, x *Tensor, f func() *Tensor) (*Tensor, error) {
	if err := checkInput(l, x); err != nil {
		return x, err
	}
	if len(x.Shape()) != 4 {
		return x, shapeErr(l, x, dimsWant("N", "C", "H", "W"))
	}
	return result(l, f())
}

func poolString(o PoolOpts) string {
	s := fmt.Sprintf("kernel_size=%v", o.Kernel)
	if o.Stride != [2]int{} {
		s += fmt.Sprintf(", stride=%v", o.Stride)
	}
	if o.Padding != [2]int{} {
		s += fmt.Sprintf(", padding=%v", o.Padding)
	}
	if o.Dilation != [2]int{} && o.Dilation != [2]int{1, 1} {
		s += fmt.Sprintf(", dilation=%v", o.Dilation)
	}
	return s
}
