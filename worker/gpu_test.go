//go:build cgo && linux

package worker_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/kernels/cuda"
	"github.com/jetfabric/jetfabric/worker"
)

// openGPU opens CUDA device 0, or skips without a driver.
func openGPU(t *testing.T) *cuda.Backend {
	t.Helper()
	g, err := cuda.New(0, cuda.WithCacheDir(t.TempDir()))
	if errors.Is(err, cuda.ErrNoGPU) || errors.Is(err, cuda.ErrNoCompiler) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// The frames of TestFusion and an 8-op chain, a matmul and reductions,
// on cpu-0 and on a real GPU worker through the broker: the same errors,
// values within float32 rounding, and fused groups counted.
func TestGPUFabric(t *testing.T) {
	g := openGPU(t)
	b := brokertest.Run(t)
	w := startWorker(t, b, func(c *worker.Config) {
		d := worker.Device{Name: "gpu-0", Kind: "gpu", Backend: g}
		if n, err := worker.OpenNVML(); err == nil {
			t.Cleanup(func() { n.Close() })
			d = n.Device(0, g)
			t.Logf("gpu-0: %+v", n.GPUs()[0])
		} else {
			t.Logf("no NVML: %v", err)
		}
		c.Devices = []worker.Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}, d}
	})
	plain := newRaw(t, b, "fabric.ops.cpu-0.g")
	gpu := newRaw(t, b, "fabric.ops.gpu-0.g")
	frames := append(slices.Clone(fusionFrames),
		// The bench's 8-op chain over 1M values, freed intermediates, then
		// its max.
		`{"v":1,"ops":[
		{"op":"normal","out":[20],"dtype":"f32","shape":[1048576],"std":1},
		{"op":"full","out":[21],"dtype":"f32","shape":[],"value":0.5},
		{"op":"mul","out":[22],"in":[20,21]},
		{"op":"add","out":[23],"in":[22,20]},
		{"op":"relu","out":[24],"in":[23]},
		{"op":"sub","out":[25],"in":[24,21]},
		{"op":"neg","out":[26],"in":[25]},
		{"op":"mul","out":[27],"in":[26,26]},
		{"op":"add","out":[28],"in":[27,21]},
		{"op":"tanh","out":[29],"in":[28]},
		{"op":"free","in":[22,23,24,25,26,27,28]},
		{"op":"sum","out":[30],"in":[29]},
		{"op":"read","in":[30],"tag":6}]}`,
		`{"v":1,"ops":[
		{"op":"uniform","out":[40],"dtype":"f32","shape":[64,48]},
		{"op":"uniform","out":[41],"dtype":"f32","shape":[48,32]},
		{"op":"matmul","out":[42],"in":[40,41]},
		{"op":"mul","out":[43],"in":[42,42]},
		{"op":"sqrt","out":[44],"in":[43]},
		{"op":"max","out":[45],"in":[44],"axes":[0]},
		{"op":"read","in":[45],"tag":7}]}`,
	)
	for i, fr := range frames {
		plain.sendJSON(fr)
		gpu.sendJSON(fr)
		want, got := plain.result(), gpu.result()
		if err := closeResult(want, got, 1e-5); err != nil {
			t.Errorf("frame %d: %v\ncpu %s\ngpu %s", i, err, describe(want), describe(got))
		}
	}
	// Transfers both ways between the GPU and the CPU, 8 MiB each: the
	// GPU's tensor is read into a host staging buffer and uploaded.
	const toGPU, toCPU = "0123456789abcdef0123456789abcde0", "0123456789abcdef0123456789abcde1"
	gpu.sendJSON(`{"v":1,"ops":[
		{"op":"full","out":[60],"dtype":"f32","shape":[2097152],"value":1.5},
		{"op":"expose","in":[60],"transfer":"` + toCPU + `"},
		{"op":"import","out":[61],"transfer":"` + toGPU + `","dtype":"f32","shape":[2097152]},
		{"op":"sum","out":[62],"in":[61]},
		{"op":"read","in":[62],"tag":8}]}`)
	plain.sendJSON(`{"v":1,"ops":[
		{"op":"full","out":[60],"dtype":"f32","shape":[2097152],"value":2.5},
		{"op":"expose","in":[60],"transfer":"` + toGPU + `"},
		{"op":"import","out":[61],"transfer":"` + toCPU + `"},
		{"op":"sum","out":[62],"in":[61]},
		{"op":"read","in":[62],"tag":8}]}`)
	for name, c := range map[string]struct {
		r    *rawSession
		want float64
	}{"gpu-0 from cpu-0": {gpu, 2.5 * 2097152}, "cpu-0 from gpu-0": {plain, 1.5 * 2097152}} {
		res := c.r.result()
		if len(res.Errors) > 0 || res.Tensor == nil || len(res.Tensor.Values) != 1 || res.Tensor.Values[0] != c.want {
			t.Errorf("%s: %s, want %v", name, describe(res), c.want)
		}
	}

	var m bytes.Buffer
	if err := w.WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.String(), `jetfabric_device_fused_groups_total{device="gpu-0"} `) ||
		strings.Contains(m.String(), `jetfabric_device_fused_groups_total{device="gpu-0"} 0`) {
		t.Errorf("no fused groups on gpu-0:\n%s", grep(m.String(), "fused"))
	}
	t.Log(grep(m.String(), "fused"))
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// closeResult compares two results: the same errors, and f32 tensors
// equal within rel (relative to the largest magnitude), others bit for bit.
func closeResult(a, b codec.Result, rel float64) error {
	if a.Tag != b.Tag || len(a.Errors) != len(b.Errors) || (a.Tensor == nil) != (b.Tensor == nil) {
		return fmt.Errorf("results differ")
	}
	for i := range a.Errors {
		if a.Errors[i].Code != b.Errors[i].Code || a.Errors[i].Index != b.Errors[i].Index {
			return fmt.Errorf("error %d differs", i)
		}
	}
	if a.Tensor == nil {
		return nil
	}
	x, y := a.Tensor, b.Tensor
	if x.DType != y.DType || fmt.Sprint(x.Shape) != fmt.Sprint(y.Shape) || len(x.Data) != len(y.Data) {
		return fmt.Errorf("tensors differ in meta")
	}
	if x.DType != "f32" {
		if !bytes.Equal(x.Data, y.Data) {
			return fmt.Errorf("%s data differs", x.DType)
		}
		return nil
	}
	scale := 0.0
	for i := 0; i < len(x.Data); i += 4 {
		scale = max(scale, math.Abs(float64(math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:])))))
	}
	for i := 0; i < len(x.Data); i += 4 {
		u := float64(math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:])))
		v := float64(math.Float32frombits(binary.LittleEndian.Uint32(y.Data[i:])))
		if math.Abs(u-v) > rel*max(scale, 1) {
			return fmt.Errorf("element %d: %v vs %v", i/4, u, v)
		}
	}
	return nil
}

