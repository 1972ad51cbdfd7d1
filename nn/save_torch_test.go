package nn_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/safetensors"
)

// ltTorchPython finds a Python with torch and numpy, or skips t.
func ltTorchPython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if path, err := exec.LookPath(py); err == nil && exec.Command(path, "-c", "import torch, numpy").Run() == nil {
			return path
		}
	}
	t.Skip("no python3 with torch and numpy")
	return ""
}

// TestTorchLoadsSave saves models with nn.Save, has PyTorch read the file
// by hand (no safetensors package), load it with a strict load_state_dict
// into the same torch.nn.Sequential, and run the input jetfabric ran: the
// outputs must agree.
func TestTorchLoadsSave(t *testing.T) {
	py := ltTorchPython(t)
	s := ltNewSession(t)
	s.Seed(9)
	must := func(l nn.Layer, err error) nn.Layer {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	tests := []struct {
		name  string
		needs []string
		model func() nn.Layer
		in    []int
		spec  string
	}{{
		name: "MLP",
		model: func() nn.Layer {
			return nn.NewSequential(must(nn.NewLinear(s, 6, 5)), nn.GELU{}, must(nn.NewLayerNorm(s, []int{5}, 0)), nn.SiLU{}, must(nn.NewLinear(s, 5, 3)))
		},
		in:   []int{4, 6},
		spec: "linear:6:5,gelu,layernorm:5,silu,linear:5:3",
	}, {
		name:  "CNN",
		needs: []string{"conv2d", "max_pool2d"},
		model: func() nn.Layer {
			return nn.NewSequential(
				must(nn.NewConv2d(s, 2, 4, [2]int{3, 3}, nn.Conv2dOpts{Padding: [2]int{1, 1}})),
				nn.ReLU{},
				nn.NewMaxPool2d(nn.PoolOpts{Kernel: [2]int{2, 2}}),
				nn.NewFlatten(),
				must(nn.NewLinear(s, 4*3*3, 3)),
			)
		},
		in:   []int{2, 2, 6, 6},
		spec: "conv:2:4:3:1:1,relu,maxpool:2,flatten,linear:36:3",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, op := range tt.needs {
				ltNeedOp(t, s, op)
			}
			dir := t.TempDir()
			model := tt.model()
			xv := ltRandoms(5, kernels.Numel(tt.in))
			x := ltFromValues(t, s, kernels.Float32, tt.in, xv)
			y, err := model.Forward(x)
			if err != nil {
				t.Fatal(err)
			}
			modelFile := filepath.Join(dir, "model.safetensors")
			if err := nn.Save(context.Background(), modelFile, model.Params()); err != nil {
				t.Fatal(err)
			}
			ioFile := filepath.Join(dir, "io.safetensors")
			ltWriteF32(t, ioFile, map[string]*nn.Tensor{"x": x, "y": y})
			out, err := exec.Command(py, filepath.Join("testdata", "torch_check.py"), modelFile, ioFile, tt.spec).CombinedOutput()
			t.Logf("%s", out)
			if err != nil {
				t.Fatalf("torch_check.py: %v", err)
			}
		})
	}
}

// ltWriteF32 writes f32 tensors read back from the worker to a safetensors
// file.
func ltWriteF32(t *testing.T, path string, ts map[string]*nn.Tensor) {
	t.Helper()
	var list []safetensors.Tensor
	for name, x := range ts {
		v := ltValues(t, x)
		b := make([]byte, 0, 4*len(v))
		for _, f := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(f)))
		}
		list = append(list, safetensors.Tensor{Name: name, DType: safetensors.F32, Shape: x.Shape(), Data: b})
	}
	var buf bytes.Buffer
	if err := safetensors.Encode(&buf, list, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
