package nn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/safetensors"
)

// The dtypes of the two worlds; safetensors' I8, I16 have no kernels twin.
var (
	toFile = map[kernels.DType]safetensors.DType{
		kernels.Float32: safetensors.F32, kernels.Float64: safetensors.F64,
		kernels.Float16: safetensors.F16, kernels.BFloat16: safetensors.BF16,
		kernels.Int32: safetensors.I32, kernels.Int64: safetensors.I64,
		kernels.Uint8: safetensors.U8, kernels.Bool: safetensors.BOOL,
	}
	fromFile = func() map[safetensors.DType]kernels.DType {
		m := map[safetensors.DType]kernels.DType{}
		for k, v := range toFile {
			m[v] = k
		}
		return m
	}()
)

// Save reads params back from the worker and writes them to path as a
// safetensors file, named by Param.Name (PyTorch's state_dict keys for a
// model built of this package's layers) with metadata {"format": "pt"}, so
// that torch's load_state_dict takes it. The file is written beside path
// and renamed over it, so a failed Save leaves any earlier file whole.
//
// Save returns an error wrapping ErrInvalidArgument for a nil, unnamed or
// repeated parameter, the parameter's own error, or the read's or the
// file's error.
func Save(ctx context.Context, path string, params []*Param) (err error) {
	if err := checkNames(params); err != nil {
		return err
	}
	ts := make([]safetensors.Tensor, len(params))
	for i, p := range params {
		if err := p.T.Err(); err != nil {
			return fmt.Errorf("nn: Save %q: %w", p.Name, err)
		}
		if p.T.Freed() {
			return fmt.Errorf("%w: Save %q", ErrFreed, p.Name)
		}
		d, err := p.T.Client().Read(ctx)
		if err != nil {
			return fmt.Errorf("nn: Save %q: %w", p.Name, err)
		}
		ts[i] = safetensors.Tensor{Name: p.Name, DType: toFile[p.T.DType()], Shape: p.T.Shape(), Data: d.Bytes}
	}

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("nn: Save: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := safetensors.Encode(f, ts, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("nn: Save %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("nn: Save %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("nn: Save %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("nn: Save: %w", err)
	}
	return nil
}

// ErrLoad: a file that Load cannot apply to the parameters (a name missing
// or unexpected, a dtype or shape that differs).
var ErrLoad = errors.New("nn: file does not match the parameters")

// Load reads the safetensors file at path (written by Save, by PyTorch's
// safetensors, or by any writer of the format) and replaces every
// parameter's tensor with the file's tensor of the same name, uploaded to
// the parameter's session; the old tensors and their gradients are freed.
// As PyTorch's strict load_state_dict, the file must hold exactly the
// parameters' names, each with the parameter's dtype and shape.
//
// On any error (a malformed file: an error wrapping the safetensors
// sentinels; a mismatch: ErrLoad; a failed upload) no parameter is
// changed.
func Load(ctx context.Context, path string, params []*Param) error {
	if err := checkNames(params); err != nil {
		return err
	}
	for _, p := range params {
		if err := p.T.Err(); err != nil {
			return fmt.Errorf("nn: Load %q: %w", p.Name, err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("nn: Load: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("nn: Load: %w", err)
	}
	file, err := safetensors.Read(f, safetensors.WithMaxDataSize(st.Size()))
	if err != nil {
		return fmt.Errorf("nn: Load %s: %w", path, err)
	}

	want := make(map[string]*Param, len(params))
	for _, p := range params {
		want[p.Name] = p
	}
	var unexpected []string
	for _, t := range file.Tensors {
		if want[t.Name] == nil {
			unexpected = append(unexpected, t.Name)
		}
	}
	if len(unexpected) > 0 {
		slices.Sort(unexpected)
		return fmt.Errorf("%w: %s holds tensors no parameter names: %s", ErrLoad, path, quoteList(unexpected))
	}
	found := make([]safetensors.Tensor, len(params))
	for i, p := range params {
		t, ok := file.Lookup(p.Name)
		if !ok {
			return fmt.Errorf("%w: %s has no tensor %q", ErrLoad, path, p.Name)
		}
		if dt, ok := fromFile[t.DType]; !ok || dt != p.T.DType() || !slices.Equal(t.Shape, p.T.Shape()) {
			return fmt.Errorf("%w: %s holds %q as %s%v, the parameter is %v", ErrLoad, path, p.Name, t.DType, t.Shape, p.T)
		}
		found[i] = t
	}

	fresh := make([]*Tensor, 0, len(params))
	for i, p := range params {
		t, err := Upload(ctx, p.T.Session(), p.T.DType(), found[i].Shape, found[i].Data)
		if err != nil {
			for _, u := range fresh {
				u.Free()
			}
			return fmt.Errorf("nn: Load %q: %w", p.Name, err)
		}
		fresh = append(fresh, t)
	}
	for i, p := range params {
		old := p.T
		if old.RequiresGrad() {
			fresh[i].RequireGrad()
		}
		if g := old.Grad(); g != nil {
			g.Free()
			old.SetGrad(nil)
		}
		p.T = fresh[i]
		old.Free()
	}
	return nil
}

func checkNames(params []*Param) error {
	seen := make(map[string]bool, len(params))
	for i, p := range params {
		switch {
		case p == nil || p.T == nil:
			return fmt.Errorf("%w: parameter %d is nil", ErrInvalidArgument, i)
		case p.Name == "":
			return fmt.Errorf("%w: parameter %d has no name", ErrInvalidArgument, i)
		case seen[p.Name]:
			return fmt.Errorf("%w: two parameters named %q", ErrInvalidArgument, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

func quoteList(names []string) string {
	const show = 5
	q := make([]string, 0, show)
	for _, n := range names[:min(len(names), show)] {
		q = append(q, fmt.Sprintf("%q", n))
	}
	s := strings.Join(q, ", ")
	if len(names) > show {
		s += fmt.Sprintf(" and %d more", len(names)-show)
	}
	return s
}
