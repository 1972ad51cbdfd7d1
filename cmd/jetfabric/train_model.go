package main

import (
	"fmt"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/nn"
)

// newModel builds the model named kind on s, its weights drawn from the
// session's seed as PyTorch initialises its layers:
//
//	mlp: flatten, linear 784->hidden, relu, linear hidden->hidden, relu, linear hidden->10
//	cnn: PyTorch's examples/mnist: conv 1->32 3x3, relu, conv 32->64 3x3,
//	     relu, max pool 2, dropout 0.25, flatten, linear 9216->128, relu,
//	     dropout 0.5, linear 128->10, log_softmax
func newModel(s *client.Session, kind string, hidden int) (*nn.Sequential, error) {
	var layers []nn.Layer
	add := func(l nn.Layer, err error) error {
		if err != nil {
			return err
		}
		layers = append(layers, l)
		return nil
	}
	linear := func(in, out int) error {
		l, err := nn.NewLinear(s, in, out)
		return add(l, err)
	}
	conv := func(in, out int) error {
		l, err := nn.NewConv2d(s, in, out, [2]int{3, 3}, nn.Conv2dOpts{})
		return add(l, err)
	}
	var err error
	switch kind {
	case "mlp":
		layers = append(layers, nn.NewFlatten())
		err = firstErr(linear(784, hidden), add(nn.ReLU{}, nil), linear(hidden, hidden), add(nn.ReLU{}, nil), linear(hidden, 10))
	case "cnn":
		err = firstErr(
			conv(1, 32), add(nn.ReLU{}, nil), conv(32, 64), add(nn.ReLU{}, nil),
			add(nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}}), nil), add(nn.NewDropout(0.25), nil),
			add(nn.NewFlatten(), nil), linear(9216, 128), add(nn.ReLU{}, nil), add(nn.NewDropout(0.5), nil),
			linear(128, 10), add(logSoftmax{}, nil))
	default:
		err = fmt.Errorf("%w: model %q", errFlag, kind)
	}
	if err != nil {
		return nil, err
	}
	return nn.NewSequential(layers...), nil
}

// firstErr is the first non-nil error; the calls run in order, so a failed
// one leaves the later layers unbuilt only in the error case.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// logSoftmax is log_softmax over the classes, the last layer of PyTorch's
// MNIST example (cross_entropy applies it again, which changes nothing).
type logSoftmax struct{}

func (logSoftmax) Forward(x *nn.Tensor) (*nn.Tensor, error) {
	y := nn.LogSoftmax(x, 1)
	return y, y.Err()
}
func (logSoftmax) Params() []*nn.Param { return nil }
func (logSoftmax) String() string      { return "LogSoftmax(dim=1)" }
