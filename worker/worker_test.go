package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// startWorker runs a worker serving cpu-0 against b.
func startWorker(t testing.TB, b *broker.Broker, edit ...func(*worker.Config)) *worker.Worker {
	t.Helper()
	fast := func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond }
	return workertest.Run(t, b, workertest.CPUs(1), append([]func(*worker.Config){fast}, edit...)...)
}

// rawSession speaks the wire protocol directly, as any NATS client would.
type rawSession struct {
	t       testing.TB
	nc      *nats.Conn
	js      jetstream.JetStream
	subject string
	inbox   *nats.Subscription
}

func newRaw(t testing.TB, b *broker.Broker, subject string) *rawSession {
	t.Helper()
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	sub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	return &rawSession{t: t, nc: nc, js: js, subject: subject, inbox: sub}
}

// send publishes body with the given content type and returns the
// publish error.
func (r *rawSession) send(contentType string, body []byte) error {
	m := nats.NewMsg(r.subject)
	m.Data = body
	m.Header.Set(subjects.HeaderReply, r.inbox.Subject)
	if contentType != "" {
		m.Header.Set(subjects.HeaderContentType, contentType)
	}
	_, err := r.js.PublishMsg(context.Background(), m)
	return err
}

func (r *rawSession) sendJSON(body string) {
	r.t.Helper()
	if err := r.send("application/json", []byte(body)); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawSession) result() codec.Result {
	r.t.Helper()
	return r.resultWithin(5 * time.Second)
}

func (r *rawSession) resultWithin(wait time.Duration) codec.Result {
	r.t.Helper()
	m, err := r.inbox.NextMsg(wait)
	if err != nil {
		r.t.Fatalf("no reply: %v", err)
	}
	enc, _ := codec.EncodingOf(m.Header.Get(subjects.HeaderContentType))
	var res codec.Result
	if err := codec.Unmarshal(enc, m.Data, &res); err != nil {
		r.t.Fatal(err)
	}
	return res
}

func TestJSONFrames(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b)
	r := newRaw(t, b, "fabric.ops.cpu-0.json1")
	r.sendJSON(`{"v":1,"ops":[
		{"op":"upload","out":[1],"dtype":"f32","shape":[2,2],"values":[1,2,3,4]},
		{"op":"matmul","out":[2],"in":[1,1]},
		{"op":"sum","out":[3],"in":[2],"axes":[0]},
		{"op":"read","in":[3],"tag":5}]}`)
	res := r.result()
	if len(res.Errors) > 0 || res.Tag != 5 || res.Tensor == nil {
		t.Fatalf("result %+v", res)
	}
	// [[1,2],[3,4]]^2 = [[7,10],[15,22]]; column sums 22, 32.
	if got := res.Tensor.Values; len(got) != 2 || got[0] != 22 || got[1] != 32 {
		t.Errorf("values %v, want [22 32]", got)
	}
	if res.Tensor.DType != "f32" || len(res.Tensor.Data) != 8 {
		t.Errorf("tensor %+v", res.Tensor)
	}
}

