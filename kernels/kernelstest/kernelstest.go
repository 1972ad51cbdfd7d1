package kernelstest

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/kernels"
)

// SeedEnv names the environment variable that fixes the suite's random
// seed, to replay a failure; by default the seed comes from the clock and
// is logged when a test fails.
const SeedEnv = "JETFABRIC_KERNELS_SEED"

// guard is how many poisoned bytes follow each output, to catch writes
// past its end.
const guard = 64

// poison fills outputs before Exec: NaN in every float dtype, -1 in the
// signed integers, 255 in u8 and an invalid bool.
const poison = 0xFF

// RunAll runs the conformance suite against b: every op of
// kernels.OpNames, each dtype its rule accepts, broadcasting, negative axes,
// keepdims, empty tensors, NaN and infinity, on random inputs drawn afresh
// each run, with every output poisoned before Exec and checked against a
// float64 (or exact integer) reference computed here. An op with no test
// in the suite fails. It also checks Infer's errors and that Exec rejects
// bad input without panicking.
//
// A backend may answer kernels.ErrNotImplemented for dtypes other than
// float32, and for any dtype of the ops of kernels.Movement, Indexing,
// Norms, Creation, Conv, Pools and Losses (which a caller can run
// elsewhere and move): those cases are skipped and counted in the log,
// unless the option RequireAll is given. float32 is otherwise always
// required.
func RunAll(t *testing.T, b kernels.Backend, opts ...Option) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(SeedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, v, err)
		}
		seed = s
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kernelstest on %s: seed %d; replay with %s=%d", b.Name(), seed, SeedEnv, seed)
		}
	})
	run := func(name string, f func(*suite)) {
		t.Run(name, func(t *testing.T) {
			if o.parallel {
				t.Parallel()
			}
			h := fnv.New64a()
			h.Write([]byte(name))
			s := &suite{t: t, b: b, r: rand.New(rand.NewPCG(seed, h.Sum64())), opts: o}
			f(s)
			if s.skipped > 0 {
				t.Logf("%d cases not implemented by %s", s.skipped, b.Name())
			}
		})
	}
	run("infer_errors", testInferErrors)
	run("exec_errors", testExecErrors)
	for _, name := range kernels.OpNames() {
		f, ok := opTests[name]
		if !ok {
			t.Run(name, func(t *testing.T) {
				t.Errorf("op %q has no conformance test in kernelstest", name)
			})
			continue
		}
		run(name, f)
	}
}

// suite is the state of one op's tests.
type suite struct {
	t       *testing.T
	b       kernels.Backend
	r       *rand.Rand
	opts    options
	skipped int
}

// Option changes what RunAll requires of a backend.
type Option func(*options)

type options struct {
	requireAll bool
	require    map[string]bool
	parallel   bool
}

// Parallel runs the ops' tests in parallel with each other (t.Parallel):
// for a backend safe for concurrent use by several callers.
func Parallel() Option { return func(o *options) { o.parallel = true } }

// RequireAll fails every case the backend answers with
// kernels.ErrNotImplemented, whatever its dtype: for a backend that
// implements the whole op set, such as the CPU oracle.
func RequireAll() Option { return func(o *options) { o.requireAll = true } }

// Require fails every case of the named ops that the backend answers with
// kernels.ErrNotImplemented, whatever its dtype: for a backend that
// implements those ops in full but may decline others.
func Require(ops ...string) Option {
	return func(o *options) {
		if o.require == nil {
			o.require = map[string]bool{}
		}
		for _, name := range ops {
			o.require[name] = true
		}
	}
}

// mayDecline reports whether the backend may answer a case of op with
// kernels.ErrNotImplemented (float32 aside, which run checks itself).
func (o *options) mayDecline(op string) bool { return !o.requireAll && !o.require[op] }

// errNotImplemented marks a case the backend declined.
var errNotImplemented = errors.New("not implemented")

