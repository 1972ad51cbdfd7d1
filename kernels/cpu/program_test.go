package cpu

import (
	"errors"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

func progTensor(t *testing.T, b *Backend, dt kernels.DType, shape []int, v []float64) *kernels.Tensor {
	t.Helper()
	m := kernels.Meta{DType: dt, Shape: shape}
	buf, err := b.Alloc(m.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if v != nil {
		raw, err := kernels.EncodeValues(dt, v)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf.(*Buffer).data, raw)
	}
	return &kernels.Tensor{Meta: m, Buf: buf}
}

func progValues(t *testing.T, x *kernels.Tensor) []float64 {
	t.Helper()
	v, err := kernels.DecodeValues(x.DType, x.Buf.(*Buffer).data)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProgram records rows of x gathered by idx, then a fused group and
// an op over them, and runs the program on other inputs: the values of
// the calls made directly; an index out of range fails Run, which then
// writes nothing of its outputs; the memory goes back on Release.
func TestProgram(t *testing.T) {
	b := New()
	f32 := kernels.Float32
	step := func(x, idx *kernels.Tensor) (y *kernels.Tensor, tmp []*kernels.Tensor) {
		rows := progTensor(t, b, f32, []int{2, 3}, nil)
		if err := b.Exec(&kernels.Op{Name: kernels.OpIndexSelect}, []*kernels.Tensor{x, idx}, []*kernels.Tensor{rows}); err != nil {
			t.Fatal(err)
		}
		sq := progTensor(t, b, f32, []int{2, 3}, nil)
		g := &kernels.FusedGroup{Inputs: 1, Ops: []kernels.FusedOp{
			{Op: kernels.Op{Name: kernels.OpMul}, Args: []int{0, 0}},
			{Op: kernels.Op{Name: kernels.OpNeg}, Args: []int{1}},
		}, Results: []int{2}}
		if err := b.ExecFused(g, []*kernels.Tensor{rows}, []*kernels.Tensor{sq}); err != nil {
			t.Fatal(err)
		}
		y = progTensor(t, b, f32, []int{3}, nil)
		if err := b.Exec(&kernels.Op{Name: kernels.OpSum, Axes: []int{0}}, []*kernels.Tensor{sq}, []*kernels.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		return y, []*kernels.Tensor{rows, sq}
	}
	x0 := progTensor(t, b, f32, []int{4, 3}, []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	i0 := progTensor(t, b, kernels.Int64, []int{2}, []float64{0, 3})
	if err := b.Record(); err != nil {
		t.Fatal(err)
	}
	if err := b.Record(); err == nil {
		t.Error("a second Record: no error")
	}
	var slots []*kernels.Tensor
	for _, x := range []*kernels.Tensor{x0, i0} {
		s := progTensor(t, b, x.DType, x.Shape, nil)
		if err := b.RecordInput(s.Buf, x.Buf); err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	y, tmp := step(slots[0], slots[1])
	for _, u := range tmp {
		b.Free(u.Buf)
	}
	p, err := b.EndRecord([]kernels.Buffer{y.Buf}, []kernels.Buffer{slots[0].Buf, slots[1].Buf})
	if err != nil {
		t.Fatal(err)
	}
	out := progTensor(t, b, f32, []int{3}, nil)
	if err := p.CopyOutputs([]kernels.Buffer{out.Buf}); err != nil {
		t.Fatal(err)
	}
	if v := progValues(t, out); !slices.Equal(v, []float64{-101, -125, -153}) {
		t.Fatalf("recorded: %v", v)
	}
	x1 := progTensor(t, b, f32, []int{4, 3}, []float64{0, 1, 0, 2, 0, 2, 3, 0, 3, 0, 4, 0})
	i1 := progTensor(t, b, kernels.Int64, []int{2}, []float64{2, 1})
	for range 2 {
		if err := p.Run([]kernels.Buffer{x1.Buf, i1.Buf}, []kernels.Buffer{out.Buf}); err != nil {
			t.Fatal(err)
		}
		wy, wtmp := step(x1, i1)
		if v, w := progValues(t, out), progValues(t, wy); !slices.Equal(v, w) {
			t.Fatalf("run: %v, the calls made directly: %v", v, w)
		}
		for _, u := range append(wtmp, wy) {
			b.Free(u.Buf)
		}
	}
	bad := progTensor(t, b, kernels.Int64, []int{2}, []float64{4, 0})
	before := progValues(t, out)
	if err := p.Run([]kernels.Buffer{x1.Buf, bad.Buf}, []kernels.Buffer{out.Buf}); !errors.Is(err, kernels.ErrIndex) {
		t.Fatalf("run with an index out of range: %v", err)
	}
	if v := progValues(t, out); !slices.Equal(v, before) {
		t.Errorf("a failed run wrote its output: %v, was %v", v, before)
	}
	if err := p.Run([]kernels.Buffer{x1.Buf}, []kernels.Buffer{out.Buf}); !errors.Is(err, kernels.ErrArity) {
		t.Errorf("run with one input: %v", err)
	}
	if err := p.Run([]kernels.Buffer{i1.Buf, i1.Buf}, []kernels.Buffer{out.Buf}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("run with an input of the wrong size: %v", err)
	}
	if p.Bytes() == 0 {
		t.Error("a program of no bytes")
	}
	p.Release()
	p.Release()
	if err := p.Run([]kernels.Buffer{x1.Buf, i1.Buf}, []kernels.Buffer{out.Buf}); err == nil {
		t.Error("run of a released program: no error")
	}
}

// TestProgramRefused: a call that failed, an upload into the recording
// and a buffer held but not listed each refuse the recording.
func TestProgramRefused(t *testing.T) {
	b := New()
	f32 := kernels.Float32
	if _, err := b.EndRecord(nil, nil); err == nil {
		t.Error("EndRecord without a recording: no error")
	}
	if err := b.RecordInput(nil, nil); err == nil {
		t.Error("RecordInput without a recording: no error")
	}
	x := progTensor(t, b, f32, []int{3}, []float64{1, 2, 3})
	for name, misuse := range map[string]func(y *kernels.Tensor){
		"failed call": func(y *kernels.Tensor) {
			_ = b.Exec(&kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x}, []*kernels.Tensor{y})
		},
		"upload": func(y *kernels.Tensor) {
			_ = b.Upload(y.Buf, make([]byte, 12))
		},
	} {
		if err := b.Record(); err != nil {
			t.Fatal(err)
		}
		y := progTensor(t, b, f32, []int{3}, nil)
		misuse(y)
		if _, err := b.EndRecord([]kernels.Buffer{y.Buf}, nil); !errors.Is(err, kernels.ErrNotRecordable) {
			t.Errorf("%s: EndRecord: %v, want ErrNotRecordable", name, err)
		}
		if _, err := host(y.Buf); err != nil {
			t.Errorf("%s: the caller's buffer is gone: %v", name, err)
		}
	}
	if err := b.Record(); err != nil {
		t.Fatal(err)
	}
	if err := b.RecordInput(x.Buf, x.Buf); err == nil {
		t.Error("RecordInput of a slot allocated before Record: no error")
	}
	y := progTensor(t, b, f32, []int{3}, nil)
	z := progTensor(t, b, f32, []int{3}, nil)
	if _, err := b.EndRecord([]kernels.Buffer{y.Buf}, nil); err == nil {
		t.Error("EndRecord with a buffer held and not listed: no error")
	}
	b.Free(z.Buf)
	b.AbortRecord()
}

// TestProgramInPlace: an input no call writes is read in place and its
// slot's memory goes back at EndRecord; an input written over (an op whose
// output shares its buffer) is copied, so the caller's stays as it was,
// also when a run fails; outputs handed over keep their values through
// later runs.
func TestProgramInPlace(t *testing.T) {
	b := New()
	f32 := kernels.Float32
	shape := []int{4}
	a0 := progTensor(t, b, f32, shape, []float64{1, 2, 3, 4})
	c0 := progTensor(t, b, f32, shape, []float64{1, 1, 1, 1})
	i0 := progTensor(t, b, kernels.Int64, []int{2}, []float64{0, 1})
	if err := b.Record(); err != nil {
		t.Fatal(err)
	}
	var slots []*kernels.Tensor
	for _, x := range []*kernels.Tensor{a0, c0, i0} {
		s := progTensor(t, b, x.DType, x.Shape, nil)
		if err := b.RecordInput(s.Buf, x.Buf); err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	if err := b.RecordInput(slots[0].Buf, a0.Buf); err == nil {
		t.Error("a slot recorded twice as an input: no error")
	}
	a, c, idx := slots[0], slots[1], slots[2]
	y := progTensor(t, b, f32, shape, nil)
	g := progTensor(t, b, f32, []int{2}, nil)
	for _, call := range []struct {
		op  string
		in  []*kernels.Tensor
		out *kernels.Tensor
	}{
		{kernels.OpNeg, []*kernels.Tensor{a}, y},
		{kernels.OpAdd, []*kernels.Tensor{c, a}, c}, // c written over
		{kernels.OpIndexSelect, []*kernels.Tensor{y, idx}, g},
	} {
		if err := b.Exec(&kernels.Op{Name: call.op}, call.in, []*kernels.Tensor{call.out}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := b.EndRecord([]kernels.Buffer{y.Buf, c.Buf, g.Buf}, []kernels.Buffer{a.Buf, idx.Buf})
	if err != nil {
		t.Fatal(err)
	}
	prog := p.(*Program)
	if !slices.Equal(prog.inPlace, []bool{true, false, true}) || !slices.Equal(prog.handOver, []bool{true, false, true}) {
		t.Fatalf("in place %v, handed over %v; want [true false true], [true false true]", prog.inPlace, prog.handOver)
	}
	if got := p.Bytes(); got != 16+16+8 { // c, y and g; not a and idx, read in place
		t.Errorf("the program holds %d bytes, want 40", got)
	}
	if a.Buf.(*Buffer).data != nil {
		t.Error("a slot read in place still holds memory")
	}
	outs := func() []*kernels.Tensor {
		return []*kernels.Tensor{progTensor(t, b, f32, shape, nil), progTensor(t, b, f32, shape, nil), progTensor(t, b, f32, []int{2}, nil)}
	}
	run := func(av, cv []float64, iv []float64) ([]*kernels.Tensor, []*kernels.Tensor, error) {
		in := []*kernels.Tensor{progTensor(t, b, f32, shape, av), progTensor(t, b, f32, shape, cv), progTensor(t, b, kernels.Int64, []int{2}, iv)}
		out := outs()
		return in, out, p.Run(buffers(in), buffers(out))
	}
	in1, out1, err := run([]float64{1, 2, 3, 4}, []float64{10, 20, 30, 40}, []float64{3, 0})
	if err != nil {
		t.Fatal(err)
	}
	in2, out2, err := run([]float64{5, 6, 7, 8}, []float64{0, 0, 0, 0}, []float64{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		x    *kernels.Tensor
		want []float64
	}{
		{out1[0], []float64{-1, -2, -3, -4}}, {out1[1], []float64{11, 22, 33, 44}}, {out1[2], []float64{-4, -1}},
		{out2[0], []float64{-5, -6, -7, -8}}, {out2[1], []float64{5, 6, 7, 8}}, {out2[2], []float64{-6, -7}},
		{in1[0], []float64{1, 2, 3, 4}}, {in1[1], []float64{10, 20, 30, 40}},
		{in2[0], []float64{5, 6, 7, 8}}, {in2[1], []float64{0, 0, 0, 0}},
	} {
		if v := progValues(t, c.x); !slices.Equal(v, c.want) {
			t.Errorf("got %v, want %v", v, c.want)
		}
	}
	in3, out3, err := run([]float64{1, 1, 1, 1}, []float64{2, 2, 2, 2}, []float64{0, 9})
	if !errors.Is(err, kernels.ErrIndex) {
		t.Fatalf("run with an index out of range: %v", err)
	}
	if v := progValues(t, in3[1]); !slices.Equal(v, []float64{2, 2, 2, 2}) {
		t.Errorf("a failed run wrote its input: %v", v)
	}
	for _, o := range out3 {
		if v := progValues(t, o); slices.ContainsFunc(v, func(f float64) bool { return f != 0 }) {
			t.Errorf("a failed run wrote an output: %v", v)
		}
	}
	p.Release()
}

func buffers(ts []*kernels.Tensor) []kernels.Buffer {
	b := make([]kernels.Buffer, len(ts))
	for i, t := range ts {
		b[i] = t.Buf
	}
	return b
}
