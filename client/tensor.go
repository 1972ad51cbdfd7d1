package client

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/objectstore"
)

// Tensor is a handle on a tensor of a session. Methods that build ops
// return new tensors at once; nothing waits for the worker until a read.
type Tensor struct {
	s  *Session
	id uint64
}

// ID is the tensor's id in its session.
func (t *Tensor) ID() uint64 { return t.id }

// Session is the tensor's session.
func (t *Tensor) Session() *Session { return t.s }

// FromFloat32 uploads data with shape inline (for large data use Upload).
func (s *Session) FromFloat32(shape []int, data []float32) *Tensor {
	if n := numel(shape); n != len(data) {
		s.fail(fmt.Errorf("%w: FromFloat32 shape %v holds %d elements, got %d", ErrInvalidArgument, shape, n, len(data)))
		return &Tensor{s: s}
	}
	b := make([]byte, 4*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return s.enqueue(codec.Op{Op: "upload", DType: "f32", Shape: slices.Clone(shape), Data: b}, 1)
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// Full is a float32 tensor of shape filled with v.
func (s *Session) Full(shape []int, v float64) *Tensor {
	return s.enqueue(codec.Op{Op: "full", Shape: slices.Clone(shape), Value: v}, 1)
}

// Arange is the float32 vector start, start+step, ... below stop.
func (s *Session) Arange(start, stop, step float64) *Tensor {
	return s.enqueue(codec.Op{Op: "arange", Start: start, Stop: stop, Step: step}, 1)
}

// Uniform is a float32 tensor drawn uniformly from [low, high), keyed by
// the session seed and the tensor's id.
func (s *Session) Uniform(shape []int, low, high float64) *Tensor {
	return s.enqueue(codec.Op{Op: "uniform", Shape: slices.Clone(shape), Low: low, High: high}, 1)
}

// Normal is a float32 tensor drawn from N(mean, std^2).
func (s *Session) Normal(shape []int, mean, std float64) *Tensor {
	return s.enqueue(codec.Op{Op: "normal", Shape: slices.Clone(shape), Mean: mean, Std: std}, 1)
}

func (t *Tensor) unary(op string) *Tensor { return t.s.enqueue(codec.Op{Op: op}, 1, t) }
func (t *Tensor) binary(op string, u *Tensor) *Tensor {
	return t.s.enqueue(codec.Op{Op: op}, 1, t, u)
}

// Add, Sub, Mul and Div are elementwise with numpy broadcasting.
func (t *Tensor) Add(u *Tensor) *Tensor { return t.binary("add", u) }
func (t *Tensor) Sub(u *Tensor) *Tensor { return t.binary("sub", u) }
func (t *Tensor) Mul(u *Tensor) *Tensor { return t.binary("mul", u) }
func (t *Tensor) Div(u *Tensor) *Tensor { return t.binary("div", u) }

// Neg, Exp, Log, Sqrt, Relu and Tanh are elementwise.
func (t *Tensor) Neg() *Tensor  { return t.unary("neg") }
func (t *Tensor) Exp() *Tensor  { return t.unary("exp") }
func (t *Tensor) Log() *Tensor  { return t.unary("log") }
func (t *Tensor) Sqrt() *Tensor { return t.unary("sqrt") }
func (t *Tensor) Relu() *Tensor { return t.unary("relu") }
func (t *Tensor) Tanh() *Tensor { return t.unary("tanh") }

// Sum, Mean and Max reduce over axes (none: all), dropping them.
func (t *Tensor) Sum(axes ...int) *Tensor  { return t.Reduce("sum", false, axes...) }
func (t *Tensor) Mean(axes ...int) *Tensor { return t.Reduce("mean", false, axes...) }
func (t *Tensor) Max(axes ...int) *Tensor  { return t.Reduce("max", false, axes...) }

// Reduce applies reduction op over axes (none: all), keeping them as size 1
// if keepdims.
func (t *Tensor) Reduce(op string, keepdims bool, axes ...int) *Tensor {
	return t.s.enqueue(codec.Op{Op: op, Axes: slices.Clone(axes), Keepdims: keepdims}, 1, t)
}

// Matmul is the matrix product, batched over leading dims with broadcasting.
func (t *Tensor) Matmul(u *Tensor) *Tensor { return t.binary("matmul", u) }

// Reshape gives t a new shape with the same elements; one dim may be -1.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	return t.s.enqueue(codec.Op{Op: "reshape", Shape: slices.Clone(shape)}, 1, t)
}

// Permute reorders the axes.
func (t *Tensor) Permute(perm ...int) *Tensor {
	return t.s.enqueue(codec.Op{Op: "permute", Perm: slices.Clone(perm)}, 1, t)
}

// Cast converts to dtype (f32, f64, f16, bf16, i32, i64, u8, bool).
func (t *Tensor) Cast(dtype string) *Tensor {
	return t.s.enqueue(codec.Op{Op: "cast", DType: dtype}, 1, t)
}

// Free releases the tensor on the worker. Later uses report an unknown id.
func (t *Tensor) Free() {
	t.s.enqueue(codec.Op{Op: "free", In: nil}, 0, t)
}

// Data is a tensor read back from the worker.
type Data struct {
	DType string
	Shape []int
	Bytes []byte // contiguous, row-major, little-endian
}

// Read waits for the tensor and returns its bytes.
func (t *Tensor) Read(ctx context.Context) (*Data, error) {
	if t.id == 0 {
		// The op that should have made t was refused here; report why.
		return nil, t.s.collect(nil)
	}
	for attempt := 1; ; attempt++ {
		op := codec.Op{Op: "read", In: []uint64{t.id}}
		if n := t.s.c.opts.lanes; n > 1 {
			op.Pieces = n // a large result may come in pieces, one a lane
		}
		r, err := t.s.call(ctx, op)
		if err != nil {
			return nil, err
		}
		if r.Tensor == nil {
			return nil, fmt.Errorf("client: read of tensor %d returned no data", t.id)
		}
		d := &Data{DType: r.Tensor.DType, Shape: r.Tensor.Shape, Bytes: r.Tensor.Data}
		if r.Tensor.Object == "" {
			return d, nil
		}
		d.Bytes, err = t.s.fetch(ctx, r.Tensor)
		switch {
		case err == nil:
			return d, nil
		case errors.Is(err, objectstore.ErrStalled) && attempt < readAttempts && ctx.Err() == nil:
			// The worker stopped while writing the result (it died): ask
			// again, and the worker that takes the device over answers.
		default:
			return nil, err
		}
	}
}

// readAttempts bounds how often Read asks for a large result whose writer
// stopped while writing it.
const readAttempts = 3

// fetch reads a result that travels through the object store, then
// deletes it. When the reply names the chunk subject (the worker answered
// before writing), the chunks are copied as they are stored.
func (s *Session) fetch(ctx context.Context, td *codec.Tensor) ([]byte, error) {
	lanes, err := s.c.lanesOf(cmp.Or(td.Bucket, s.c.names.XferBucket()))
	if err != nil {
		return nil, fmt.Errorf("client: read result object %s: %w", td.Object, err)
	}
	if td.Pieces != 0 {
		return s.fetchPieces(ctx, lanes, td)
	}
	store := lanes[0]
	var b []byte
	var info objectstore.Info
	if td.NUID != "" {
		n, err := tensorBytes(td.DType, td.Shape)
		if err != nil {
			return nil, fmt.Errorf("client: read result object %s: %w", td.Object, err)
		}
		b = make([]byte, n)
		info, err = store.Follow(ctx, td.Object, td.NUID, b)
		if err != nil {
			return nil, fmt.Errorf("client: read result object %s: %w", td.Object, err)
		}
	} else if b, info, err = store.Get(ctx, td.Object); err != nil {
		return nil, fmt.Errorf("client: read result object %s: %w", td.Object, err)
	}
	if td.SHA256 != "" && info.SHA256 != td.SHA256 {
		return nil, fmt.Errorf("client: result object %s digest %s, the worker wrote %s", td.Object, info.SHA256, td.SHA256)
	}
	if td.NUID != "" {
		// Followed: its meta may not be stored yet, so do not look it up.
		_ = store.Discard(ctx, td.Object, td.NUID)
	} else {
		_ = store.Delete(ctx, td.Object)
	}
	return b, nil
}

// fetchPieces reads a result that comes as pieces (see codec.Op.Pieces),
// each on a lane, then deletes them.
func (s *Session) fetchPieces(ctx context.Context, lanes objectstore.Lanes, td *codec.Tensor) ([]byte, error) {
	n, err := tensorBytes(td.DType, td.Shape)
	if err != nil {
		return nil, fmt.Errorf("client: read result object %s: %w", td.Object, err)
	}
	b := make([]byte, n)
	if err := lanes.Follow(ctx, td.Object, td.NUID, td.Pieces, b); err != nil {
		return nil, fmt.Errorf("client: read result object %s in %d pieces: %w", td.Object, td.Pieces, err)
	}
	_ = lanes.Discard(ctx, td.Object, td.NUID, td.Pieces)
	return b, nil
}

// dtypeBytes is the size of an element of each dtype on the wire.
var dtypeBytes = map[string]int{"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1, "bool": 1}

// tensorBytes is the size in bytes of a tensor of dtype and shape.
func tensorBytes(dtype string, shape []int) (int, error) {
	n, ok := dtypeBytes[dtype]
	if !ok {
		return 0, fmt.Errorf("%w: dtype %q", ErrDType, dtype)
	}
	for _, d := range shape {
		if d < 0 || d > 0 && n > math.MaxInt/d {
			return 0, fmt.Errorf("%w: result shape %v", ErrInvalidArgument, shape)
		}
		n *= d
	}
	return n, nil
}

// Float32s reads a float32 tensor.
func (t *Tensor) Float32s(ctx context.Context) ([]float32, error) {
	d, err := t.Read(ctx)
	if err != nil {
		return nil, err
	}
	if d.DType != "f32" {
		return nil, fmt.Errorf("%w: tensor %d is %s, not f32 (Cast it, or use Read)", ErrDType, t.id, d.DType)
	}
	out := make([]float32, len(d.Bytes)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.Bytes[4*i:]))
	}
	return out, nil
}