// TestBadInput sends every kind of bad input. Each gets an error result
// naming the op and the reason, and a second session on the device is
// unaffected throughout.
func TestBadInput(t *testing.T) {
	b := brokertest.Run(t, func(c *broker.Config) { c.Provision.OpsMaxMsgSize = 256 << 10 })
	startWorker(t, b, func(c *worker.Config) { c.Limits.Tensor.MaxElements = 1 << 20 })
	good := newRaw(t, b, "fabric.ops.cpu-0.good")
	good.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[3],"value":2}]}`)

	cases := []struct {
		name, body, contentType string
		code, op, mention       string
	}{
		{"not cbor", "\xff\x00garbage", "", codec.CodeMalformed, "", "cbor"},
		{"not json", "{oops", "application/json", codec.CodeMalformed, "", "json"},
		{"bad content type", "{}", "text/plain", codec.CodeMalformed, "", "text/plain"},
		{"wrong version", `{"v":9,"ops":[]}`, "application/json", codec.CodeVersion, "", "version 9"},
		{"unknown op", `{"v":1,"ops":[{"op":"frobnicate","out":[1]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeUnknownOp, "frobnicate", "frobnicate"},
		{"wrong arity", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"add","out":[2],"in":[1]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeArity, "add", "takes 2"},
		{"no broadcast", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2,3]},{"op":"full","out":[2],"shape":[4]},{"op":"add","out":[3],"in":[1,2]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeShape, "add", "broadcast"},
		{"unknown id", `{"v":1,"ops":[{"op":"exp","out":[2],"in":[99]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeUnknownID, "exp", "99"},
		{"freed id", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"free","in":[1]},{"op":"exp","out":[2],"in":[1]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeUnknownID, "exp", "freed"},
		{"too large", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[4096,4096]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeTooLarge, "full", "limit"},
		{"upload size", `{"v":1,"ops":[{"op":"upload","out":[1],"shape":[3],"data":"AAAA"},{"op":"sync","tag":1}]}`, "application/json", codec.CodeShape, "upload", "needs 12 bytes"},
		{"bad dtype", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2],"dtype":"f128"},{"op":"sync","tag":1}]}`, "application/json", codec.CodeDType, "full", "f128"},
		{"duplicate id", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"full","out":[1],"shape":[2]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeDuplicate, "full", "already in use"},
		{"bad axis", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"sum","out":[2],"in":[1],"axes":[3]},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "sum", "axis 3"},
		{"pieces without nuid", `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[8],"object":"upload-x","pieces":2},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "upload", "without the nuid"},
		{"too many pieces", `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[100],"object":"upload-x","nuid":"x","pieces":65},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "upload", "65 pieces, want 2 to 64"},
		{"one piece", `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"f32","shape":[100],"object":"upload-x","nuid":"x","pieces":1},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "upload", "1 pieces, want 2 to 64"},
		{"pieces over bytes", `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"u8","shape":[3],"object":"upload-x","nuid":"x","pieces":4},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "upload", "4 pieces of 3 bytes"},
		{"piece token too long", `{"v":1,"ops":[{"op":"upload","out":[1],"dtype":"u8","shape":[30],"object":"upload-x","nuid":"` + strings.Repeat("n", 63) + `","pieces":12},{"op":"sync","tag":1}]}`, "application/json", codec.CodeAttr, "upload", "chunk subject token"},
		{"read pieces", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"read","in":[1],"tag":1,"pieces":-1}]}`, "application/json", codec.CodeAttr, "read", "pieces -1"},
		{"read too many pieces", `{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"read","in":[1],"tag":1,"pieces":65}]}`, "application/json", codec.CodeAttr, "read", "pieces 65"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRaw(t, b, "fabric.ops.cpu-0.bad"+strings.Repeat("x", i))
			if err := r.send(c.contentType, []byte(c.body)); err != nil {
				t.Fatal(err)
			}
			res := r.result()
			if len(res.Errors) == 0 {
				t.Fatalf("no error reported: %+v", res)
			}
			e := res.Errors[0]
			if e.Code != c.code || e.Op != c.op || !strings.Contains(strings.ToLower(e.Message), strings.ToLower(c.mention)) {
				t.Errorf("got %+v; want code %s, op %q, message mentioning %q", e, c.code, c.op, c.mention)
			}
			// The other session still works.
			good.sendJSON(`{"v":1,"ops":[{"op":"read","in":[1],"tag":2}]}`)
			if g := good.result(); len(g.Errors) > 0 || g.Tensor == nil || g.Tensor.Values[0] != 2 {
				t.Fatalf("good session disturbed: %+v", g)
			}
		})
	}

	t.Run("failed input reports first cause", func(t *testing.T) {
		r := newRaw(t, b, "fabric.ops.cpu-0.chain")
		r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[2]},{"op":"full","out":[2],"shape":[3]},
			{"op":"add","out":[3],"in":[1,2]},{"op":"exp","out":[4],"in":[3]},{"op":"sync","tag":1}]}`)
		res := r.result()
		if len(res.Errors) != 1 || res.Errors[0].Op != "add" || res.Errors[0].Index != 2 {
			t.Fatalf("errors %+v, want one, from add at index 2", res.Errors)
		}
		r.sendJSON(`{"v":1,"ops":[{"op":"read","in":[4],"tag":2}]}`)
		res = r.result()
		if len(res.Errors) != 1 || res.Errors[0].Op != "add" || res.Tensor != nil {
			t.Fatalf("read of a tensor whose input failed: %+v", res)
		}
	})

	t.Run("forbidden session token", func(t *testing.T) {
		r := newRaw(t, b, "fabric.ops.cpu-0.bad!token")
		r.sendJSON(`{"v":1,"ops":[{"op":"sync","tag":1}]}`)
		res := r.result()
		if len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeMalformed || !strings.Contains(res.Errors[0].Message, "forbidden character") {
			t.Fatalf("got %+v", res)
		}
	})

	t.Run("frame over the size limit", func(t *testing.T) {
		r := newRaw(t, b, "fabric.ops.cpu-0.big")
		err := r.send("application/json", []byte(`{"v":1,"ops":[{"op":"upload","out":[1],"data":"`+strings.Repeat("A", 300<<10)+`"}]}`))
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || !strings.Contains(err.Error(), "maximum") {
			t.Fatalf("publishing 300 KiB into a 256 KiB stream: %v", err)
		}
		// Over the server's max_payload, the client library refuses it.
		err = r.nc.Publish("fabric.ops.cpu-0.big", make([]byte, 9<<20))
		if !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("9 MiB publish: %v", err)
		}
	})
}

