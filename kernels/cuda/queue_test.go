//go:build cgo && linux

package cuda

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/kernelstest"
)

// TestQueuedReuse runs a chain of adds, each input freed as soon as the
// next op is queued: freed blocks are handed out again while the launches
// that read them have not been issued yet, and the result must still be
// the chain's.
func TestQueuedReuse(t *testing.T) {
	b := newBackend(t)
	one := tensor(t, b, kernels.Float32, []int{3}, []float64{1, 2, 3})
	alloc := func() *kernels.Tensor {
		buf, err := b.Alloc(12)
		if err != nil {
			t.Fatal(err)
		}
		return &kernels.Tensor{Meta: one.Meta, Buf: buf}
	}
	x := alloc()
	if err := b.Exec(&kernels.Op{Name: kernels.OpFull, Shape: []int{3}, DType: kernels.Float32}, nil, []*kernels.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	for range n {
		y := alloc()
		if err := b.Exec(&kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x, one}, []*kernels.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		b.Free(x.Buf)
		x = y
	}
	got := values(t, b, x)
	for i, v := range got {
		if want := float64(n * (i + 1)); v != want {
			t.Fatalf("element %d is %v, want %v", i, v, want)
		}
	}
	b.Free(x.Buf)
}

// TestAsyncError checks that a queued device call that fails is reported
// once, by the next call that waits, naming its op.
func TestAsyncError(t *testing.T) {
	b := newBackend(t)
	boom := errors.New("boom")
	fail := func(op string) {
		t.Helper()
		b.mu.Lock()
		err := b.queue(op, func() error {
			b.record(func() error { return boom })
			return nil
		})
		b.mu.Unlock()
		if err != nil {
			t.Fatalf("queueing %s: %v", op, err)
		}
	}
	x := tensor(t, b, kernels.Float32, []int{2}, []float64{1, 2})
	for _, c := range []struct {
		name string
		wait func() error
	}{
		{"sync", b.Sync},
		{"download", func() error { return b.Download(make([]byte, 8), x.Buf) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			fail("exp")
			fail("log") // reported with the first
			err := c.wait()
			var ae *AsyncError
			if !errors.As(err, &ae) || ae.Op != "exp" || !errors.Is(err, boom) {
				t.Fatalf("%s after a failed launch: %v, want an AsyncError naming exp", c.name, err)
			}
			if err := c.wait(); err != nil {
				t.Fatalf("%s again: %v, want nil: the failure is reported once", c.name, err)
			}
		})
	}
	// A failed plan queues nothing.
	b.mu.Lock()
	err := b.queue("neg", func() error {
		b.record(func() error { return boom })
		return kernels.ErrShape
	})
	b.mu.Unlock()
	if !errors.Is(err, kernels.ErrShape) {
		t.Fatalf("failed plan: %v", err)
	}
	if err := b.Sync(); err != nil {
		t.Fatalf("sync after a failed plan: %v, want nil", err)
	}
}

// TestChains runs sequences of elementwise ops, with inputs freed and
// their blocks handed out again mid-sequence, on a backend that chains
// them and on one that does not: the same bits, before the chains'
// kernels are compiled (op by op) and after (one fused kernel a chain).
func TestChains(t *testing.T) {
	on := newBackend(t)
	off := newBackend(t, WithChains(false))
	r := rand.New(rand.NewPCG(3, 4))
	type step struct {
		op   string
		args []int
		free []int // values freed after the step
	}
	// Values 0 and 1 are the inputs x and y; step k makes value 2+k.
	steps := []step{
		{op: kernels.OpAdd, args: []int{0, 1}},
		{op: kernels.OpMul, args: []int{2, 0}, free: []int{2}},
		{op: kernels.OpSub, args: []int{3, 1}, free: []int{0}}, // x's block goes to the next output
		{op: kernels.OpMaximum, args: []int{4, 3}},
		{op: kernels.OpNeg, args: []int{5}},
		{op: kernels.OpAbs, args: []int{6}},
		{op: kernels.OpAdd, args: []int{7, 1}},
		{op: kernels.OpMinimum, args: []int{8, 5}},
	}
	run := func(b *Backend, dt kernels.DType, x, y []float64, xs, ys []int) [][]byte {
		vals := []*kernels.Tensor{
			tensor(t, b, dt, xs, x),
			tensor(t, b, dt, ys, y),
		}
		freed := map[int]bool{}
		for _, s := range steps {
			args := make([]*kernels.Tensor, len(s.args))
			for i, a := range s.args {
				args[i] = vals[a]
			}
			op := &kernels.Op{Name: s.op}
			m, err := kernels.Infer(op, metas(args), kernels.DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			buf, err := b.Alloc(m[0].Bytes())
			if err != nil {
				t.Fatal(err)
			}
			out := &kernels.Tensor{Meta: m[0], Buf: buf}
			if err := b.Exec(op, args, []*kernels.Tensor{out}); err != nil {
				t.Fatalf("%s: %v", s.op, err)
			}
			vals = append(vals, out)
			for _, f := range s.free {
				b.Free(vals[f].Buf)
				freed[f] = true
			}
		}
		var got [][]byte
		for v := 2; v < len(vals); v++ {
			if !freed[v] {
				got = append(got, download(t, b, vals[v]))
				b.Free(vals[v].Buf)
			}
		}
		return got
	}
	for _, c := range []struct {
		dt     kernels.DType
		xs, ys []int
	}{
		{kernels.Float32, []int{1}, []int{1}},
		{kernels.Float32, []int{300, 33}, []int{33}},
		{kernels.Float32, []int{1000}, []int{}},
		{kernels.Float16, []int{64, 7}, []int{64, 1}},
		{kernels.BFloat16, []int{129}, []int{129}},
		{kernels.Float64, []int{5, 6}, []int{6}},
		{kernels.Int32, []int{4097}, []int{1}},
	} {
		x, y := randn(r, kernels.Numel(c.xs)), randn(r, kernels.Numel(c.ys))
		if c.dt == kernels.Int32 {
			for i := range x {
				x[i] = math.Round(100 * x[i])
			}
			for i := range y {
				y[i] = math.Round(100 * y[i])
			}
		}
		want := run(off, c.dt, x, y, c.xs, c.ys)
		// The blocks handed out in the first pass may differ from the
		// next ones', and with them the chains' forms: passes until one
		// runs a chain as one kernel.
		fused, forms := on.fusedChains, on.chainForms
		for pass := 0; pass < 6 && on.fusedChains == fused; pass++ {
			got := run(on, c.dt, x, y, c.xs, c.ys)
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Errorf("%v %v by %v, pass %d: output %d differs from the ops run one by one", c.dt, c.xs, c.ys, pass, i)
				}
			}
			on.bg.Wait() // the next pass finds the kernels compiled
		}
		if on.fusedChains == fused {
			t.Errorf("%v %v by %v: no chain ran as one kernel once compiled (%d new chain forms)", c.dt, c.xs, c.ys, on.chainForms-forms)
			for _, cp := range on.chains {
				t.Logf("chain form: state %d, kernel %.80q: %v", cp.state, cp.spec, cp.err)
			}
		}
	}
}

