package nn

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
)

// Tensor is a tensor of a session with its dtype and shape known here, and
// the op that made it, so that Backward can walk the graph back to its
// leaves. Ops return new tensors at once; nothing waits for the worker.
//
// A Tensor and the graph it belongs to are not safe for concurrent use:
// build a graph, and run Backward on it, from one goroutine.
type Tensor struct {
	ct   *client.Tensor
	s    *client.Session
	meta kernels.Meta
	err  error

	// node is the op that made t and index which of its outputs t is;
	// node is nil for a leaf (Wrap, Upload, RequireGrad, a gradient).
	node  *node
	index int

	reqGrad  bool // a leaf marked by RequireGrad, or made by ops from one
	cut      bool // required a gradient, but Backward or Release dropped its history
	retained bool
	freed    bool
	grad     *Tensor
}

// node is one recorded op: its description and its inputs and outputs.
type node struct {
	op  opDesc
	in  []*Tensor
	out []*Tensor
}

// opDesc describes an op once, as shape inference reads it; wire derives
// the wire's form from it.
type opDesc struct {
	k kernels.Op
}

// limits bounds what shape inference accepts here; the worker applies its
// own configured limits too.
var limits = kernels.DefaultLimits()

// kernelsOp is d as shape inference reads it.
func (d *opDesc) kernelsOp() *kernels.Op {
	k := d.k
	return &k
}

// wire is d as a codec op, without its ids.
func (d *opDesc) wire() codec.Op {
	k := &d.k
	w := codec.Op{
		Op: k.Name, Shape: k.Shape, Axes: k.Axes, Keepdims: k.Keepdims, Perm: k.Perm,
		Axis: k.Axis, Correction: k.Correction,
		Value: k.Value, Start: k.Start, Stop: k.Stop, Step: k.Step,
		Low: k.Low, High: k.High, Mean: k.Mean, Std: k.Std,
		Starts: k.Starts, Ends: k.Ends, Steps: k.Steps, Pads: k.Pads, Sizes: k.Sizes,
		K: k.K, Depth: k.Depth, Eps: k.Eps, P: k.P, Num: k.Num, N: k.N, M: k.M,
		Stride: k.Stride, Padding: k.Padding, Dilation: k.Dilation, Groups: k.Groups,
		Kernel: k.Kernel, Reduce: k.Reduce,
		LR: k.LR, Beta1: k.Beta1, Beta2: k.Beta2, WeightDecay: k.WeightDecay,
		Momentum: k.Momentum, Dampening: k.Dampening, Decoupled: k.Decoupled, Nesterov: k.Nesterov, T: k.T,
	}
	if k.DType != kernels.Invalid {
		w.DType = k.DType.String()
	}
	return w
}

// Wrap makes a leaf of a tensor of the client, whose dtype and shape the
// caller states. The leaf belongs to the caller: Backward never frees it.
func Wrap(t *client.Tensor, dt kernels.DType, shape []int) *Tensor {
	if t == nil {
		return failed(nil, fmt.Errorf("%w: Wrap of a nil tensor", ErrInvalidArgument))
	}
	x := &Tensor{ct: t, s: t.Session(), meta: kernels.Meta{DType: dt, Shape: slices.Clone(shape)}}
	if !dt.Valid() {
		x.err = fmt.Errorf("%w: Wrap with dtype %v", ErrInvalidArgument, dt)
	} else if err := kernels.CheckShape(shape, limits); err != nil {
		x.err = fmt.Errorf("nn: Wrap with shape %v: %w", shape, err)
	}
	return x
}