func TestSessionsAreIsolated(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b)
	a, c := newRaw(t, b, "fabric.ops.cpu-0.alice"), newRaw(t, b, "fabric.ops.cpu-0.carol")
	a.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":7},{"op":"sync","tag":1}]}`)
	a.result()
	// Carol names the same id: it is hers, and she has none.
	c.sendJSON(`{"v":1,"ops":[{"op":"read","in":[1],"tag":1}]}`)
	if res := c.result(); len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeUnknownID || res.Tensor != nil {
		t.Fatalf("carol read alice's tensor: %+v", res)
	}
	c.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":3},{"op":"read","in":[1],"tag":2}]}`)
	if res := c.result(); res.Tensor == nil || res.Tensor.Values[0] != 3 {
		t.Fatalf("carol: %+v", res)
	}
	a.sendJSON(`{"v":1,"ops":[{"op":"read","in":[1],"tag":2}]}`)
	if res := a.result(); res.Tensor == nil || res.Tensor.Values[0] != 7 {
		t.Fatalf("alice: %+v", res)
	}
}

func TestIdleSessionsAreFreed(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b, func(c *worker.Config) { c.IdleTimeout = 300 * time.Millisecond })
	r := newRaw(t, b, "fabric.ops.cpu-0.idle")
	r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1]},{"op":"sync","tag":1}]}`)
	r.result()
	// The registry shows the session count; wait for the sweep to free it.
	nc, _ := nats.Connect(b.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, _ := js.KeyValue(context.Background(), "FABRIC_CTRL")
	sessions := func(want int) func() error {
		return func() error {
			e, err := kv.Get(context.Background(), subjects.DeviceKey("cpu-0"))
			if err != nil {
				return err
			}
			var d codec.Device
			_ = json.Unmarshal(e.Value(), &d)
			if d.Sessions != want {
				return fmt.Errorf("%d sessions, want %d", d.Sessions, want)
			}
			return nil
		}
	}
	checkFor(t, time.Minute, 20*time.Millisecond, sessions(1))
	checkFor(t, time.Minute, 50*time.Millisecond, sessions(0))
	// The client is told that its session was freed, on the op it waits for.
	r.sendJSON(`{"v":1,"ops":[{"op":"full","out":[2],"shape":[1]},{"op":"read","in":[1],"tag":2}]}`)
	if res := r.result(); res.Tag != 2 || len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeSessionFreed || !strings.Contains(res.Errors[0].Message, "freed") {
		t.Fatalf("read of an idle session that was freed: %+v", res)
	}
}

func TestRegistryAndStop(t *testing.T) {
	b := brokertest.Run(t)
	nc, _ := nats.Connect(b.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	w := startWorker(t, b, func(c *worker.Config) {
		c.Devices = append(c.Devices, worker.Device{Name: "cpu-1", Kind: "cpu", Backend: cpu.New(), Cores: 2})
	})
	get := func(name string) codec.Device {
		e, err := kv.Get(context.Background(), subjects.DeviceKey(name))
		if err != nil {
			t.Fatal(err)
		}
		var d codec.Device
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := get("cpu-1"); d.State != "serving" || d.Kind != "cpu" || d.Backend != "cpu" || d.Cores != 2 {
		t.Errorf("registry entry %+v", d)
	}
	// A second worker on cpu-0 stands by while the first holds the lease,
	// and takes over when it stops.
	nc2, _ := nats.Connect(b.ClientURL())
	defer nc2.Close()
	cfg := worker.DefaultConfig()
	cfg.ID = "other"
	cfg.Heartbeat = 100 * time.Millisecond
	cfg.Devices = []worker.Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}}
	w2, _ := worker.New(nc2, cfg)
	if err := w2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer w2.Stop(context.Background())
	if d := get("cpu-0"); d.Worker == "other" {
		t.Fatalf("standby took a device that is being served: %+v", d)
	}
	if err := w.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := get("cpu-1"); d.State != "stopped" {
		t.Errorf("after stop: %+v", d)
	}
	checkFor(t, time.Minute, 20*time.Millisecond, func() error {
		if d := get("cpu-0"); d.Worker != "other" || d.State != "serving" {
			return fmt.Errorf("cpu-0 after the owner stopped: %+v", d)
		}
		return nil
	})
}

func TestBadConfig(t *testing.T) {
	b := brokertest.Run(t)
	nc, _ := nats.Connect(b.ClientURL())
	defer nc.Close()
	for name, edit := range map[string]func(*worker.Config){
		"no devices":        func(c *worker.Config) { c.Devices = nil },
		"bad name":          func(c *worker.Config) { c.Devices[0].Name = "cpu.0" },
		"twice":             func(c *worker.Config) { c.Devices = append(c.Devices, c.Devices[0]) },
		"no backend":        func(c *worker.Config) { c.Devices[0].Backend = nil },
		"no beat":           func(c *worker.Config) { c.Heartbeat = 0 },
		"bad prefix":        func(c *worker.Config) { c.Prefix = "a b" },
		"zero limits":       func(c *worker.Config) { c.Limits.MaxSessions = 0 },
		"no object timeout": func(c *worker.Config) { c.ObjectTimeout = 0 },
		"no lanes":          func(c *worker.Config) { c.Lanes = 0 },
		"17 lanes":          func(c *worker.Config) { c.Lanes = 17 },
	} {
		cfg := worker.DefaultConfig()
		cfg.Devices = []worker.Device{{Name: "cpu-0", Backend: cpu.New()}}
		edit(&cfg)
		if _, err := worker.New(nc, cfg); !errors.Is(err, worker.ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// checkFor polls fn every step until it returns nil or total passes.
var checkFor = poll.Until

// waitCheckpoint waits until the worker whose metrics are at url has
// committed a checkpoint of device.
func waitCheckpoint(t *testing.T, url, device string) {
	t.Helper()
	checkFor(t, 2*time.Minute, 20*time.Millisecond, func() error {
		if n := scrape(t, url)[`jetfabric_device_checkpoints_total{device="`+device+`"}`]; n < 1 {
			return errors.New("no checkpoint of " + device + " yet")
		}
		return nil
	})
}

// TestConsumerLostIsReopened: the device's consumer disappears (its
// server died with it) and the name the feed would try next is taken (by
// a conflicting consumer, as a create that timed out on a dead node but
// was made would leave): the feed tries again under a new name, and the
// session's reads are answered (had it given up, a takeover would replay
// the stream: the first read's answer may come again).
func TestConsumerLostIsReopened(t *testing.T) {
	b := brokertest.Run(t)
	startWorker(t, b)
	a := newRaw(t, b, "fabric.ops.cpu-0.alice")
	a.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":7},{"op":"read","in":[1],"tag":1}]}`)
	if res := a.result(); res.Tensor == nil || res.Tensor.Values[0] != 7 {
		t.Fatalf("before: %+v", res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := a.js.Stream(ctx, "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	var current string
	for name := range stream.ConsumerNames(ctx).Name() {
		current = name // the worker's ordered consumer, the only one
	}
	i := strings.LastIndexByte(current, '_')
	if i < 0 {
		t.Fatalf("no ordered consumer on the stream (got %q)", current)
	}
	// The name the ordered consumer re-creates itself under, taken by a
	// consumer whose settings cannot be changed into an ordered one's.
	serial, _ := strconv.Atoi(current[i+1:])
	next := fmt.Sprintf("%s_%d", current[:i], serial+1)
	if _, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Name: next, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "fabric.ops.nobody.x", InactiveThreshold: time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteConsumer(ctx, current); err != nil {
		t.Fatal(err)
	}
	a.sendJSON(`{"v":1,"ops":[{"op":"add","in":[1,1],"out":[2]},{"op":"read","in":[2],"tag":2}]}`)
	// The takeover replays the first frame too: its read is answered again.
	for {
		m, err := a.inbox.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("no answer after the consumer was lost: %v", err)
		}
		enc, _ := codec.EncodingOf(m.Header.Get(subjects.HeaderContentType))
		var res codec.Result
		if err := codec.Unmarshal(enc, m.Data, &res); err != nil {
			t.Fatal(err)
		}
		if res.Tag == 1 && res.Tensor != nil && res.Tensor.Values[0] == 7 {
			continue
		}
		if res.Tag != 2 || res.Tensor == nil || res.Tensor.Values[0] != 14 {
			t.Fatalf("after: %+v", res)
		}
		return
	}
}

// feedConsumer returns the one consumer of FABRIC_OPS: the device's feed.
func feedConsumer(t *testing.T, ctx context.Context, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	stream, err := js.Stream(ctx, "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	var infos []*jetstream.ConsumerInfo
	for ci := range stream.ListConsumers(ctx).Info() {
		infos = append(infos, ci)
	}
	if len(infos) != 1 {
		t.Fatalf("%d consumers on FABRIC_OPS, want the feed's alone", len(infos))
	}
	return infos[0]
}

// expectOnly reads the session's next answer, waiting up to within, and
// checks it is tag's, with value want, and the only one: no answer given
// twice (a takeover would replay the frames) and none to a frame that
// should not have run.
func (r *rawSession) expectOnly(tag uint64, want float64, within time.Duration) {
	r.t.Helper()
	res := r.resultWithin(within)
	if res.Tag != tag || len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != want {
		r.t.Fatalf("got %+v, want tag %d with %v", res, tag, want)
	}
	if m, err := r.inbox.NextMsg(300 * time.Millisecond); err == nil {
		r.t.Fatalf("an answer more: %s", m.Data)
	}
}

// fedSession starts a broker and a worker serving cpu-0, and runs a first
// frame on a raw session there: tensor 1 is 7, read back with tag 1.
func fedSession(t *testing.T) *rawSession {
	t.Helper()
	b := brokertest.Run(t)
	startWorker(t, b)
	a := newRaw(t, b, "fabric.ops.cpu-0.alice")
	a.sendJSON(`{"v":1,"ops":[{"op":"full","out":[1],"shape":[1],"value":7},{"op":"read","in":[1],"tag":1}]}`)
	a.expectOnly(1, 7, 5*time.Second)
	return a
}

// TestFeedRecreatesDeletedConsumer: the device's consumer is deleted (an
// operator, or its server's restart); the feed creates the next one after
// the last frame it ran. Nothing is run twice: no takeover, no replay.
func TestFeedRecreatesDeletedConsumer(t *testing.T) {
	a := fedSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := feedConsumer(t, ctx, a.js).Name
	if err := a.js.DeleteConsumer(ctx, "FABRIC_OPS", first); err != nil {
		t.Fatal(err)
	}
	a.sendJSON(`{"v":1,"ops":[{"op":"add","in":[1,1],"out":[2]},{"op":"read","in":[2],"tag":2}]}`)
	a.expectOnly(2, 14, 30*time.Second)
	if next := feedConsumer(t, ctx, a.js).Name; next == first {
		t.Fatalf("the consumer is still %s", next)
	}
}

// TestFeedRefusesForgedDelivery: a message published on the feed's
// deliver subject, posing as a delivery, is never run. (The server refuses
// a client's publish whose reply is a JetStream acknowledgement subject, so
// what can arrive there lacks a delivery's sequence numbers.) The feed
// starts again after the last frame it ran, on a new consumer, and the
// stream's frames run once each, in order.
func TestFeedRefusesForgedDelivery(t *testing.T) {
	a := fedSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, reply := range []string{"not.an.ack.subject", ""} {
		ci := feedConsumer(t, ctx, a.js)
		m := nats.NewMsg(ci.Config.DeliverSubject)
		m.Reply = reply
		m.Header.Set(subjects.HeaderReply, a.inbox.Subject)
		m.Header.Set(subjects.HeaderContentType, "application/json")
		m.Data = []byte(`{"v":1,"ops":[{"op":"full","out":[9],"shape":[1],"value":99},{"op":"read","in":[9],"tag":99}]}`)
		if err := a.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		// The frame waits in the stream while the feed changes consumers.
		a.sendJSON(`{"v":1,"ops":[{"op":"add","in":[1,1],"out":[2]},{"op":"read","in":[2],"tag":2},{"op":"free","in":[2]}]}`)
		a.expectOnly(2, 14, 5*time.Second)
		if next := feedConsumer(t, ctx, a.js).Name; next == ci.Name {
			t.Fatalf("reply %q: the consumer is still %s", reply, next)
		}
	}
}

// TestFeedRecreatesStalledConsumer: the device's consumer stops
// delivering while frames wait (paused here; a flow-control stall or a
// node cut off in a cluster does the same) and its heartbeats go on: the
// feed notices within seconds and creates a new consumer after the last
// frame it ran. Nothing is run twice.
func TestFeedRecreatesStalledConsumer(t *testing.T) {
	a := fedSession(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := feedConsumer(t, ctx, a.js).Name
	if _, err := a.js.PauseConsumer(ctx, "FABRIC_OPS", first, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a.sendJSON(`{"v":1,"ops":[{"op":"add","in":[1,1],"out":[2]},{"op":"read","in":[2],"tag":2}]}`)
	a.expectOnly(2, 14, 30*time.Second)
	t.Logf("answered %v after the consumer paused", time.Since(start).Round(time.Millisecond))
	if next := feedConsumer(t, ctx, a.js).Name; next == first {
		t.Fatalf("the consumer is still %s", next)
	}
}
