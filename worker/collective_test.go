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

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// sendSeq publishes a JSON frame and returns its stream sequence.
func (r *rawSession) sendSeq(body string) uint64 {
	r.t.Helper()
	m := nats.NewMsg(r.subject)
	m.Data = []byte(body)
	m.Header.Set(subjects.HeaderReply, r.inbox.Subject)
	m.Header.Set(subjects.HeaderContentType, "application/json")
	ack, err := r.js.PublishMsg(context.Background(), m)
	if err != nil {
		r.t.Fatal(err)
	}
	return ack.Sequence
}

// twoModes starts a worker serving cpu-0, whose collectives run beside the
// device loop, and one serving cpu-1, whose collectives run in it.
func twoModes(t *testing.T) *broker.Broker {
	b := brokertest.Run(t)
	devs := workertest.CPUs(2)
	fast := func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond }
	workertest.Run(t, b, devs[:1], fast, func(c *worker.Config) { c.ID = "async" })
	workertest.Run(t, b, devs[1:], fast, func(c *worker.Config) { c.ID, c.SyncCollectives = "sync", true })
	return b
}

// TestCollectiveErrorIsTheOps: an all_reduce whose peer never joins fails
// after its timeout_ms. Run beside the loop, while the ops after it run,
// its error is reported by the sync after it as the op's own, among the
// frame's other errors in the order of the ops, and a read of its output
// reports it as the cause: all as when it runs in the loop.
func TestCollectiveErrorIsTheOps(t *testing.T) {
	b := twoModes(t)
	var got [2][]codec.Error
	for dev := range 2 {
		r := newRaw(t, b, fmt.Sprintf("fabric.ops.cpu-%d.lonely", dev))
		group := fmt.Sprintf("7%031x", dev)
		seq := r.sendSeq(`{"v":1,"ops":[
			{"op":"full","out":[1],"shape":[4],"value":1},
			{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":0,"size":2,"timeout_ms":300},
			{"op":"full","out":[3],"shape":[4],"value":2},
			{"op":"add","out":[4],"in":[3]},
			{"op":"exp","out":[5],"in":[3]},
			{"op":"sync","tag":1}]}`)
		res := r.resultWithin(30 * time.Second)
		if res.Tag != 1 || len(res.Errors) != 2 {
			t.Fatalf("cpu-%d: sync answered %+v; want the all_reduce's error and the add's", dev, res)
		}
		ar, add := res.Errors[0], res.Errors[1]
		if ar.Seq != seq || ar.Index != 1 || ar.Op != "all_reduce" || ar.Code != codec.CodeUnavailabe || !strings.Contains(ar.Message, "waiting for rank 1") {
			t.Errorf("cpu-%d: first error %+v; want all_reduce's at frame %d, op 1, unavailable, waiting for rank 1", dev, ar, seq)
		}
		if add.Seq != seq || add.Index != 3 || add.Op != "add" || add.Code != codec.CodeArity {
			t.Errorf("cpu-%d: second error %+v; want add's at frame %d, op 3", dev, add, seq)
		}
		// Its output, and what reads it, report it as the cause.
		r.sendJSON(`{"v":1,"ops":[{"op":"neg","out":[6],"in":[2]},{"op":"read","in":[6],"tag":2},{"op":"read","in":[5],"tag":3}]}`)
		for _, tag := range []uint64{2, 3} {
			res := r.resultWithin(30 * time.Second)
			switch {
			case res.Tag != tag:
				t.Fatalf("cpu-%d: answer %+v, want tag %d", dev, res, tag)
			case tag == 2 && (res.Tensor != nil || len(res.Errors) != 1 || res.Errors[0] != ar):
				t.Errorf("cpu-%d: read of what reads the failed output: %+v; want the all_reduce's error %+v", dev, res, ar)
			case tag == 3 && (res.Tensor == nil || len(res.Errors) != 0):
				t.Errorf("cpu-%d: read of an independent op: %+v", dev, res)
			}
		}
		ar.Message = strings.ReplaceAll(ar.Message, group, "G")
		got[dev] = []codec.Error{ar, add}
		got[dev][0].Seq, got[dev][1].Seq = 0, 0
	}
	if fmt.Sprint(got[0]) != fmt.Sprint(got[1]) {
		t.Errorf("beside the loop: %+v\nin the loop: %+v", got[0], got[1])
	}
}