// Upload sends data (contiguous, row-major, little-endian elements of dt)
// as a leaf of shape. The leaf belongs to the caller: Backward never frees
// it.
func Upload(ctx context.Context, s *client.Session, dt kernels.DType, shape []int, data []byte) (*Tensor, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: Upload to a nil session", ErrInvalidArgument)
	}
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: Upload of dtype %v", ErrInvalidArgument, dt)
	}
	if err := kernels.CheckShape(shape, limits); err != nil {
		return nil, fmt.Errorf("nn: Upload of shape %v: %w", shape, err)
	}
	m := kernels.Meta{DType: dt, Shape: slices.Clone(shape)}
	if len(data) != m.Bytes() {
		return nil, fmt.Errorf("%w: Upload of %v %v needs %d bytes, got %d", ErrInvalidArgument, dt, shape, m.Bytes(), len(data))
	}
	ct, err := s.Upload(ctx, dt.String(), shape, data)
	if err != nil {
		return nil, fmt.Errorf("nn: Upload: %w", err)
	}
	return &Tensor{ct: ct, s: s, meta: m}, nil
}

// FromValues uploads values converted to dt (as a cast converts) as a
// leaf of shape.
func FromValues(ctx context.Context, s *client.Session, dt kernels.DType, shape []int, values []float64) (*Tensor, error) {
	if n := kernels.Numel(shape); n != len(values) {
		return nil, fmt.Errorf("%w: FromValues shape %v holds %d elements, got %d", ErrInvalidArgument, shape, n, len(values))
	}
	b, err := kernels.EncodeValues(dt, values)
	if err != nil {
		return nil, fmt.Errorf("nn: FromValues: %w", err)
	}
	return Upload(ctx, s, dt, shape, b)
}

func create(s *client.Session, k kernels.Op) *Tensor {
	if s == nil {
		return failed(nil, fmt.Errorf("%w: %s on a nil session", ErrInvalidArgument, k.Name))
	}
	return applyIn(s, &opDesc{k: k}, 1)[0]
}

// Full is a tensor of dt (Invalid means f32) and shape filled with v.
func Full(s *client.Session, dt kernels.DType, shape []int, v float64) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpFull, DType: dt, Shape: slices.Clone(shape), Value: v})
}

// Zeros is a tensor of dt and shape filled with 0.
func Zeros(s *client.Session, dt kernels.DType, shape []int) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpZeros, DType: dt, Shape: slices.Clone(shape)})
}

// Ones is a tensor of dt and shape filled with 1.
func Ones(s *client.Session, dt kernels.DType, shape []int) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpOnes, DType: dt, Shape: slices.Clone(shape)})
}

// Uniform is an f32 tensor drawn uniformly from [lo, hi), keyed by the
// session seed and the tensor's id (so a replay draws the same values).
func Uniform(s *client.Session, shape []int, lo, hi float64) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpUniform, Shape: slices.Clone(shape), Low: lo, High: hi})
}

// Normal is an f32 tensor drawn from N(mean, std²), keyed like Uniform.
func Normal(s *client.Session, shape []int, mean, std float64) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpNormal, Shape: slices.Clone(shape), Mean: mean, Std: std})
}

// Bernoulli is a tensor of dt holding 1 with probability p and 0
// otherwise, keyed like Uniform.
func Bernoulli(s *client.Session, dt kernels.DType, shape []int, p float64) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpBernoulli, DType: dt, Shape: slices.Clone(shape), P: p})
}

// Arange is the vector start, start+step, ... below stop, of dt.
func Arange(s *client.Session, dt kernels.DType, start, stop, step float64) *Tensor {
	return create(s, kernels.Op{Name: kernels.OpArange, DType: dt, Start: start, Stop: stop, Step: step})
}

// failed is a tensor that carries err instead of an op.
func failed(s *client.Session, err error) *Tensor { return &Tensor{s: s, err: err} }

// apply records and enqueues a one-output op on inputs.
func apply(d *opDesc, in ...*Tensor) *Tensor { return applyIn(nil, d, 1, in...)[0] }

