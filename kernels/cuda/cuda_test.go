//go:build cgo && linux

package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// newBackend opens device 0, or skips the test where there is no GPU.
func newBackend(t testing.TB, opts ...Option) *Backend {
	t.Helper()
	b, err := New(0, opts...)
	if errors.Is(err, ErrNoGPU) || errors.Is(err, ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func TestNoDriver(t *testing.T) {
	if _, err := DeviceCount(); err != nil && !errors.Is(err, ErrNoGPU) {
		t.Fatalf("DeviceCount without a usable driver: %v, want ErrNoGPU", err)
	}
}

// tensor uploads v as a tensor of dtype dt.
func tensor(t testing.TB, b *Backend, dt kernels.DType, shape []int, v []float64) *kernels.Tensor {
	t.Helper()
	m := kernels.Meta{DType: dt, Shape: shape}
	buf, err := b.Alloc(m.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free(buf) })
	if v != nil {
		raw, err := kernels.EncodeValues(dt, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Upload(buf, raw); err != nil {
			t.Fatal(err)
		}
	}
	return &kernels.Tensor{Meta: m, Buf: buf}
}

func empty(t testing.TB, b *Backend, dt kernels.DType, shape ...int) *kernels.Tensor {
	return tensor(t, b, dt, shape, nil)
}

func download(t testing.TB, b *Backend, x *kernels.Tensor) []byte {
	t.Helper()
	raw := make([]byte, x.Bytes())
	if err := b.Download(raw, x.Buf); err != nil {
		t.Fatal(err)
	}
	return raw
}

func values(t testing.TB, b *Backend, x *kernels.Tensor) []float64 {
	t.Helper()
	v, err := kernels.DecodeValues(x.DType, download(t, b, x))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func randn(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64()
	}
	return v
}

// TestRandomBits checks uniform and normal bit for bit against the
// kernels package on a million elements of each float dtype.
func TestRandomBits(t *testing.T) {
	b := newBackend(t)
	const n = 1 << 20
	for _, name := range []string{kernels.OpUniform, kernels.OpNormal} {
		for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16} {
			op := &kernels.Op{Name: name, Shape: []int{n}, DType: dt, Seed: 0x1234, Key: 77, Low: -1.5, High: 2.25, Mean: 0.5, Std: 3}
			y := empty(t, b, dt, n)
			if err := b.Exec(op, nil, []*kernels.Tensor{y}); err != nil {
				t.Fatal(err)
			}
			got := download(t, b, y)
			want := make([]byte, len(got))
			for i := range n {
				var v float64
				if name == kernels.OpUniform {
					v = kernels.UniformAt(op.Seed, op.Key, uint64(i), op.Low, op.High)
				} else {
					v = kernels.NormalAt(op.Seed, op.Key, uint64(i), op.Mean, op.Std)
				}
				switch dt {
				case kernels.Float32:
					binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(float32(v)))
				case kernels.Float64:
					binary.LittleEndian.PutUint64(want[8*i:], math.Float64bits(v))
				case kernels.Float16:
					binary.LittleEndian.PutUint16(want[2*i:], kernels.Float16Bits(v))
				case kernels.BFloat16:
					binary.LittleEndian.PutUint16(want[2*i:], kernels.BFloat16Bits(v))
				}
			}
			if !bytes.Equal(got, want) {
				bad, first := 0, -1
				for i := 0; i < len(got); i += dt.Size() {
					if !bytes.Equal(got[i:i+dt.Size()], want[i:i+dt.Size()]) {
						if first < 0 {
							first = i / dt.Size()
						}
						bad++
					}
				}
				t.Errorf("%s %v: %d of %d elements differ in their bits, first at %d", name, dt, bad, n, first)
			}
		}
	}
}

