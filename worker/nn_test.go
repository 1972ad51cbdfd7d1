package worker_test

import (
	"math"
	"strings"
	"testing"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// TestConvFrames runs a small network's ops from a JSON frame: conv2d with
// bias, stride and padding, max_pool2d and cross_entropy, on the CPU
// backend and on one that declines them, so that the host fallback runs
// them; bad attributes and targets come back as errors naming the op.
func TestConvFrames(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*worker.Config)
	}{
		{"cpu", func(*worker.Config) {}},
		{"fallback", func(c *worker.Config) { c.Devices[0].Backend = &partial{Backend: cpu.New()} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := brokertest.Run(t)
			startWorker(t, b, c.edit)
			r := newRaw(t, b, "fabric.ops.cpu-0.conv")
			// x is 1..16 in a 4×4 plane; filter 0 sums a 3×3 window, filter
			// 1 picks its centre; bias 0.5 and -1.
			r.sendJSON(`{"v":1,"ops":[
				{"op":"upload","out":[1],"shape":[1,1,4,4],"values":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]},
				{"op":"upload","out":[2],"shape":[2,1,3,3],"values":[1,1,1,1,1,1,1,1,1, 0,0,0,0,1,0,0,0,0]},
				{"op":"upload","out":[3],"shape":[2],"values":[0.5,-1]},
				{"op":"conv2d","out":[4],"in":[1,2,3],"stride":[2,2],"padding":[1,1]},
				{"op":"max_pool2d","out":[5],"in":[4],"kernel":[2,2]},
				{"op":"reshape","out":[6],"in":[4],"shape":[2,4]},
				{"op":"upload","out":[7],"dtype":"i64","shape":[2],"values":[3,0]},
				{"op":"cross_entropy","out":[8],"in":[6,7],"reduce":"none"},
				{"op":"cross_entropy","out":[9],"in":[6,7]},
				{"op":"read","in":[4],"tag":1},
				{"op":"read","in":[5],"tag":2},
				{"op":"read","in":[8],"tag":3},
				{"op":"read","in":[9],"tag":4}]}`)
			lse := 10 + math.Log(1+math.Exp(-2)+math.Exp(-8)+math.Exp(-10))
			for _, w := range []struct {
				tag  uint64
				want []float64
			}{
				{1, []float64{14.5, 30.5, 57.5, 99.5, 0, 2, 8, 10}},
				{2, []float64{99.5, 10}},
				{3, []float64{0, lse}},
				{4, []float64{lse / 2}},
			} {
				res := r.result()
				if len(res.Errors) > 0 || res.Tag != w.tag || res.Tensor == nil {
					t.Fatalf("result %+v, want the read tagged %d", res, w.tag)
				}
				got := res.Tensor.Values
				if len(got) != len(w.want) {
					t.Fatalf("read %d: values %v, want %v", w.tag, got, w.want)
				}
				for i := range got {
					if math.Abs(got[i]-w.want[i]) > 1e-5*(1+math.Abs(w.want[i])) {
						t.Fatalf("read %d: values %v, want %v", w.tag, got, w.want)
					}
				}
			}

			for _, bad := range []struct {
				name, ops, code, op, mention string
			}{
				{"zero stride", `{"op":"conv2d","out":[10],"in":[1,2],"stride":[0,1]}`, codec.CodeAttr, "conv2d", "stride"},
				{"groups", `{"op":"conv2d","out":[10],"in":[1,2],"groups":2}`, codec.CodeShape, "conv2d", "groups"},
				{"no kernel", `{"op":"max_pool2d","out":[10],"in":[4]}`, codec.CodeAttr, "max_pool2d", "kernel"},
				{"reduce", `{"op":"cross_entropy","out":[10],"in":[6,7],"reduce":"max"}`, codec.CodeAttr, "cross_entropy", "reduce"},
				{"target", `{"op":"upload","out":[10],"dtype":"i32","shape":[2],"values":[1,4]},
					{"op":"cross_entropy","out":[11],"in":[6,10]}`, codec.CodeShape, "cross_entropy", "target 4"},
			} {
				r.sendJSON(`{"v":1,"ops":[` + bad.ops + `,{"op":"sync","tag":9}]}`)
				res := r.result()
				if len(res.Errors) == 0 {
					t.Fatalf("%s: no error reported: %+v", bad.name, res)
				}
				e := res.Errors[0]
				if e.Code != bad.code || e.Op != bad.op || !strings.Contains(e.Message, bad.mention) {
					t.Errorf("%s: got %+v; want code %s, op %q, message mentioning %q", bad.name, e, bad.code, bad.op, bad.mention)
				}
				r.sendJSON(`{"v":1,"ops":[{"op":"free","in":[10]},{"op":"free","in":[11]},{"op":"sync","tag":8}]}`)
				r.result()
			}
		})
	}
}
