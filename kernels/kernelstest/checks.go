package kernelstest

import (
	"errors"

	"github.com/jetfabric/jetfabric/kernels"
)

// inferErrors are ops that Infer must reject, with the sentinel it must
// wrap.
var inferErrors = []struct {
	op   kernels.Op
	in   []kernels.Meta
	want error
}{
	{kernels.Op{Name: "no_such_op"}, nil, kernels.ErrUnknownOp},
	{kernels.Op{Name: ""}, nil, kernels.ErrUnknownOp},
	{kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{meta(kernels.Float32, 2)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpNeg}, nil, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{2}}, []kernels.Meta{meta(kernels.Float32, 2)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpMatmul}, []kernels.Meta{meta(kernels.Float32, 2, 2), meta(kernels.Float32, 2, 2), meta(kernels.Float32, 2, 2)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{meta(kernels.Float32, 2, 3), meta(kernels.Float32, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMul}, []kernels.Meta{meta(kernels.Float32, 2, 3), meta(kernels.Float32, 3, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMatmul}, []kernels.Meta{meta(kernels.Float32, 2, 3), meta(kernels.Float32, 4, 5)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMatmul}, []kernels.Meta{meta(kernels.Float32), meta(kernels.Float32, 4, 5)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMatmul}, []kernels.Meta{meta(kernels.Float32, 2, 2, 3), meta(kernels.Float32, 3, 3, 4)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpReshape, Shape: []int{4}}, []kernels.Meta{meta(kernels.Float32, 6)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpReshape, Shape: []int{-1, -1}}, []kernels.Meta{meta(kernels.Float32, 6)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{2, -3}}, nil, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMax, Axes: []int{1}}, []kernels.Meta{meta(kernels.Float32, 3, 0)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpExp}, []kernels.Meta{meta(kernels.Int32, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{meta(kernels.Float32, 3), meta(kernels.Float64, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAdd}, []kernels.Meta{meta(kernels.Bool, 3), meta(kernels.Bool, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpSum}, []kernels.Meta{meta(kernels.Bool, 3)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpMatmul}, []kernels.Meta{meta(kernels.Float32, 2, 2), meta(kernels.Int32, 2, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpUniform, Shape: []int{2}, DType: kernels.Int32}, nil, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{2}, DType: 99}, nil, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpSum, Axes: []int{2}}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSum, Axes: []int{-3}}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpMean, Axes: []int{0, -2}}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpPermute, Perm: []int{0, 0}}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpPermute, Perm: []int{1}}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpCast}, []kernels.Meta{meta(kernels.Float32, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpUniform, Shape: []int{2}, Low: 1, High: 0}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpNormal, Shape: []int{2}, Std: -1}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpArange, Start: 0, Stop: 1, Step: 0}, nil, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{1 << 20, 1 << 20}}, nil, kernels.ErrTooLarge},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}}, nil, kernels.ErrTooLarge},
	{kernels.Op{Name: kernels.OpFull, Shape: []int{1 << 40, 1 << 40, 1 << 40}}, nil, kernels.ErrTooLarge},
	{kernels.Op{Name: kernels.OpArange, Start: 0, Stop: 1e15, Step: 1}, nil, kernels.ErrTooLarge},
}

func testInferErrors(s *suite) {
	for _, c := range inferErrors {
		_, err := kernels.Infer(&c.op, c.in, kernels.DefaultLimits())
		if !errors.Is(err, c.want) {
			s.t.Errorf("Infer(%s, %v) = %v, want an error wrapping %v", opString(&c.op), c.in, err, c.want)
		}
	}
	for _, c := range extraInferErrors {
		_, err := kernels.Infer(&c.op, c.in, kernels.DefaultLimits())
		if !errors.Is(err, c.want) {
			s.t.Errorf("Infer(%s, %v) = %v, want an error wrapping %v", opString(&c.op), c.in, err, c.want)
		}
	}
}