// runUnfused runs the ops of g one by one and returns every value.
func runUnfused(t testing.TB, b *Backend, g *kernels.FusedGroup, in []*kernels.Tensor) []*kernels.Tensor {
	t.Helper()
	vals := append([]*kernels.Tensor{}, in...)
	for _, op := range g.Ops {
		args := make([]*kernels.Tensor, len(op.Args))
		metas := make([]kernels.Meta, len(op.Args))
		for i, a := range op.Args {
			args[i], metas[i] = vals[a], vals[a].Meta
		}
		out, err := kernels.Infer(&op.Op, metas, kernels.DefaultLimits())
		if err != nil {
			t.Fatal(err)
		}
		y := empty(t, b, out[0].DType, out[0].Shape...)
		if err := b.Exec(&op.Op, args, []*kernels.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		vals = append(vals, y)
	}
	return vals
}

// TestFused checks fused groups against the same ops run one by one: in
// float32 and the half types the results are identical, as each op
// rounds the same way in both.
func TestFused(t *testing.T) {
	b := newBackend(t)
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		name   string
		dt     kernels.DType
		x, y   []int
		reduce bool
	}{
		{"linear", kernels.Float32, []int{1000, 1003}, []int{}, false},
		{"row", kernels.Float32, []int{1000, 1003}, []int{1003}, false},
		{"column", kernels.Float32, []int{1000, 1003}, []int{1000, 1}, false},
		{"row-vec", kernels.Float32, []int{1000, 1024}, []int{1024}, false},
		{"column-vec", kernels.Float32, []int{1000, 1024}, []int{1000, 1}, false},
		{"row-vec-f16", kernels.Float16, []int{100, 64}, []int{64}, false},
		{"row-sum-warp", kernels.Float32, []int{5000, 1000}, []int{1000}, true},
		{"column-sum", kernels.Float32, []int{5000, 1000}, []int{5000, 1}, true},
		{"column-sum-axis0", kernels.Float32, []int{5000, 1000}, []int{1000}, true},
		{"row-sum", kernels.Float32, []int{700, 1003}, []int{1003}, true},
		{"row-sum-f16", kernels.Float16, []int{700, 1003}, []int{1003}, true},
		{"bf16", kernels.BFloat16, []int{333, 65}, []int{333, 65}, false},
		{"sum-all", kernels.Float32, []int{4000000}, []int{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := benchChain(c.reduce)
			switch c.name {
			case "sum-all":
				g.Ops[len(g.Ops)-1].Op.Axes = nil
			case "column-sum-axis0":
				g.Ops[len(g.Ops)-1].Op.Axes = []int{0}
			}
			x := tensor(t, b, c.dt, c.x, randn(r, kernels.Numel(c.x)))
			y := tensor(t, b, c.dt, c.y, randn(r, kernels.Numel(c.y)))
			in := []*kernels.Tensor{x, y}
			metas, err := kernels.InferFused(g, []kernels.Meta{x.Meta, y.Meta}, kernels.DefaultLimits())
			if err != nil {
				t.Fatal(err)
			}
			out := make([]*kernels.Tensor, len(g.Results))
			for k, v := range g.Results {
				out[k] = empty(t, b, metas[v].DType, metas[v].Shape...)
			}
			if err := b.ExecFused(g, in, out); err != nil {
				t.Fatal(err)
			}
			ref := runUnfused(t, b, g, in)
			for k, v := range g.Results {
				got, want := values(t, b, out[k]), values(t, b, ref[v])
				bad, worst := 0, 0.0
				for i := range got {
					if got[i] != want[i] && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
						bad++
						worst = max(worst, math.Abs(got[i]-want[i])/max(math.Abs(want[i]), 1e-30))
					}
				}
				if bad > 0 {
					t.Errorf("result %d (value %d): %d of %d elements differ from unfused, worst relative %g", k, v, bad, len(got), worst)
				}
			}
		})
	}
}