// applyIn checks op d on inputs in (of session s, or of the inputs'
// session when s is nil) with shape inference, enqueues it, and returns
// its n outputs. A failed input, an input of another session or an op
// that shape inference refuses gives failed outputs carrying the error.
func applyIn(s *client.Session, d *opDesc, n int, in ...*Tensor) []*Tensor {
	fail := func(err error) []*Tensor {
		out := make([]*Tensor, n)
		for i := range out {
			out[i] = failed(s, err)
		}
		return out
	}
	name := d.k.Name
	metas := make([]kernels.Meta, len(in))
	for i, t := range in {
		switch {
		case t == nil:
			return fail(fmt.Errorf("%w: %s input %d is nil", ErrInvalidArgument, name, i))
		case t.err != nil:
			if s == nil {
				s = t.s
			}
			return fail(t.err)
		case t.freed:
			return fail(fmt.Errorf("%w: %s input %d (%v) was freed", ErrFreed, name, i, t.meta))
		case s == nil:
			s = t.s
		case t.s != s:
			return fail(fmt.Errorf("%w: %s input %d belongs to another session than input 0", ErrSession, name, i))
		}
		metas[i] = t.meta
	}
	if s == nil {
		return fail(fmt.Errorf("%w: %s without inputs or session", ErrInvalidArgument, name))
	}
	outs, err := kernels.Infer(d.kernelsOp(), metas, limits)
	if err != nil {
		return fail(fmt.Errorf("nn: %s of %s: %w", name, describe(metas), err))
	}
	if len(outs) != n {
		return fail(fmt.Errorf("nn: %s gives %d outputs, not %d", name, len(outs), n))
	}
	cin := make([]*client.Tensor, len(in))
	req := false
	for i, t := range in {
		cin[i] = t.ct
		req = req || t.reqGrad
	}
	req = req && !zeroGrad[name]
	var cts []*client.Tensor
	if n == 1 {
		cts = []*client.Tensor{s.Apply(d.wire(), cin...)}
	} else {
		cts = s.ApplyN(d.wire(), n, cin...)
	}
	nd := &node{op: *d, in: slices.Clone(in), out: make([]*Tensor, n)}
	for i := range nd.out {
		nd.out[i] = &Tensor{ct: cts[i], s: s, meta: outs[i], node: nd, index: i, reqGrad: req && outs[i].DType.IsFloat()}
	}
	return nd.out
}

// describe formats input metas for errors: "f32[2 3], i64[2]".
func describe(ms []kernels.Meta) string {
	if len(ms) == 0 {
		return "no inputs"
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%v%v", m.DType, m.Shape)
	}
	return strings.Join(parts, ", ")
}

// Shape is the tensor's shape (nil for a scalar). The caller may not
// modify it.
func (t *Tensor) Shape() []int { return t.meta.Shape }

// DType is the tensor's element type.
func (t *Tensor) DType() kernels.DType { return t.meta.DType }

// Meta is the tensor's dtype and shape.
func (t *Tensor) Meta() kernels.Meta { return t.meta }

// Numel is the tensor's number of elements.
func (t *Tensor) Numel() int { return t.meta.Numel() }

// Client is the tensor of the client that t wraps (nil if t failed).
func (t *Tensor) Client() *client.Tensor { return t.ct }

// Session is the tensor's session.
func (t *Tensor) Session() *client.Session { return t.s }

// Err is the first error in the tensor's history: an op that failed here
// (a shape mismatch, a freed input, inputs of two sessions) fails every
// tensor computed from it, with the same error. Errors the worker finds
// come back from reads and syncs instead.
func (t *Tensor) Err() error { return t.err }

// RequireGrad marks t as a leaf whose gradient Backward computes, and
// returns t. If an op made t, RequireGrad frees the intermediates t was
// computed from (as Detach does): t becomes a leaf that belongs to the
// caller, which Backward never frees. Only float tensors have gradients;
// on another dtype t fails with ErrInvalidArgument.
func (t *Tensor) RequireGrad() *Tensor {
	if t.err != nil {
		return t
	}
	if !t.meta.DType.IsFloat() {
		t.err = fmt.Errorf("%w: RequireGrad of a %v tensor: only float tensors have gradients", ErrInvalidArgument, t.meta.DType)
		return t
	}
	if t.node != nil {
		forget(t, false)
	}
	t.reqGrad, t.cut = true, false
	return t
}