// TestCollectiveBadInput: a collective whose input, ids or attributes are
// wrong fails at once (the sync after it answers before any peer could
// join), with the same error as in the loop.
func TestCollectiveBadInput(t *testing.T) {
	b := twoModes(t)
	const g = `"group":"8123456789abcdef0123456789abcdef"`
	cases := []struct {
		name, ops, code, mention string
	}{
		{"rank past size", `{"op":"all_reduce","out":[2],"in":[1],` + g + `,"rank":2,"size":2}`, codec.CodeAttr, "rank 2 of 2"},
		{"bad group", `{"op":"all_reduce","out":[2],"in":[1],"group":"short","rank":0,"size":2}`, codec.CodeAttr, "group"},
		{"bad reduce", `{"op":"all_reduce","out":[2],"in":[1],` + g + `,"rank":0,"size":2,"reduce":"median"}`, codec.CodeAttr, "median"},
		{"bad algo", `{"op":"all_reduce","out":[2],"in":[1],` + g + `,"rank":0,"size":2,"algo":"ring"}`, codec.CodeAttr, "ring"},
		{"no input", `{"op":"all_reduce","out":[2],` + g + `,"rank":0,"size":2}`, codec.CodeArity, "takes 1 tensor"},
		{"no output", `{"op":"all_reduce","in":[1],` + g + `,"rank":0,"size":2}`, codec.CodeArity, "output ids"},
		{"output taken", `{"op":"all_reduce","out":[1],"in":[1],` + g + `,"rank":0,"size":2}`, codec.CodeDuplicate, "already in use"},
		{"unknown input", `{"op":"all_reduce","out":[2],"in":[99],` + g + `,"rank":0,"size":2}`, codec.CodeUnknownID, "99"},
		{"dtype", `{"op":"cast","out":[3],"in":[1],"dtype":"u8"},{"op":"all_reduce","out":[2],"in":[3],` + g + `,"rank":0,"size":2}`, codec.CodeDType, "collectives reduce"},
		{"reduce_scatter dtype", `{"op":"cast","out":[3],"in":[1],"dtype":"u8"},{"op":"reduce_scatter","out":[2],"in":[3],` + g + `,"rank":0,"size":2}`, codec.CodeDType, "collectives reduce"},
		{"reduce_scatter shape", `{"op":"reduce_scatter","out":[2],"in":[1],` + g + `,"rank":0,"size":3}`, codec.CodeShape, "divide by 3"},
		{"all_gather scalar", `{"op":"full","out":[3],"shape":[]},{"op":"all_gather","out":[2],"in":[3],` + g + `,"rank":0,"size":2}`, codec.CodeShape, "scalar"},
		{"broadcast root", `{"op":"broadcast","out":[2],"in":[1],` + g + `,"rank":0,"size":2,"root":5}`, codec.CodeAttr, "root 5"},
		{"broadcast root without input", `{"op":"broadcast","out":[2],` + g + `,"rank":0,"size":2,"root":0}`, codec.CodeArity, "root takes 1"},
		{"broadcast other with input", `{"op":"broadcast","out":[2],"in":[1],` + g + `,"rank":1,"size":2,"root":0}`, codec.CodeArity, "takes no tensor"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got [2]codec.Error
			for dev := range 2 {
				r := newRaw(t, b, fmt.Sprintf("fabric.ops.cpu-%d.bad%d", dev, i))
				r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[4],"value":1},` + c.ops + `,{"op":"sync","tag":1}]}`)
				// The op's timeout is a minute: an error that waited for
				// a peer would come after it.
				res := r.resultWithin(30 * time.Second)
				if len(res.Errors) != 1 {
					t.Fatalf("cpu-%d: %+v; want one error", dev, res)
				}
				e := res.Errors[0]
				if e.Code != c.code || !strings.Contains(e.Message, c.mention) {
					t.Errorf("cpu-%d: %+v; want code %s, message mentioning %q", dev, e, c.code, c.mention)
				}
				e.Seq = 0
				got[dev] = e
			}
			if got[0] != got[1] {
				t.Errorf("beside the loop %+v, in the loop %+v", got[0], got[1])
			}
		})
	}
	t.Run("failed input", func(t *testing.T) {
		for dev := range 2 {
			r := newRaw(t, b, fmt.Sprintf("fabric.ops.cpu-%d.failedin", dev))
			r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[4]},{"op":"add","out":[3],"in":[1]},
				{"op":"all_reduce","out":[2],"in":[3],` + g + `,"rank":0,"size":2},{"op":"read","in":[2],"tag":1}]}`)
			res := r.resultWithin(30 * time.Second)
			if res.Tensor != nil || len(res.Errors) != 1 || res.Errors[0].Op != "add" || res.Errors[0].Index != 1 {
				t.Errorf("cpu-%d: read of an all_reduce of a failed input: %+v; want the add's error only", dev, res)
			}
		}
	})
}