// exec runs op on b with the given inputs: it infers the outputs, uploads
// the inputs, poisons the outputs and their guard bytes, runs and reads
// them back. A backend error is returned; a broken guard fails the test.
func (s *suite) exec(op *kernels.Op, ins ...*host) ([]*host, error) {
	s.t.Helper()
	metas := make([]kernels.Meta, len(ins))
	for i, h := range ins {
		metas[i] = h.meta()
	}
	outm, err := kernels.Infer(op, metas, kernels.DefaultLimits())
	if err != nil {
		return nil, fmt.Errorf("infer: %w", err)
	}
	var bufs []kernels.Buffer
	defer func() {
		for _, buf := range bufs {
			s.b.Free(buf)
		}
	}()
	alloc := func(n int) (kernels.Buffer, error) {
		buf, err := s.b.Alloc(n)
		if err == nil {
			bufs = append(bufs, buf)
		}
		return buf, err
	}
	in := make([]*kernels.Tensor, len(ins))
	for i, h := range ins {
		buf, err := alloc(h.meta().Bytes())
		if err != nil {
			return nil, fmt.Errorf("alloc: %w", err)
		}
		if err := s.b.Upload(buf, h.encode()); err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		in[i] = &kernels.Tensor{Meta: h.meta(), Buf: buf}
	}
	out := make([]*kernels.Tensor, len(outm))
	for i, m := range outm {
		buf, err := alloc(m.Bytes() + guard)
		if err != nil {
			return nil, fmt.Errorf("alloc: %w", err)
		}
		if err := s.b.Upload(buf, poisoned(m.Bytes()+guard)); err != nil {
			return nil, fmt.Errorf("upload: %w", err)
		}
		out[i] = &kernels.Tensor{Meta: m, Buf: buf}
	}
	if err := s.b.Exec(op, in, out); err != nil {
		if errors.Is(err, kernels.ErrNotImplemented) {
			return nil, fmt.Errorf("%w: %w", errNotImplemented, err)
		}
		return nil, err
	}
	if err := s.b.Sync(); err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	res := make([]*host, len(out))
	for i, o := range out {
		raw := make([]byte, o.Bytes()+guard)
		if err := s.b.Download(raw, o.Buf); err != nil {
			return nil, fmt.Errorf("download: %w", err)
		}
		for j, c := range raw[o.Bytes():] {
			if c != poison {
				s.t.Errorf("%s: output %d: byte %d past the end of %d was written", opString(op), i, j, o.Bytes())
				break
			}
		}
		res[i] = decode(o.DType, o.Shape, raw)
	}
	return res, nil
}

func poisoned(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = poison
	}
	return p
}

// tol is a comparison tolerance: |got - want| <= atol + rtol*|want| +
// terms*unit*scale, where scale comes from the reference (the sum of the
// magnitudes of the terms it accumulated) and unit is the dtype's unit
// roundoff, so accumulating ops may sum in any order.
type tol struct {
	atol, rtol float64
	unit       float64
}

// Tolerances per dtype for one rounded result: about two units in the
// last place, so backends with faithful (not correctly rounded) functions
// pass. Integers, and bool, are exact.
var tolerances = map[kernels.DType]tol{
	kernels.Float64:  {atol: 1e-300, rtol: 1e-13, unit: 0x1p-53},
	kernels.Float32:  {atol: 1e-30, rtol: 2.5e-7, unit: 0x1p-24},
	kernels.Float16:  {atol: 6e-8, rtol: 2e-3, unit: 0x1p-11},
	kernels.BFloat16: {atol: 1e-38, rtol: 1.6e-2, unit: 0x1p-8},
}

// loose is the tolerance for transcendental functions: a few more units.
func loose(dt kernels.DType) tol {
	t := tolerances[dt]
	switch dt {
	case kernels.Float32:
		t.rtol, t.atol = 2e-6, 1e-7
	case kernels.Float64:
		t.rtol, t.atol = 1e-12, 1e-15
	case kernels.Float16:
		t.atol = 2e-5
	case kernels.BFloat16:
		t.atol = 1e-4
	}
	return t
}

// want is a reference result: the values, and for accumulating ops the
// number of terms and per-element scale that widen the tolerance.
type want struct {
	*host
	terms int
	scale []float64
	tol   tol
}

// check compares got against w, failing the test with the first few
// mismatches.
func (s *suite) check(what string, got *host, w want) {
	s.t.Helper()
	if got.dt != w.dt || !equalShape(got.shape, w.shape) {
		s.t.Errorf("%s: got %v, want %v", what, got, w.host)
		return
	}
	bad := 0
	var msg strings.Builder
	for j := range got.numel() {
		ok := true
		var g, e float64
		if got.f != nil {
			g, e = got.f[j], w.f[j]
			ok = near(g, e, w, j)
		} else {
			ok = got.i[j] == w.i[j]
			g, e = float64(got.i[j]), float64(w.i[j])
		}
		if !ok {
			if bad < 5 {
				fmt.Fprintf(&msg, "\n\telement %d (index %v): got %v, want %v", j, unravel(j, got.shape), g, e)
			}
			bad++
		}
	}
	if bad > 0 {
		s.t.Errorf("%s: %d of %d elements differ:%s", what, bad, got.numel(), msg.String())
	}
}