// RequiresGrad reports whether Backward computes a gradient through t: t
// is a leaf marked by RequireGrad or was computed from one.
func (t *Tensor) RequiresGrad() bool { return t.reqGrad }

// IsLeaf reports whether t has no recorded op: it was uploaded, wrapped,
// marked by RequireGrad or detached, or is a gradient.
func (t *Tensor) IsLeaf() bool { return t.node == nil }

// Grad is the gradient Backward set on this leaf, or nil. The gradient is
// a leaf that belongs to the leaf: the next Backward that reaches the leaf
// frees it and sets a new one.
func (t *Tensor) Grad() *Tensor { return t.grad }

// SetGrad replaces the leaf's gradient (nil clears it) without freeing the
// old one.
func (t *Tensor) SetGrad(g *Tensor) { t.grad = g }

// Retain keeps t when Backward or Release frees the intermediates of its
// graph, and returns t. Retain the tensors read after Backward (the
// model's output) and those reused across steps (a constant built once by
// ops; or make it a leaf with Detach). After that Backward, t's history
// is gone: a later Backward that reaches t fails with ErrFreed rather than
// miss the gradient through it, unless t is detached (Detach) to be used
// as a constant.
func (t *Tensor) Retain() *Tensor {
	t.retained = true
	return t
}

// Detach makes t a leaf that requires no gradient and belongs to the
// caller, and returns t: it frees the intermediates t was computed from
// (except leaves and retained tensors; after the ops that use them) and
// forgets its history, in place. Optimizers detach each updated parameter
// and state tensor, so that neither tensors on the worker nor history
// here grow step by step. Later ops on the freed intermediates fail with
// ErrFreed.
func (t *Tensor) Detach() *Tensor {
	if t.node != nil {
		forget(t, false)
	}
	t.reqGrad, t.cut = false, false
	return t
}

func (t *Tensor) detach() {
	t.node = nil
	t.index = 0
}

// Free releases t on the worker (stream-ordered: after the ops queued
// before it) and marks it freed here; later ops on t fail with ErrFreed.
// Freeing twice, or freeing a failed tensor, does nothing.
func (t *Tensor) Free() {
	if t == nil || t.freed || t.ct == nil || t.ct.ID() == 0 {
		return
	}
	t.freed = true
	t.ct.Free()
}

// Freed reports whether t was freed.
func (t *Tensor) Freed() bool { return t.freed }

// String is the tensor's dtype and shape, e.g. "f32[2 3]".
func (t *Tensor) String() string { return fmt.Sprintf("%v%v", t.meta.DType, t.meta.Shape) }

// Float64s waits for t and returns its elements converted to float64.
func (t *Tensor) Float64s(ctx context.Context) ([]float64, error) {
	if t.err != nil {
		return nil, t.err
	}
	if t.freed {
		return nil, fmt.Errorf("%w: read of %v", ErrFreed, t)
	}
	d, err := t.ct.Read(ctx)
	if err != nil {
		return nil, err
	}
	dt, err := kernels.ParseDType(d.DType)
	if err != nil {
		return nil, fmt.Errorf("nn: read: %w", err)
	}
	return kernels.DecodeValues(dt, d.Bytes)
}

// Float32s waits for t and returns its elements converted to float32.
func (t *Tensor) Float32s(ctx context.Context) ([]float32, error) {
	v, err := t.Float64s(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out, nil
}

// Item waits for a one-element tensor (a loss) and returns its value.
func (t *Tensor) Item(ctx context.Context) (float64, error) {
	if t.err == nil && t.meta.Numel() != 1 {
		return 0, fmt.Errorf("%w: Item of %v", ErrNotScalar, t)
	}
	v, err := t.Float64s(ctx)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}