// lagged is the backend with every Upload landing through the device's
// queue: the bytes go to a scratch block, and the copy into the
// destination is queued behind a run of small kernels. When the suite's
// Exec runs, the inputs it reads have not been written yet, so an op that
// reached the stream out of the queue's order reads the wrong bytes.
type lagged struct {
	*Backend
	pad [2]*kernels.Tensor
}

func (l *lagged) Upload(dst kernels.Buffer, src []byte) error {
	n := len(src)
	if n == 0 {
		return l.Backend.Upload(dst, src)
	}
	tmp, err := l.Alloc(n)
	if err != nil {
		return err
	}
	defer l.Free(tmp)
	if err := l.Backend.Upload(tmp, src); err != nil {
		return err
	}
	for i := range 256 {
		if err := l.Exec(&kernels.Op{Name: kernels.OpNeg}, l.pad[i%2:i%2+1], l.pad[1-i%2:2-i%2]); err != nil {
			return err
		}
	}
	bytesOf := func(b kernels.Buffer) *kernels.Tensor {
		return &kernels.Tensor{Meta: kernels.Meta{DType: kernels.Uint8, Shape: []int{n}}, Buf: b}
	}
	return l.Exec(&kernels.Op{Name: kernels.OpReshape, Shape: []int{n}}, []*kernels.Tensor{bytesOf(tmp)}, []*kernels.Tensor{bytesOf(dst)})
}

// TestConformanceQueued runs the conformance suite with every input
// written by queued work that has not reached the stream when the op
// under test is queued: every op must queue its device calls behind it.
func TestConformanceQueued(t *testing.T) {
	b := newBackend(t)
	l := &lagged{Backend: b}
	for i := range l.pad {
		l.pad[i] = tensor(t, b, kernels.Float32, []int{1 << 16}, make([]float64, 1<<16))
	}
	kernelstest.RunAll(t, l)
}

// TestTrim frees a large block while the work that reads it is queued,
// trims the cache, and checks that the work's result and the memory given
// back are right, and that memory is handed out again after it.
func TestTrim(t *testing.T) {
	b := newBackend(t)
	const n = 8 << 20 // 32 MiB of float32
	x := tensor(t, b, kernels.Float32, []int{n}, nil)
	if err := b.Exec(&kernels.Op{Name: kernels.OpFull, Shape: []int{n}, DType: kernels.Float32, Value: 2}, nil, []*kernels.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	sum := tensor(t, b, kernels.Float32, nil, nil)
	if err := b.Exec(&kernels.Op{Name: "sum"}, []*kernels.Tensor{x}, []*kernels.Tensor{sum}); err != nil {
		t.Fatal(err)
	}
	b.Free(x.Buf)
	if got := b.Trim(); got < 4*n {
		t.Fatalf("Trim gave back %d bytes, want at least the freed %d", got, 4*n)
	}
	if got := values(t, b, sum); got[0] != 2*n {
		t.Fatalf("sum of the freed block is %v, want %v", got[0], 2*n)
	}
	if got := b.Trim(); got != 0 {
		t.Fatalf("a second Trim gave back %d bytes, want 0", got)
	}
	y := tensor(t, b, kernels.Float32, []int{n}, nil)
	b.Free(y.Buf)
}
