package datasets

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
)

// ErrInvalid: arguments that do not describe a data set or a batch of it.
var ErrInvalid = errors.New("datasets: invalid argument")

// Norm is the normalisation applied to every element once uploaded:
// x -> (x/Scale - Mean)/Std, in float32, in that order (PyTorch's ToTensor
// then Normalize).
type Norm struct{ Scale, Mean, Std float64 }

// MNISTNorm is the normalisation of PyTorch's MNIST example.
var MNISTNorm = Norm{Scale: 255, Mean: 0.1307, Std: 0.3081}

// Set is a data set on one session's device: X, the normalised examples
// (f32, [N, Shape...]), and Y, the labels (i64, [N]).
type Set struct {
	s     *client.Session
	X, Y  *client.Tensor
	N     int
	Shape []int // one example's shape
}

// Upload sends images (unsigned bytes, shape [N, ...]) and their labels,
// then casts and normalises the images on the worker. It fails with
// ErrInvalid when the sizes disagree, and with the upload's error.
func Upload(ctx context.Context, s *client.Session, images []byte, shape []int, labels []int64, norm Norm) (*Set, error) {
	if len(shape) < 1 || shape[0] < 1 {
		return nil, fmt.Errorf("%w: shape %v: want [N, ...] with N >= 1", ErrInvalid, shape)
	}
	n := 1
	for _, d := range shape {
		if d < 1 {
			return nil, fmt.Errorf("%w: shape %v", ErrInvalid, shape)
		}
		n *= d
	}
	if n != len(images) {
		return nil, fmt.Errorf("%w: shape %v holds %d bytes, got %d", ErrInvalid, shape, n, len(images))
	}
	if len(labels) != shape[0] {
		return nil, fmt.Errorf("%w: %d labels for %d examples", ErrInvalid, len(labels), shape[0])
	}
	if norm.Scale == 0 || norm.Std == 0 {
		return nil, fmt.Errorf("%w: normalisation %+v divides by zero", ErrInvalid, norm)
	}
	raw, err := s.Upload(ctx, "u8", shape, images)
	if err != nil {
		return nil, err
	}
	y, err := s.Upload(ctx, "i64", []int{len(labels)}, Int64Bytes(labels))
	if err != nil {
		raw.Free()
		return nil, err
	}
	f := raw.Cast("f32")
	raw.Free()
	x := normalise(s, f, norm)
	return &Set{s: s, X: x, Y: y, N: shape[0], Shape: slices.Clone(shape[1:])}, nil
}

// normalise computes (x/scale - mean)/std, freeing the intermediates.
func normalise(s *client.Session, x *client.Tensor, n Norm) *client.Tensor {
	scale, mean, std := s.Full(nil, n.Scale), s.Full(nil, n.Mean), s.Full(nil, n.Std)
	a := x.Div(scale)
	x.Free()
	b := a.Sub(mean)
	a.Free()
	c := b.Div(std)
	b.Free()
	scale.Free()
	mean.Free()
	std.Free()
	return c
}

// Free releases the set's tensors on the worker.
func (d *Set) Free() {
	d.X.Free()
	d.Y.Free()
}

// Int64Bytes is v as little-endian bytes, the wire form of an i64 tensor.
func Int64Bytes(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// Permutation is a permutation of 0..n-1 drawn from (seed, epoch) alone:
// the same arguments give the same order on every run and every machine.
func Permutation(seed uint64, epoch, n int) []int64 {
	r := rand.New(rand.NewPCG(seed, uint64(epoch)))
	p := make([]int64, n)
	for i := range p {
		p[i] = int64(i)
	}
	r.Shuffle(n, func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// Epoch is one pass over a set in the order of a permutation held on the
// worker.
type Epoch struct {
	set  *Set
	perm *client.Tensor
	n    int
}

// Epoch uploads order (a permutation of the set's examples, or any list
// of their indices) for the batches of one pass. It fails with ErrInvalid
// when an index is out of range.
func (d *Set) Epoch(ctx context.Context, order []int64) (*Epoch, error) {
	if len(order) == 0 {
		return nil, fmt.Errorf("%w: empty order", ErrInvalid)
	}
	for i, v := range order {
		if v < 0 || v >= int64(d.N) {
			return nil, fmt.Errorf("%w: order[%d] = %d, the set holds %d examples", ErrInvalid, i, v, d.N)
		}
	}
	p, err := d.s.Upload(ctx, "i64", []int{len(order)}, Int64Bytes(order))
	if err != nil {
		return nil, err
	}
	return &Epoch{set: d, perm: p, n: len(order)}, nil
}

// Len is the number of examples in the epoch's order.
func (e *Epoch) Len() int { return e.n }

// Batch cuts examples order[start:end] of the epoch on the worker: x is
// f32 [end-start, Shape...] and y i64 [end-start]. Free both after use.
// It fails with ErrInvalid unless 0 <= start < end <= Len.
func (e *Epoch) Batch(start, end int) (x, y *client.Tensor, err error) {
	if start < 0 || start >= end || end > e.n {
		return nil, nil, fmt.Errorf("%w: batch [%d:%d] of an epoch of %d", ErrInvalid, start, end, e.n)
	}
	s := e.set.s
	idx := s.Apply(codec.Op{Op: "slice", Starts: []int{start}, Ends: []int{end}}, e.perm)
	x = s.Apply(codec.Op{Op: "index_select", Axis: 0}, e.set.X, idx)
	y = s.Apply(codec.Op{Op: "index_select", Axis: 0}, e.set.Y, idx)
	idx.Free()
	return x, y, nil
}

// Free releases the epoch's permutation on the worker.
func (e *Epoch) Free() { e.perm.Free() }