func near(g, e float64, w want, j int) bool {
	if math.IsNaN(e) || math.IsNaN(g) {
		return math.IsNaN(e) && math.IsNaN(g)
	}
	if math.IsInf(e, 0) || math.IsInf(g, 0) {
		return g == e
	}
	t := w.tol
	lim := t.atol + t.rtol*math.Abs(e)
	if w.scale != nil {
		lim += float64(w.terms+1) * t.unit * w.scale[j]
	}
	return math.Abs(g-e) <= lim
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func unravel(j int, shape []int) []int {
	idx := make([]int, len(shape))
	for k := len(shape) - 1; k >= 0; k-- {
		if shape[k] > 0 {
			idx[k] = j % shape[k]
			j /= shape[k]
		}
	}
	return idx
}

func opString(op *kernels.Op) string {
	var b strings.Builder
	b.WriteString(op.Name)
	if op.Shape != nil {
		fmt.Fprintf(&b, " shape=%v", op.Shape)
	}
	if op.Axes != nil {
		fmt.Fprintf(&b, " axes=%v", op.Axes)
	}
	if op.Keepdims {
		b.WriteString(" keepdims")
	}
	if op.Perm != nil {
		fmt.Fprintf(&b, " perm=%v", op.Perm)
	}
	if op.DType != kernels.Invalid {
		fmt.Fprintf(&b, " dtype=%v", op.DType)
	}
	for _, a := range []struct {
		name string
		v    []int
	}{{"starts", op.Starts}, {"ends", op.Ends}, {"steps", op.Steps}, {"pads", op.Pads}, {"sizes", op.Sizes},
		{"stride", op.Stride}, {"padding", op.Padding}, {"dilation", op.Dilation}, {"kernel", op.Kernel}} {
		if a.v != nil {
			fmt.Fprintf(&b, " %s=%v", a.name, a.v)
		}
	}
	for _, a := range []struct {
		name string
		v    int
	}{{"axis", op.Axis}, {"k", op.K}, {"depth", op.Depth}, {"num", op.Num}, {"n", op.N}, {"m", op.M}, {"groups", op.Groups}} {
		if a.v != 0 {
			fmt.Fprintf(&b, " %s=%d", a.name, a.v)
		}
	}
	if op.Eps != 0 {
		fmt.Fprintf(&b, " eps=%v", op.Eps)
	}
	if op.P != 0 {
		fmt.Fprintf(&b, " p=%v", op.P)
	}
	if op.Reduce != "" {
		fmt.Fprintf(&b, " reduce=%s", op.Reduce)
	}
	for _, a := range []struct {
		name string
		v    float64
	}{{"lr", op.LR}, {"beta1", op.Beta1}, {"beta2", op.Beta2}, {"weight_decay", op.WeightDecay},
		{"momentum", op.Momentum}, {"dampening", op.Dampening}} {
		if a.v != 0 {
			fmt.Fprintf(&b, " %s=%v", a.name, a.v)
		}
	}
	if op.T != 0 {
		fmt.Fprintf(&b, " t=%d", op.T)
	}
	if op.Decoupled {
		b.WriteString(" decoupled")
	}
	if op.Nesterov {
		b.WriteString(" nesterov")
	}
	return b.String()
}

// run executes op on ins and compares the single output with w; a case
// the backend does not implement is skipped unless it is float32.
func (s *suite) run(op *kernels.Op, w want, ins ...*host) {
	s.t.Helper()
	what := opString(op)
	for _, h := range ins {
		what += " " + h.String()
	}
	got, err := s.exec(op, ins...)
	if errors.Is(err, errNotImplemented) && s.opts.mayDecline(op.Name) &&
		(declinable[op.Name] || w.dt != kernels.Float32 && (len(ins) == 0 || ins[0].dt != kernels.Float32)) {
		s.skipped++
		return
	}
	if err != nil {
		s.t.Errorf("%s: %v", what, err)
		return
	}
	if len(got) != 1 {
		s.t.Errorf("%s: %d outputs, want 1", what, len(got))
		return
	}
	s.check(what, got[0], w)
}

// accepts reports whether Infer takes op on inputs of these metas; an
// error other than ErrDType fails the test.
func (s *suite) accepts(op *kernels.Op, metas ...kernels.Meta) bool {
	s.t.Helper()
	_, err := kernels.Infer(op, metas, kernels.DefaultLimits())
	if err != nil && !errors.Is(err, kernels.ErrDType) {
		s.t.Fatalf("%s: %v", opString(op), err)
	}
	return err == nil
}

// allDTypes lists every dtype, float32 first.
var allDTypes = []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16,
	kernels.Int32, kernels.Int64, kernels.Uint8, kernels.Bool}