// TestMatmulPrecision compares products with a float64 reference computed
// here, by ||got-want|| / ||want||.
func TestMatmulPrecision(t *testing.T) {
	b := newBackend(t)
	tf := newBackend(t, WithTF32(true))
	r := rand.New(rand.NewPCG(3, 4))
	for _, c := range []struct {
		name  string
		be    *Backend
		dt    kernels.DType
		limit float64
	}{
		{"f32", b, kernels.Float32, 1e-6},
		{"tf32", tf, kernels.Float32, 3e-3},
		{"f16", b, kernels.Float16, 3e-3},
		{"bf16", b, kernels.BFloat16, 2e-2},
		{"f64", b, kernels.Float64, 1e-14},
		{"i32", b, kernels.Int32, 0},
	} {
		for _, sh := range [][2][]int{{{3, 130, 300}, {300, 70}}, {{2, 1, 65, 64}, {3, 64, 9}}, {{513}, {513, 100}}, {{256, 512}, {512, 384}}} {
			av, bv := randn(r, kernels.Numel(sh[0])), randn(r, kernels.Numel(sh[1]))
			if !c.dt.IsFloat() {
				for i := range av {
					av[i] = math.Round(av[i] * 10)
				}
				for i := range bv {
					bv[i] = math.Round(bv[i] * 10)
				}
			}
			x := tensor(t, c.be, c.dt, sh[0], av)
			y := tensor(t, c.be, c.dt, sh[1], bv)
			// The reference uses the inputs as stored.
			av, bv = values(t, c.be, x), values(t, c.be, y)
			_, m, k, n, oshape, err := kernels.MatmulShapes(sh[0], sh[1])
			if err != nil {
				t.Fatal(err)
			}
			z := empty(t, c.be, c.dt, oshape...)
			if err := c.be.Exec(&kernels.Op{Name: kernels.OpMatmul}, []*kernels.Tensor{x, y}, []*kernels.Tensor{z}); err != nil {
				t.Fatal(err)
			}
			got := values(t, c.be, z)
			want := make([]float64, len(got))
			nb := len(got) / (m * n)
			ab, bb := batchOf(sh[0]), batchOf(sh[1])
			batch, _ := kernels.BroadcastShapes(ab, bb)
			for tix := range nb {
				ia, ib := bindex(tix, batch, ab), bindex(tix, batch, bb)
				for i := range m {
					for j := range n {
						var s float64
						for q := range k {
							s += av[(ia*m+i)*k+q] * bv[(ib*k+q)*n+j]
						}
						want[(tix*m+i)*n+j] = s
					}
				}
			}
			var num, den float64
			for i := range got {
				num += (got[i] - want[i]) * (got[i] - want[i])
				den += want[i] * want[i]
			}
			rel := math.Sqrt(num / den)
			if !c.dt.IsFloat() {
				want32 := make([]float64, len(want))
				for i, w := range want {
					want32[i] = float64(int32(int64(w)))
				}
				rel = 0
				for i := range got {
					if got[i] != want32[i] {
						rel = 1
					}
				}
			}
			if !(rel <= c.limit) {
				t.Errorf("%s %v x %v: relative error %g over %g", c.name, sh[0], sh[1], rel, c.limit)
			} else {
				t.Logf("%s %v x %v: relative error %.3g", c.name, sh[0], sh[1], rel)
			}
		}
	}
}

func batchOf(s []int) []int {
	if len(s) > 2 {
		return s[:len(s)-2]
	}
	return nil
}

// bindex maps an index of the broadcast batch to one of a batch shape.
func bindex(t int, batch, own []int) int {
	idx, mul := 0, 1
	for d := len(batch) - 1; d >= 0; d-- {
		c := t % batch[d]
		t /= batch[d]
		j := d - (len(batch) - len(own))
		if j < 0 {
			continue
		}
		if own[j] != 1 {
			idx += c * mul
		}
		mul *= own[j]
	}
	return idx
}

// TestAllocator checks that freed blocks are handed out again.
func TestAllocator(t *testing.T) {
	b := newBackend(t)
	x, err := b.Alloc(3 << 20)
	if err != nil {
		t.Fatal(err)
	}
	p := x.(*buffer).ptr
	b.Free(x)
	b.Free(x) // a second free is ignored
	y, err := b.Alloc(3<<20 - 100)
	if err != nil {
		t.Fatal(err)
	}
	if y.(*buffer).ptr != p {
		t.Errorf("a block of the same class was not reused")
	}
	b.Free(y)
	if err := b.Upload(y, []byte{1}); !errors.Is(err, ErrBuffer) {
		t.Errorf("upload to a freed buffer: %v, want ErrBuffer", err)
	}
}

// TestTransfer round-trips more than the staging ring holds.
func TestTransfer(t *testing.T) {
	b := newBackend(t)
	n := stageBytes*stageCount*2 + 12345
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + i>>13)
	}
	buf, err := b.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(buf)
	if err := b.Upload(buf, src); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, n)
	if err := b.Download(dst, buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("round trip changed the data")
	}
}