// TestGPUPrograms: checkPrograms on a real GPU worker, replays from the
// third on launched as one CUDA graph each, with the bits of the same ops
// sent one by one.
func TestGPUPrograms(t *testing.T) {
	g := openGPU(t)
	b := brokertest.Run(t)
	w := startWorker(t, b, func(c *worker.Config) {
		c.Devices = []worker.Device{{Name: "gpu-0", Kind: "gpu", Backend: g}}
	})
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	checkPrograms(t, w, c, "gpu-0", false)
}

// TestGPUCheckpoint: a GPU session holding tensors of 32 and 12 MiB and
// hundreds of small ones is checkpointed, its worker stopped, and another GPU worker
// restores it: the same bits read back, and the next op runs on them.
func TestGPUCheckpoint(t *testing.T) {
	b := brokertest.Run(t)
	gpu := func(id string) func(c *worker.Config) {
		return func(c *worker.Config) {
			c.ID = id
			c.CheckpointInterval = 0
			c.Devices = []worker.Device{{Name: "gpu-0", Kind: "gpu", Backend: openGPU(t)}}
		}
	}
	w := startWorker(t, b, gpu("first"))
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "gpu-0")
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 12<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	up, err := s.Upload(ctx, "u8", []int{len(data)}, data)
	if err != nil {
		t.Fatal(err)
	}
	held := []*client.Tensor{s.Uniform([]int{8 << 20}, -1, 1), up, s.Uniform([]int{3, 5}, -1, 1)}
	// Small tensors, more than a staging buffer holds in all: the
	// checkpoint's writer downloads them in one call.
	for i := range 200 {
		n := 40<<10 + i*97
		u, err := s.Upload(ctx, "u8", []int{n}, data[i:i+n])
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, u, s.Uniform([]int{n / 4}, -1, 1))
	}
	before := make([][]byte, len(held))
	for i, x := range held {
		d, err := x.Read(ctx)
		if err != nil {
			t.Fatalf("tensor %d before the checkpoint: %v", i, err)
		}
		before[i] = d.Bytes
	}
	if !bytes.Equal(before[1], data) {
		t.Fatal("the upload read back differs")
	}
	s.Checkpoint()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	waitCheckpoint(t, srv.URL, "gpu-0")
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	startWorker(t, b, gpu("second"))
	for i, x := range held {
		d, err := x.Read(ctx)
		if err != nil {
			t.Fatalf("tensor %d after the takeover: %v", i, err)
		}
		if !bytes.Equal(d.Bytes, before[i]) {
			t.Errorf("tensor %d (%d bytes): restored bits differ", i, len(before[i]))
		}
	}
	// The restored tensors compute: their sum against the host's.
	d, err := held[1].Cast("f64").Sum().Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want float64
	for _, x := range data {
		want += float64(x)
	}
	if len(d.Bytes) != 8 || math.Float64frombits(binary.LittleEndian.Uint64(d.Bytes)) != want {
		t.Errorf("sum of the restored upload %x, want %v", d.Bytes, want)
	}
}