// extraInferErrors are checks of the ops beyond arithmetic.
var extraInferErrors = []struct {
	op   kernels.Op
	in   []kernels.Meta
	want error
}{
	{kernels.Op{Name: kernels.OpSoftmax, Axis: 2}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpLogSoftmax, Axis: -3}, []kernels.Meta{meta(kernels.Float32, 2, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSoftmax}, []kernels.Meta{meta(kernels.Float32)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpSoftmax}, []kernels.Meta{meta(kernels.Int32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpVar, Correction: -1}, []kernels.Meta{meta(kernels.Float32, 2)}, kernels.ErrAttr},
	{kernels.Op{Name: kernels.OpVar}, []kernels.Meta{meta(kernels.Int32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpLogsumexp}, []kernels.Meta{meta(kernels.Uint8, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpArgmax, Axes: []int{0}}, []kernels.Meta{meta(kernels.Float32, 0, 2)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpMin}, []kernels.Meta{meta(kernels.Float32, 0)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpProd}, []kernels.Meta{meta(kernels.Bool, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpWhere}, []kernels.Meta{meta(kernels.Float32, 2), meta(kernels.Float32, 2), meta(kernels.Float32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpWhere}, []kernels.Meta{meta(kernels.Bool, 2), meta(kernels.Float32, 2), meta(kernels.Int32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpWhere}, []kernels.Meta{meta(kernels.Bool, 3), meta(kernels.Float32, 2), meta(kernels.Float32, 2)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpWhere}, []kernels.Meta{meta(kernels.Bool, 2), meta(kernels.Float32, 2)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpClamp}, []kernels.Meta{meta(kernels.Float32, 2), meta(kernels.Float32)}, kernels.ErrArity},
	{kernels.Op{Name: kernels.OpClamp}, []kernels.Meta{meta(kernels.Bool, 2), meta(kernels.Bool), meta(kernels.Bool)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpClamp}, []kernels.Meta{meta(kernels.Float32, 4), meta(kernels.Float32, 3), meta(kernels.Float32)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpPow}, []kernels.Meta{meta(kernels.Int32, 2), meta(kernels.Int32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAnd}, []kernels.Meta{meta(kernels.Float32, 2), meta(kernels.Float32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpXor}, []kernels.Meta{meta(kernels.Bool, 2), meta(kernels.Int32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpMod}, []kernels.Meta{meta(kernels.Bool, 2), meta(kernels.Bool, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpLt}, []kernels.Meta{meta(kernels.Float32, 2), meta(kernels.Float64, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpEq}, []kernels.Meta{meta(kernels.Float32, 2), meta(kernels.Float32, 3)}, kernels.ErrShape},
	{kernels.Op{Name: kernels.OpNot}, []kernels.Meta{meta(kernels.Float32, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpIsNaN}, []kernels.Meta{meta(kernels.Bool, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpSin}, []kernels.Meta{meta(kernels.Int64, 2)}, kernels.ErrDType},
	{kernels.Op{Name: kernels.OpAbs}, []kernels.Meta{meta(kernels.Bool, 2)}, kernels.ErrDType},
}

// testExecErrors hands Exec bad input it could see if a caller skipped
// Infer or mixed up buffers: Exec must return an error, never panic or
// write out of bounds.
func testExecErrors(s *suite) {
	b := s.b
	alloc := func(n int) kernels.Buffer {
		buf, err := b.Alloc(n)
		if err != nil {
			s.t.Fatalf("Alloc(%d): %v", n, err)
		}
		return buf
	}
	f32 := func(buf kernels.Buffer, shape ...int) *kernels.Tensor {
		return &kernels.Tensor{Meta: meta(kernels.Float32, shape...), Buf: buf}
	}
	big, small := alloc(4*12), alloc(4)
	defer b.Free(big)
	defer b.Free(small)
	cases := []struct {
		name    string
		op      kernels.Op
		in, out []*kernels.Tensor
		want    error // nil: any error
	}{
		{"unknown op", kernels.Op{Name: "no_such_op"}, nil, []*kernels.Tensor{f32(big, 2)}, kernels.ErrUnknownOp},
		{"too few inputs", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{f32(big, 3)}, []*kernels.Tensor{f32(big, 3)}, kernels.ErrArity},
		{"too many outputs", kernels.Op{Name: kernels.OpNeg}, []*kernels.Tensor{f32(big, 3)}, []*kernels.Tensor{f32(big, 3), f32(big, 3)}, kernels.ErrArity},
		{"nil input", kernels.Op{Name: kernels.OpNeg}, []*kernels.Tensor{nil}, []*kernels.Tensor{f32(big, 3)}, nil},
		{"short output", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{f32(big, 3, 4), f32(big, 3, 4)}, []*kernels.Tensor{f32(small, 3, 4)}, nil},
		{"short input", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{f32(small, 3, 4), f32(big, 3, 4)}, []*kernels.Tensor{f32(big, 3, 4)}, nil},
		{"short matmul input", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{f32(small, 3, 4), f32(big, 4, 3)}, []*kernels.Tensor{f32(big, 3, 3)}, nil},
		{"short sum output", kernels.Op{Name: kernels.OpSum, Axes: []int{1}}, []*kernels.Tensor{f32(big, 3, 4)}, []*kernels.Tensor{f32(small, 3)}, nil},
		{"negative dim", kernels.Op{Name: kernels.OpNeg}, []*kernels.Tensor{f32(big, -3)}, []*kernels.Tensor{f32(big, -3)}, nil},
		{"short full", kernels.Op{Name: kernels.OpFull, Shape: []int{100}}, nil, []*kernels.Tensor{f32(small, 100)}, nil},
		{"short permute output", kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}, []*kernels.Tensor{f32(big, 3, 4)}, []*kernels.Tensor{f32(small, 4, 3)}, nil},
		{"short cast output", kernels.Op{Name: kernels.OpCast, DType: kernels.Float64}, []*kernels.Tensor{f32(big, 12)},
			[]*kernels.Tensor{{Meta: meta(kernels.Float64, 12), Buf: big}}, nil},
		{"output shape mismatch", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{f32(big, 3), f32(big, 3)}, []*kernels.Tensor{f32(big, 12)}, nil},
		{"matmul output mismatch", kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{f32(big, 2, 3), f32(big, 3, 2)}, []*kernels.Tensor{f32(big, 3, 3)}, nil},
		{"dtype mismatch", kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{f32(big, 3), {Meta: meta(kernels.Int32, 3), Buf: big}}, []*kernels.Tensor{f32(big, 3)}, nil},
	}
	for _, c := range cases {
		p, err := safeExec(b, &c.op, c.in, c.out)
		switch {
		case p != nil:
			s.t.Errorf("%s: Exec(%s) panicked: %v", c.name, opString(&c.op), p)
		case err == nil:
			s.t.Errorf("%s: Exec(%s) succeeded, want an error", c.name, opString(&c.op))
		case c.want != nil && !errors.Is(err, c.want):
			s.t.Errorf("%s: Exec(%s) = %v, want an error wrapping %v", c.name, opString(&c.op), err, c.want)
		}
	}
	movementExecErrors(s)
	nnExecErrors(s)
	optimExecErrors(s)
}

// execCase is an Exec call that must fail.
type execCase struct {
	name    string
	op      kernels.Op
	in, out []*kernels.Tensor
}

// expectExecErrors runs each case on the suite's backend and reports any
// that panics or succeeds.
func expectExecErrors(s *suite, cases []execCase) {
	for _, c := range cases {
		p, err := safeExec(s.b, &c.op, c.in, c.out)
		switch {
		case p != nil:
			s.t.Errorf("%s: Exec(%s) panicked: %v", c.name, opString(&c.op), p)
		case err == nil:
			s.t.Errorf("%s: Exec(%s) succeeded, want an error", c.name, opString(&c.op))
		}
	}
}

// safeExec runs Exec, recovering a panic.
func safeExec(b kernels.Backend, op *kernels.Op, in, out []*kernels.Tensor) (p any, err error) {
	defer func() { p = recover() }()
	return nil, b.Exec(op, in, out)
}
