package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

// ckptView reads what FABRIC_CTRL and FABRIC_CKPT hold of cpu-0's
// checkpoints.
type ckptView struct {
	t   *testing.T
	kv  jetstream.KeyValue
	obj jetstream.ObjectStore
}

func newCkptView(t *testing.T, nc *nats.Conn) *ckptView {
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	obj, err := js.ObjectStore(ctx, "FABRIC_CKPT")
	if err != nil {
		t.Fatal(err)
	}
	return &ckptView{t: t, kv: kv, obj: obj}
}

// seq is the sequence of the committed checkpoint (0: none).
func (v *ckptView) seq() uint64 {
	e, err := v.kv.Get(context.Background(), subjects.CheckpointKey("cpu-0"))
	if err != nil {
		return 0
	}
	var ref struct {
		Seq uint64 `json:"seq"`
	}
	_ = json.Unmarshal(e.Value(), &ref)
	return ref.Seq
}

// tensors lists the tensor objects of cpu-0's checkpoints.
func (v *ckptView) tensors() []string {
	l, err := v.obj.List(context.Background())
	if err != nil {
		return nil
	}
	var names []string
	for _, o := range l {
		if strings.HasPrefix(o.Name, "ckpt-cpu-0-t-") && !o.Deleted {
			names = append(names, o.Name)
		}
	}
	return names
}

// TestCheckpointsAreIncremental: a large tensor is written to the
// checkpoint bucket once, by its digest, and deleted once no committed
// checkpoint names it; another worker restores the device from those
// objects with the same bits.
func TestCheckpointsAreIncremental(t *testing.T) {
	b := brokertest.Run(t)
	fast := func(c *worker.Config) {
		c.CheckpointInterval = 0
		c.ID = "first"
	}
	w := startWorker(t, b, fast)
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()
	r := newRaw(t, b, "fabric.ops.cpu-0.inc")
	v := newCkptView(t, r.nc)
	const n = 1 << 18 // f32: 1 MiB a tensor
	// commit asks for a checkpoint after ops and waits until it is there
	// and counted.
	commits := 0.0
	commit := func(ops string, want int) {
		t.Helper()
		before := v.seq()
		commits++
		r.sendJSON(`{"v":1,"ops":[` + ops + `{"op":"checkpoint"},{"op":"sync","tag":1}]}`)
		if res := r.result(); len(res.Errors) > 0 {
			t.Fatal(res.Errors)
		}
		checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			if s := v.seq(); s == before {
				return fmt.Errorf("checkpoint still at sequence %d", s)
			}
			if got := v.tensors(); len(got) != want {
				return fmt.Errorf("tensor objects %v, want %d", got, want)
			}
			if n := scrape(t, srv.URL)[`jetfabric_device_checkpoints_total{device="cpu-0"}`]; n != commits {
				return fmt.Errorf("%v checkpoints counted, want %v", n, commits)
			}
			return nil
		})
	}
	lastBytes := func() float64 {
		return scrape(t, srv.URL)[`jetfabric_device_checkpoint_bytes{device="cpu-0"}`]
	}
	commit(fmt.Sprintf(`{"op":"arange","out":[1],"stop":%d,"dtype":"f32"},{"op":"full","out":[9],"shape":[3],"value":7},{"op":"full","out":[8],"shape":[0]},`, n), 1)
	if got := lastBytes(); got < 4*n {
		t.Fatalf("first checkpoint wrote %v bytes, want at least %d", got, 4*n)
	}
	commit(`{"op":"neg","out":[2],"in":[1]},`, 2)
	if got := lastBytes(); got < 4*n || got > 4*n+64<<10 {
		t.Fatalf("second checkpoint wrote %v bytes, want the new tensor's %d and a manifest", got, 4*n)
	}
	// Nothing new: nothing large written again.
	commit(`{"op":"full","out":[3],"shape":[2],"value":1},`, 2)
	if got := lastBytes(); got > 64<<10 {
		t.Fatalf("a checkpoint with no new large tensor wrote %v bytes", got)
	}
	// A tensor no checkpoint names any more is deleted.
	commit(`{"op":"free","in":[1]},`, 1)

	// Another worker restores the device from the objects, bit for bit,
	// and deletes what a worker that died while writing left.
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	stray := "ckpt-cpu-0-t-" + strings.Repeat("ab", 32)
	if _, err := v.obj.PutBytes(context.Background(), stray, []byte("left over")); err != nil {
		t.Fatal(err)
	}
	if _, err := v.obj.PutBytes(context.Background(), "ckpt-cpu-0-2", []byte("left over")); err != nil {
		t.Fatal(err)
	}
	startWorker(t, b, func(c *worker.Config) { c.CheckpointInterval = 0; c.ID = "second" })
	r.sendJSON(fmt.Sprintf(`{"v":1,"ops":[{"op":"arange","out":[4],"stop":%d,"dtype":"f32"},{"op":"add","out":[5],"in":[2,4]},
		{"op":"abs","out":[6],"in":[5]},{"op":"sum","out":[7],"in":[6]},{"op":"read","in":[7],"tag":2},{"op":"read","in":[9],"tag":3},{"op":"read","in":[1],"tag":4},{"op":"read","in":[8],"tag":5}]}`, n))
	if res := r.resultWithin(20 * time.Second); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 0 {
		t.Fatalf("restored tensor 2 is not -arange: %+v", res)
	}
	if res := r.result(); res.Tensor == nil || res.Tensor.Values[2] != 7 {
		t.Fatalf("restored inline tensor: %+v", res)
	}
	if res := r.result(); len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeUnknownID {
		t.Fatalf("freed tensor after the restore: %+v", res)
	}
	if res := r.result(); len(res.Errors) > 0 || res.Tensor == nil || len(res.Tensor.Shape) != 1 || res.Tensor.Shape[0] != 0 {
		t.Fatalf("restored empty tensor: %+v", res)
	}
	r.sendJSON(`{"v":1,"ops":[{"op":"checkpoint"}]}`)
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		for _, name := range []string{stray, "ckpt-cpu-0-2"} {
			if _, err := v.obj.GetInfo(context.Background(), name); err == nil {
				return fmt.Errorf("%s is still there", name)
			}
		}
		return nil
	})
}
