package nn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/safetensors"
)

// ltMLP is Sequential(Linear(6, 5), GELU, LayerNorm(5), Linear(5, 3)).
func ltMLP(t testing.TB, s *client.Session) *nn.Sequential {
	t.Helper()
	l1, err := nn.NewLinear(s, 6, 5)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := nn.NewLayerNorm(s, []int{5}, 0)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := nn.NewLinear(s, 5, 3)
	if err != nil {
		t.Fatal(err)
	}
	return nn.NewSequential(l1, nn.GELU{}, ln, l2)
}

func ltParamValues(t testing.TB, ps []*nn.Param) map[string][]float64 {
	t.Helper()
	m := map[string][]float64{}
	for _, p := range ps {
		m[p.Name] = ltValues(t, p.T)
	}
	return m
}

func TestSaveLoad(t *testing.T) {
	c, _ := ltLayerFabric(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "mlp.safetensors")

	s1 := ltOpenSession(t, c)
	s1.Seed(1)
	src := ltMLP(t, s1)
	if err := nn.Save(ctx, path, src.Params()); err != nil {
		t.Fatal(err)
	}
	want := ltParamValues(t, src.Params())

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" {
		t.Errorf("metadata %v, want format pt", f.Metadata)
	}
	var names []string
	for _, x := range f.Tensors {
		names = append(names, x.Name)
		p := slices.IndexFunc(src.Params(), func(p *nn.Param) bool { return p.Name == x.Name })
		if p < 0 {
			t.Fatalf("file holds %q, which no parameter is", x.Name)
		}
		if x.DType != safetensors.F32 || !slices.Equal(x.Shape, src.Params()[p].T.Shape()) {
			t.Errorf("%q saved as %s%v", x.Name, x.DType, x.Shape)
		}
		for i, v := range want[x.Name] {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(x.Data[4*i:])); float64(got) != v {
				t.Fatalf("%q[%d] saved as %v, want %v", x.Name, i, got, v)
			}
		}
	}
	slices.Sort(names)
	if wantNames := []string{"0.bias", "0.weight", "2.bias", "2.weight", "3.bias", "3.weight"}; !slices.Equal(names, wantNames) {
		t.Fatalf("file holds %q, want %q", names, wantNames)
	}

	// Another session, another seed: Load makes it the saved model.
	s2 := ltOpenSession(t, c)
	s2.Seed(2)
	dst := ltMLP(t, s2)
	olds := make([]*nn.Tensor, 0)
	for _, p := range dst.Params() {
		p.T.SetGrad(nn.Zeros(s2, p.T.DType(), p.T.Shape()))
		olds = append(olds, p.T)
	}
	if err := nn.Load(ctx, path, dst.Params()); err != nil {
		t.Fatal(err)
	}
	for i, p := range dst.Params() {
		if !olds[i].Freed() || p.T.Session() != s2 || !p.T.RequiresGrad() || p.T.Grad() != nil {
			t.Fatalf("%q: after Load the old tensor is freed %v, the new one requires grad %v and has grad %v", p.Name, olds[i].Freed(), p.T.RequiresGrad(), p.T.Grad())
		}
	}
	got := ltParamValues(t, dst.Params())
	for name, v := range want {
		if !slices.Equal(got[name], v) {
			t.Fatalf("%q loaded as %v, want %v", name, got[name], v)
		}
	}
	x1 := ltFromValues(t, s1, kernels.Float32, []int{2, 6}, ltRandoms(3, 12))
	x2 := ltFromValues(t, s2, kernels.Float32, []int{2, 6}, ltRandoms(3, 12))
	y1, err := src.Forward(x1)
	if err != nil {
		t.Fatal(err)
	}
	y2, err := dst.Forward(x2)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := ltValues(t, y1), ltValues(t, y2); !slices.Equal(a, b) {
		t.Fatalf("the loaded model gives %v, the saved one %v", b, a)
	}
}