// takeoverFabric starts a worker serving cpu-0 on a connection that the
// test cuts (the returned one), a standby for cpu-0, and a worker serving
// cpu-1, with leases of 300 ms and no timed checkpoints.
func takeoverFabric(t *testing.T) (*broker.Broker, *nats.Conn) {
	b := brokertest.Run(t)
	fast := func(id string) func(*worker.Config) {
		return func(c *worker.Config) {
			c.ID, c.LeaseTTL, c.CheckpointInterval, c.Heartbeat = id, 300*time.Millisecond, 0, 100*time.Millisecond
		}
	}
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.Devices, cfg.Logf = workertest.CPUs(1), t.Logf
	fast("first")(&cfg)
	first, err := worker.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background()) })
	workertest.Run(t, b, workertest.CPUs(1), fast("standby"))
	devs := workertest.CPUs(2)
	workertest.Run(t, b, devs[1:], fast("peer"))
	return b, nc
}

// ctrlKey returns the control bucket, to look at its keys.
func ctrlKV(t *testing.T, b *broker.Broker) jetstream.KeyValue {
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// joinAndCheck has rank 1, on cpu-1, join group's all_reduce of [10, 20,
// 30, 40] and checks that it gets the sum with rank 0's [1, 2, 3, 4].
func joinAndCheck(t *testing.T, b *broker.Broker, group string) {
	t.Helper()
	peer := newRaw(t, b, "fabric.ops.cpu-1.peer"+group[:4])
	peer.sendJSON(`{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[4],"values":[10,20,30,40]},
		{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":1,"size":2},{"op":"read","in":[2],"tag":1}]}`)
	expectValues(t, "rank 1", peer.resultWithin(30*time.Second), 11, 22, 33, 44)
}

func expectValues(t *testing.T, what string, res codec.Result, want ...float64) {
	t.Helper()
	if len(res.Errors) > 0 || res.Tensor == nil || fmt.Sprint(res.Tensor.Values) != fmt.Sprint(want) {
		t.Fatalf("%s: %+v; want %v", what, res, want)
	}
}

// TestCheckpointWaitsForCollectives: a checkpoint asked for while an
// all_reduce is in flight waits for it, and holds its result: the worker
// that takes the device over from that checkpoint, with the frame of the
// all_reduce purged from the stream, reads the sum.
func TestCheckpointWaitsForCollectives(t *testing.T) {
	b, nc := takeoverFabric(t)
	kv := ctrlKV(t, b)
	group := "9123456789abcdef0123456789abcdef"
	r := newRaw(t, b, "fabric.ops.cpu-0.ckpt")
	seq := r.sendSeq(`{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[4],"values":[1,2,3,4]},
		{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":0,"size":2},{"op":"checkpoint"}]}`)
	// Rank 0's piece is announced: its all_reduce runs.
	poll.Until(t, 30*time.Second, 10*time.Millisecond, func() error {
		_, err := kv.Get(context.Background(), subjects.TransferKey(subjects.CollectiveObject(group, "ar", 0, -1)))
		return err
	})
	joinAndCheck(t, b, group)
	poll.Until(t, 30*time.Second, 10*time.Millisecond, func() error {
		e, err := kv.Get(context.Background(), subjects.CheckpointKey("cpu-0"))
		if err != nil {
			return err
		}
		var ref struct{ Seq uint64 }
		if err := json.Unmarshal(e.Value(), &ref); err != nil || ref.Seq < seq {
			return fmt.Errorf("checkpoint %s, want one at sequence %d or later (%v)", e.Value(), seq, err)
		}
		return nil
	})
	nc.Close() // the first worker is cut off; the standby restores the checkpoint
	r.sendJSON(`{"v":1,"ops":[{"op":"read","in":[2],"tag":1}]}`)
	expectValues(t, "rank 0 after the takeover", r.resultWithin(30*time.Second), 11, 22, 33, 44)
}

// TestTakeoverWithCollectiveInFlight: the worker of rank 0 is cut off while
// its all_reduce waits for rank 1; the standby that takes the device over
// runs the op again, rank 1 joins, and both ranks get the sum.
func TestTakeoverWithCollectiveInFlight(t *testing.T) {
	b, nc := takeoverFabric(t)
	kv := ctrlKV(t, b)
	group := "a123456789abcdef0123456789abcdef"
	r := newRaw(t, b, "fabric.ops.cpu-0.cut")
	r.sendJSON(`{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[4],"values":[1,2,3,4]},
		{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":0,"size":2}]}`)
	poll.Until(t, 30*time.Second, 10*time.Millisecond, func() error {
		_, err := kv.Get(context.Background(), subjects.TransferKey(subjects.CollectiveObject(group, "ar", 0, -1)))
		return err
	})
	nc.Close()
	joinAndCheck(t, b, group)
	r.sendJSON(`{"v":1,"ops":[{"op":"read","in":[2],"tag":1}]}`)
	expectValues(t, "rank 0 after the takeover", r.resultWithin(30*time.Second), 11, 22, 33, 44)
}

// TestCollectiveMemory: while an all_reduce waits for its peer, its output
// is charged to the device and counted in flight; its input and output
// freed meanwhile leave the session's bytes at once and the device's once
// the all_reduce is done, and it moved its pieces' bytes through the
// object store. A failed one gives its output's memory back.
func TestCollectiveMemory(t *testing.T) {
	b := brokertest.Run(t)
	devs := workertest.CPUs(2)
	fast := func(c *worker.Config) { c.Heartbeat, c.CheckpointInterval = 100*time.Millisecond, 0 }
	w := workertest.Run(t, b, devs[:1], fast)
	workertest.Run(t, b, devs[1:], fast)
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()
	dev := `{device="cpu-0"}`
	const big = 1 << 18 // bytes of the all_reduce's tensors
	expect := func(what string, want map[string]float64) {
		t.Helper()
		poll.Until(t, time.Minute, 10*time.Millisecond, func() error {
			m := scrape(t, srv.URL)
			for series, v := range want {
				if m[series] != v {
					return fmt.Errorf("%s: %s = %v, want %v", what, series, m[series], v)
				}
			}
			return nil
		})
	}
	group := "b123456789abcdef0123456789abcdef"
	r := newRaw(t, b, "fabric.ops.cpu-0.mem")
	r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[65536],"value":1},
		{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":0,"size":2}]}`)
	expect("in flight", map[string]float64{
		"jetfabric_device_collectives_in_flight" + dev:                              1,
		"jetfabric_device_tensor_bytes" + dev:                                       2 * big,
		`jetfabric_session_tensor_bytes{device="cpu-0",session="mem"}`:              2 * big,
		`jetfabric_device_bytes_total{device="cpu-0",direction="in",path="object"}`: 0,
	})
	r.sendJSON(`{"v":1,"ops":[{"op":"free","in":[1,2]},{"op":"full","out":[3],"shape":[4]}]}`)
	expect("freed in flight", map[string]float64{
		"jetfabric_device_collectives_in_flight" + dev:                 1,
		"jetfabric_device_tensor_bytes" + dev:                          2*big + 16,
		`jetfabric_session_tensor_bytes{device="cpu-0",session="mem"}`: 16,
	})
	peer := newRaw(t, b, "fabric.ops.cpu-1.mem")
	peer.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[65536],"value":2},
		{"op":"all_reduce","out":[2],"in":[1],"group":"` + group + `","rank":1,"size":2},{"op":"sum","out":[3],"in":[2]},{"op":"read","in":[3],"tag":1}]}`)
	expectValues(t, "rank 1", peer.resultWithin(30*time.Second), 3*65536)
	expect("done", map[string]float64{
		"jetfabric_device_collectives_in_flight" + dev:                               0,
		"jetfabric_device_tensor_bytes" + dev:                                        16,
		`jetfabric_device_bytes_total{device="cpu-0",direction="in",path="object"}`:  big,
		`jetfabric_device_bytes_total{device="cpu-0",direction="out",path="object"}`: big,
	})
	// A rank that never comes: the output's memory comes back with the error.
	r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[4],"shape":[65536]},
		{"op":"all_reduce","out":[5],"in":[4],"group":"c123456789abcdef0123456789abcdef","rank":0,"size":2,"timeout_ms":200},
		{"op":"free","in":[4]},{"op":"sync","tag":2}]}`)
	if res := r.resultWithin(30 * time.Second); len(res.Errors) != 1 || res.Errors[0].Op != "all_reduce" {
		t.Fatalf("sync after a lonely all_reduce: %+v", res)
	}
	expect("failed", map[string]float64{
		"jetfabric_device_collectives_in_flight" + dev:                     0,
		"jetfabric_device_tensor_bytes" + dev:                              16,
		`jetfabric_session_tensor_bytes{device="cpu-0",session="mem"}`:     16,
		`jetfabric_device_errors_total{device="cpu-0",code="unavailable"}`: 1,
	})
	// The lonely all_reduce ran for its 200 ms timeout, and the sync behind
	// it made the loop wait for it.
	m := scrape(t, srv.URL)
	if took := m["jetfabric_device_collective_seconds_total"+dev]; took < 0.2 {
		t.Errorf("jetfabric_device_collective_seconds_total = %v, want at least the 0.2 s timeout", took)
	}
	if waited := m["jetfabric_device_collective_wait_seconds_total"+dev]; waited <= 0 {
		t.Errorf("jetfabric_device_collective_wait_seconds_total = %v after a sync behind a collective in flight", waited)
	}
}