// TestDownloadMany brings back buffers of many sizes, more than a staging
// buffer holds in all, in one call: each as Download brings it; empty
// destinations are skipped; bad arguments are refused before any copy.
func TestDownloadMany(t *testing.T) {
	b := newBackend(t)
	r := rand.New(rand.NewPCG(7, 8))
	var srcs []kernels.Buffer
	var want, dsts [][]byte
	total := 0
	for total < stageBytes*2+777 {
		n := 1 + r.IntN(64<<10)
		if len(srcs)%50 == 7 {
			n = 0
		}
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		buf, err := b.Alloc(max(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free(buf)
		if n > 0 {
			if err := b.Upload(buf, data); err != nil {
				t.Fatal(err)
			}
		}
		srcs, want, dsts = append(srcs, buf), append(want, data), append(dsts, make([]byte, n))
		total += n
	}
	if err := b.DownloadMany(dsts, srcs); err != nil {
		t.Fatal(err)
	}
	for i := range dsts {
		if !bytes.Equal(dsts[i], want[i]) {
			t.Fatalf("buffer %d of %d (%d bytes) differs", i, len(dsts), len(want[i]))
		}
	}
	if err := b.DownloadMany(dsts[:2], srcs[:1]); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("2 destinations for 1 buffer: %v, want ErrShape", err)
	}
	big, err := b.Alloc(stageBytes + 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(big)
	if err := b.DownloadMany([][]byte{make([]byte, stageBytes+1)}, []kernels.Buffer{big}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("a destination over a staging buffer: %v, want ErrShape", err)
	}
}

// TestInPlace runs ops whose output is one of their inputs.
func TestInPlace(t *testing.T) {
	b := newBackend(t)
	r := rand.New(rand.NewPCG(5, 6))
	xv, yv := randn(r, 300*200), randn(r, 200)
	x := tensor(t, b, kernels.Float32, []int{300, 200}, xv)
	y := tensor(t, b, kernels.Float32, []int{200}, yv)
	if err := b.Exec(&kernels.Op{Name: kernels.OpAdd}, []*kernels.Tensor{x, y}, []*kernels.Tensor{x}); err != nil {
		t.Fatal(err)
	}
	got := values(t, b, x)
	for i, g := range got {
		if w := float64(float32(float32(xv[i]) + float32(yv[i%200]))); g != w {
			t.Fatalf("element %d: %v, want %v", i, g, w)
		}
	}
	// A transpose into its own input goes through scratch memory.
	sq := tensor(t, b, kernels.Float32, []int{64, 64}, xv[:64*64])
	if err := b.Exec(&kernels.Op{Name: kernels.OpPermute, Perm: []int{1, 0}}, []*kernels.Tensor{sq}, []*kernels.Tensor{sq}); err != nil {
		t.Fatal(err)
	}
	got = values(t, b, sq)
	for i := range 64 {
		for j := range 64 {
			if got[i*64+j] != float64(float32(xv[j*64+i])) {
				t.Fatalf("transpose in place: element %d,%d wrong", i, j)
			}
		}
	}
}

// forgetImages empties the in-memory image cache, as a new process has it.
func forgetImages() {
	images.Lock()
	images.m = make(map[string][]byte)
	images.Unlock()
}

// TestDiskCache checks that a second process finds compiled kernels on
// disk instead of compiling them.
func TestDiskCache(t *testing.T) {
	dir := t.TempDir()
	run := func() {
		forgetImages()
		b := newBackend(t, WithCacheDir(dir))
		x := tensor(t, b, kernels.Float64, []int{5}, []float64{1, 2, 3, 4, 5})
		y := empty(t, b, kernels.Float64, 5)
		if err := b.Exec(&kernels.Op{Name: kernels.OpExp}, []*kernels.Tensor{x}, []*kernels.Tensor{y}); err != nil {
			t.Fatal(err)
		}
		if got := values(t, b, y); got[1] != math.Exp(2) && math.Abs(got[1]-math.Exp(2)) > 1e-15 {
			t.Errorf("exp(2) = %v", got[1])
		}
	}
	before := compilations.Load()
	run()
	if compilations.Load() != before+1 {
		t.Fatalf("first run compiled %d kernels, want 1", compilations.Load()-before)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.cubin"))
	if len(files) != 1 {
		t.Fatalf("%d images in the cache directory, want 1", len(files))
	}
	if info, err := os.Stat(files[0]); err != nil || info.Size() == 0 {
		t.Fatalf("cache file: %v %v", info, err)
	}
	run()
	if n := compilations.Load() - before; n != 1 {
		t.Fatalf("second run compiled again (%d compilations)", n)
	}
}

func TestClosed(t *testing.T) {
	b := newBackend(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Alloc(10); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close: %v, want ErrClosed", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