// TestLoadBadFile loads files that do not fit: each fails with a clear
// error and leaves the parameters as they were.
func TestLoadBadFile(t *testing.T) {
	s := ltNewSession(t)
	ctx := context.Background()
	dir := t.TempDir()
	model := ltMLP(t, s)
	good := filepath.Join(dir, "good.safetensors")
	if err := nn.Save(ctx, good, model.Params()); err != nil {
		t.Fatal(err)
	}
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Decode(goodBytes)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := func(edit func([]safetensors.Tensor) []safetensors.Tensor) []byte {
		ts := edit(slices.Clone(f.Tensors))
		var buf bytes.Buffer
		if err := safetensors.Encode(&buf, ts, nil); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	without := func(name string) func([]safetensors.Tensor) []safetensors.Tensor {
		return func(ts []safetensors.Tensor) []safetensors.Tensor {
			return slices.DeleteFunc(ts, func(x safetensors.Tensor) bool { return x.Name == name })
		}
	}
	tests := []struct {
		name string
		file []byte // nil: no file at all
		want error
		msg  string
	}{
		{"no file", nil, os.ErrNotExist, ""},
		{"empty file", []byte{}, safetensors.ErrTruncated, ""},
		{"truncated", goodBytes[:len(goodBytes)-1], safetensors.ErrTruncated, ""},
		{"not safetensors", []byte("PK\x03\x04 a zip file, not a model"), safetensors.ErrHeaderTooLarge, ""},
		{"missing tensor", rewrite(without("3.bias")), nn.ErrLoad, `no tensor "3.bias"`},
		{"unexpected tensor", rewrite(func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.Tensor{Name: "4.weight", DType: safetensors.F32, Shape: []int{1}, Data: make([]byte, 4)})
		}), nn.ErrLoad, `"4.weight"`},
		{"wrong shape", rewrite(func(ts []safetensors.Tensor) []safetensors.Tensor {
			i := slices.IndexFunc(ts, func(x safetensors.Tensor) bool { return x.Name == "0.weight" })
			ts[i].Shape = []int{6, 5}
			return ts
		}), nn.ErrLoad, `"0.weight" as F32[6 5], the parameter is f32[5 6]`},
		{"wrong dtype", rewrite(func(ts []safetensors.Tensor) []safetensors.Tensor {
			i := slices.IndexFunc(ts, func(x safetensors.Tensor) bool { return x.Name == "3.bias" })
			ts[i] = safetensors.Tensor{Name: "3.bias", DType: safetensors.F64, Shape: []int{3}, Data: make([]byte, 24)}
			return ts
		}), nn.ErrLoad, `"3.bias" as F64[3]`},
		{"dtype without a twin", rewrite(func(ts []safetensors.Tensor) []safetensors.Tensor {
			i := slices.IndexFunc(ts, func(x safetensors.Tensor) bool { return x.Name == "3.bias" })
			ts[i] = safetensors.Tensor{Name: "3.bias", DType: safetensors.I16, Shape: []int{3}, Data: make([]byte, 6)}
			return ts
		}), nn.ErrLoad, `I16`},
	}
	before := ltParamValues(t, model.Params())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, "missing.safetensors")
			if tt.file != nil {
				path = filepath.Join(dir, "bad.safetensors")
				if err := os.WriteFile(path, tt.file, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			tensors := make([]*nn.Tensor, 0)
			for _, p := range model.Params() {
				tensors = append(tensors, p.T)
			}
			err := nn.Load(ctx, path, model.Params())
			if !errors.Is(err, tt.want) {
				t.Fatalf("Load: %v, want %v", err, tt.want)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tt.msg)) {
				t.Errorf("Load: %q does not say %q", err, tt.msg)
			}
			for i, p := range model.Params() {
				if p.T != tensors[i] || p.T.Freed() {
					t.Fatalf("a failed Load changed %q", p.Name)
				}
			}
		})
	}
	if after := ltParamValues(t, model.Params()); !equalMaps(before, after) {
		t.Fatalf("parameters changed by failed loads")
	}
}

func equalMaps(a, b map[string][]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestSaveErrors(t *testing.T) {
	s := ltNewSession(t)
	ctx := context.Background()
	dir := t.TempDir()
	w := &nn.Param{Name: "w", T: nn.Zeros(s, kernels.Float32, []int{2})}
	tests := []struct {
		name   string
		path   string
		params []*nn.Param
		want   error
	}{
		{"repeated name", filepath.Join(dir, "a"), []*nn.Param{w, {Name: "w", T: w.T}}, nn.ErrInvalidArgument},
		{"no name", filepath.Join(dir, "a"), []*nn.Param{{T: w.T}}, nn.ErrInvalidArgument},
		{"nil", filepath.Join(dir, "a"), []*nn.Param{nil}, nn.ErrInvalidArgument},
		{"no directory", filepath.Join(dir, "none", "a"), []*nn.Param{w}, os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := nn.Save(ctx, tt.path, tt.params); !errors.Is(err, tt.want) {
				t.Fatalf("Save: %v, want %v", err, tt.want)
			}
		})
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 0 {
		t.Fatalf("failed saves left %v (%v)", entries, err)
	}
}

// TestSaveLoadDTypes round-trips parameters of every float dtype and an
// integer one, bit for bit.
func TestSaveLoadDTypes(t *testing.T) {
	s := ltNewSession(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "dtypes.safetensors")
	vals := []float64{0.5, -2, 1e-3, 3}
	var params []*nn.Param
	for _, dt := range []kernels.DType{kernels.Float32, kernels.Float64, kernels.Float16, kernels.BFloat16, kernels.Int64} {
		params = append(params, &nn.Param{Name: "p." + dt.String(), T: ltFromValues(t, s, dt, []int{2, 2}, vals)})
	}
	if err := nn.Save(ctx, path, params); err != nil {
		t.Fatal(err)
	}
	want := ltParamValues(t, params)
	for _, p := range params {
		p.T = nn.Zeros(s, p.T.DType(), p.T.Shape())
	}
	if err := nn.Load(ctx, path, params); err != nil {
		t.Fatal(err)
	}
	if got := ltParamValues(t, params); !equalMaps(got, want) {
		t.Fatalf("loaded %v, want %v", got, want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var dts []safetensors.DType
	for _, x := range f.Tensors {
		dts = append(dts, x.DType)
	}
	if w := []safetensors.DType{safetensors.I64, safetensors.F64, safetensors.F32, safetensors.BF16, safetensors.F16}; !slices.Equal(dts, w) {
		t.Errorf("dtypes in file order %v, want %v", dts, w)
	}
}
