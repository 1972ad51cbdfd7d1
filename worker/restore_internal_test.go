package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
)

// restoreRig is a broker, a raw JSON sender on one session of cpu-0 and
// the workers started on it.
type restoreRig struct {
	t     *testing.T
	url   string
	nc    *nats.Conn
	js    jetstream.JetStream
	inbox *nats.Subscription
	logs  *syncLog
}

type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, format+"\n", args...)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newRestoreRig(t *testing.T) *restoreRig {
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	inbox, _ := nc.SubscribeSync(nats.NewInbox())
	return &restoreRig{t: t, url: b.ClientURL(), nc: nc, js: js, inbox: inbox, logs: &syncLog{}}
}

// start runs a worker serving cpu-0 until the test ends, its config
// edited by edit.
func (r *restoreRig) start(id string, edit ...func(*Config)) *Worker {
	r.t.Helper()
	nc, err := nats.Connect(r.url)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.ID = id
	cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New(cpu.WithCache(0))}}
	cfg.CheckpointInterval = 0
	cfg.LeaseTTL = 200 * time.Millisecond
	cfg.Logf = r.logs.logf
	for _, e := range edit {
		e(&cfg)
	}
	w, err := New(nc, cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		_ = w.Stop(context.Background())
		nc.Close()
	})
	return w
}

func (r *restoreRig) send(body string) {
	r.t.Helper()
	m := nats.NewMsg("fabric.ops.cpu-0.lazy")
	m.Data = []byte(body)
	m.Header.Set(subjects.HeaderReply, r.inbox.Subject)
	m.Header.Set(subjects.HeaderContentType, "application/json")
	if _, err := r.js.PublishMsg(context.Background(), m); err != nil {
		r.t.Fatal(err)
	}
}

func (r *restoreRig) result() codec.Result {
	r.t.Helper()
	msg, err := r.inbox.NextMsg(30 * time.Second)
	if err != nil {
		r.t.Fatalf("no answer: %v\n%s", err, r.logs)
	}
	var res codec.Result
	if err := json.Unmarshal(msg.Data, &res); err != nil {
		r.t.Fatal(err)
	}
	return res
}

// lazyTensors makes tensors 1..4 of 1 MiB each (tensor k filled with k),
// commits a checkpoint and stops the worker cleanly.
func (r *restoreRig) lazyTensors() {
	r.t.Helper()
	w := r.start("first")
	const n = 1 << 18
	var ops []string
	for k := 1; k <= 4; k++ {
		ops = append(ops, fmt.Sprintf(`{"op":"full","out":[%d],"shape":[%d],"value":%d}`, k, n, k))
	}
	r.send(`{"v":1,"ops":[` + strings.Join(ops, ",") + `,{"op":"sync","tag":1}]}`)
	if res := r.result(); len(res.Errors) > 0 {
		r.t.Fatal(res.Errors)
	}
	if err := w.Stop(context.Background()); err != nil { // the last checkpoint
		r.t.Fatal(err)
	}
}

// holdReaders holds every background reader of a restore before it takes
// a tensor until the returned channel is closed (or the read is
// abandoned), for the rest of the test.
func holdReaders(t *testing.T) chan struct{} {
	held := make(chan struct{})
	testHookLazyRead = func(ctx context.Context) {
		select {
		case <-held:
		case <-ctx.Done():
		}
	}
	t.Cleanup(func() { testHookLazyRead = nil })
	return held
}

// TestRestoreIsLazy: a worker that takes a device over serves it before
// the large tensors of the checkpoint are read (the background readers
// are held here); a read of one of them is answered, the device loop
// reading that tensor itself; a checkpoint meanwhile names the unread
// tensors without reading them; a free of an unread one is not read.
// Then the readers go on and the rest is there, bit for bit.
func TestRestoreIsLazy(t *testing.T) {
	held := holdReaders(t)
	r := newRestoreRig(t)
	r.lazyTensors()
	kv, err := r.js.KeyValue(context.Background(), "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	ckptSeq := func() uint64 {
		e, err := kv.Get(context.Background(), subjects.CheckpointKey("cpu-0"))
		if err != nil {
			return 0
		}
		var ref checkpointRef
		_ = json.Unmarshal(e.Value(), &ref)
		return ref.Seq
	}
	seq0 := ckptSeq()
	if seq0 == 0 {
		t.Fatal("no checkpoint committed by the clean stop")
	}

	w := r.start("second")
	d := w.devices[0]
	// Tensor 3 read while every background reader waits.
	r.send(`{"v":1,"ops":[{"op":"sum","out":[10],"in":[3]},{"op":"read","in":[10],"tag":2}]}`)
	if res := r.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 3*(1<<18) {
		t.Fatalf("sum of restored tensor 3: %+v", res)
	}
	if got := d.m.restorePending.Load(); got != 3<<20 {
		t.Fatalf("%d restored bytes pending, want the 3 MiB of tensors 1, 2 and 4", got)
	}
	// Tensor 4 freed unread; a checkpoint with tensors 1 and 2 unread.
	r.send(`{"v":1,"ops":[{"op":"free","in":[4]},{"op":"checkpoint"},{"op":"sync","tag":3}]}`)
	if res := r.result(); len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	checkUntil(t, 20*time.Second, func() error {
		if s, n := ckptSeq(), d.m.checkpoints.Load(); s == seq0 || n == 0 {
			return fmt.Errorf("checkpoint still at %d, %d committed", s, n)
		}
		return nil
	})
	if got := d.m.ckptBytes.Load(); got > 64<<10 {
		t.Fatalf("the checkpoint with unread tensors wrote %d bytes: it read them", got)
	}
	close(held)
	for k := 1; k <= 2; k++ {
		r.send(fmt.Sprintf(`{"v":1,"ops":[{"op":"sum","out":[%d],"in":[%d]},{"op":"read","in":[%d],"tag":%d}]}`, 20+k, k, 20+k, 4+k))
		if res := r.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != float64(k<<18) {
			t.Fatalf("sum of restored tensor %d: %+v", k, res)
		}
	}
	r.send(`{"v":1,"ops":[{"op":"read","in":[4],"tag":9}]}`)
	if res := r.result(); len(res.Errors) != 1 || res.Errors[0].Code != codec.CodeUnknownID {
		t.Fatalf("read of freed tensor 4: %+v", res)
	}
	// Every tensor read or dropped: the bookkeeping goes.
	checkUntil(t, 20*time.Second, func() error {
		w.devices[0].loop.Lock()
		defer w.devices[0].loop.Unlock()
		if d.lazy != nil {
			return fmt.Errorf("%d tensors left to read", d.lazy.left.Load())
		}
		return nil
	})
	if got := d.m.restorePending.Load(); got != 0 {
		t.Fatalf("%d restored bytes pending after every tensor was read", got)
	}
}

// TestRestoreReadFails: a tensor object of the checkpoint is gone when a
// worker takes the device over. The read that needs it is not answered
// with anything wrong: the device takes itself over again, and once the
// object is back the read is answered with the right bits.
func TestRestoreReadFails(t *testing.T) {
	r := newRestoreRig(t)
	r.lazyTensors()
	obj, err := r.js.ObjectStore(context.Background(), "FABRIC_CKPT")
	if err != nil {
		t.Fatal(err)
	}
	l, err := obj.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Every tensor object away: any of them fails the restore.
	saved := map[string][]byte{}
	for _, o := range l {
		if strings.HasPrefix(o.Name, "ckpt-cpu-0-t-") {
			b, err := obj.GetBytes(context.Background(), o.Name)
			if err != nil {
				t.Fatal(err)
			}
			saved[o.Name] = b
			if err := obj.Delete(context.Background(), o.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(saved) != 4 {
		t.Fatalf("%d tensor objects, want 4", len(saved))
	}
	r.start("second")
	r.send(`{"v":1,"ops":[{"op":"sum","out":[10],"in":[2]},{"op":"read","in":[10],"tag":2}]}`)
	checkUntil(t, 20*time.Second, func() error {
		if n := strings.Count(r.logs.String(), "could not be read"); n < 2 {
			return fmt.Errorf("%d failed restores logged", n)
		}
		return nil
	})
	if m, err := r.inbox.NextMsg(0); err == nil {
		t.Fatalf("answered with the restore failing: %s", m.Data)
	}
	for name, b := range saved {
		if _, err := obj.PutBytes(context.Background(), name, b); err != nil {
			t.Fatal(err)
		}
	}
	if res := r.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 2*(1<<18) {
		t.Fatalf("sum of restored tensor 2: %+v\n%s", res, r.logs)
	}
}

// TestLazyReadsYieldToTheLoop: while the device loop waits for a restored
// tensor that no reader has taken, the readers' reads of other tensors
// are stopped and put back, and read again once the loop has its tensor;
// a tensor whose read was stopped is read by the loop when it needs it
// next. Every tensor ends up read once to the end.
func TestLazyReadsYieldToTheLoop(t *testing.T) {
	w := &Worker{ctx: context.Background()}
	d := &device{w: w}
	be := cpu.New(cpu.WithCache(0))
	const n = restoreReaders + 2
	var (
		mu       sync.Mutex
		started  [n]int
		stopped  [n]int
		finished [n]int
		inRead   = make(chan int, 4*n)
	)
	release := make([]chan struct{}, n)
	var queue []*lazyTensor
	for i := range n {
		buf, err := be.Alloc(64)
		if err != nil {
			t.Fatal(err)
		}
		release[i] = make(chan struct{})
		queue = append(queue, &lazyTensor{t: &kernels.Tensor{Buf: buf}, id: uint64(i), done: make(chan struct{}),
			read: func(ctx context.Context) error {
				mu.Lock()
				started[i]++
				mu.Unlock()
				inRead <- i
				select {
				case <-release[i]:
					mu.Lock()
					finished[i]++
					mu.Unlock()
					return nil
				case <-ctx.Done():
					mu.Lock()
					stopped[i]++
					mu.Unlock()
					return ctx.Err()
				}
			}})
	}
	d.startLazy(queue, 64*n)
	defer d.stopLazy()
	// The readers take the first restoreReaders tensors.
	for range restoreReaders {
		select {
		case <-inRead:
		case <-time.After(20 * time.Second):
			t.Fatal("the readers did not start")
		}
	}
	// The loop needs the last one, which no reader has: it reads it
	// itself, and the readers' reads are stopped.
	close(release[n-1])
	if err := d.awaitTensor(queue[n-1].t); err != nil {
		t.Fatal(err)
	}
	// Their reads were stopped for it (once the loop has its tensor they
	// may start again: only the stop is certain).
	poll.Until(t, 20*time.Second, time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		for i := range restoreReaders {
			if stopped[i] < 1 || finished[i] != 0 {
				return fmt.Errorf("tensor %d: %d reads started, %d stopped, %d finished", i, started[i], stopped[i], finished[i])
			}
		}
		return nil
	})
	// The readers go on with the tensors put back (each read starts
	// again); the loop then needs tensor 0, whatever a reader does with it.
	close(release[0])
	if err := d.awaitTensor(queue[0].t); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n-1; i++ {
		close(release[i])
	}
	checkUntil(t, 20*time.Second, func() error {
		if left := d.lazy.left.Load(); left != 0 {
			return fmt.Errorf("%d tensors left", left)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		if finished[i] != 1 {
			t.Errorf("tensor %d read to the end %d times, want 1", i, finished[i])
		}
	}
	// Stopped at least once for the loop; again if the loop waited for
	// tensor 0 before a reader took it back, which depends on timing.
	for i := range restoreReaders {
		if i != 0 && started[i] < 2 {
			t.Errorf("tensor %d: %d reads started, want 2 or more (stopped for the loop)", i, started[i])
		}
	}
}

// TestReplayReadsAhead: the frames a new owner replays are scanned for
// the restored tensors they read, which the background readers then take
// first, in the replay's order: tensors 3 and 1 here, of the four, unless
// the loop, replaying meanwhile, took one itself first.
func TestReplayReadsAhead(t *testing.T) {
	held := holdReaders(t)
	r := newRestoreRig(t)
	r.lazyTensors()
	// Stored while no worker serves: the next owner replays them. The
	// product ahead of the first read of tensor 3 gives the scan time to
	// come first, most of the time.
	r.send(`{"v":1,"ops":[{"op":"full","out":[20],"shape":[512,512],"value":1},{"op":"matmul","out":[21],"in":[20,20]},` +
		`{"op":"matmul","out":[22],"in":[21,21]},{"op":"sum","out":[10],"in":[3]},{"op":"free","in":[10,20,21,22]}]}`)
	r.send(`{"v":1,"ops":[{"op":"add","out":[11],"in":[1,3]},{"op":"sum","out":[12],"in":[11]},{"op":"read","in":[12],"tag":1}]}`)
	w := r.start("second")
	d := w.devices[0]
	re := regexp.MustCompile(`the 2 frames to replay read (\d) restored tensors`)
	var moved string
	checkUntil(t, 20*time.Second, func() error {
		m := re.FindStringSubmatch(r.logs.String())
		if m == nil {
			return fmt.Errorf("no scan in the log:\n%s", r.logs)
		}
		moved = m[1]
		return nil
	})
	d.loop.Lock()
	lr := d.lazy
	d.loop.Unlock()
	if lr == nil {
		t.Fatal("no background read")
	}
	lr.mu.Lock()
	var soon []uint64
	for _, lt := range lr.soon {
		soon = append(soon, lt.id)
	}
	var loop []uint64 // taken by the loop before the scan got to them
	for _, lt := range lr.queue {
		if (lt.id == 1 || lt.id == 3) && !lt.soon {
			loop = append(loop, lt.id)
			if !lt.taken.Load() {
				t.Errorf("tensor %d was neither read first nor taken by the loop", lt.id)
			}
		}
	}
	lr.mu.Unlock()
	want := slices.DeleteFunc([]uint64{3, 1}, func(id uint64) bool { return slices.Contains(loop, id) })
	if !slices.Equal(soon, want) || moved != fmt.Sprint(len(want)) {
		t.Errorf("read first %v (the log says %s), want %v (the loop took %v)", soon, moved, want, loop)
	}
	t.Logf("read first %v; taken by the loop %v", soon, loop)
	close(held)
	if res := r.result(); len(res.Errors) > 0 || res.Tensor == nil || res.Tensor.Values[0] != 4*(1<<18) {
		t.Fatalf("the replayed read of 1+3 summed: %+v", res)
	}
}

// TestNeededBy: the tensors a frame's ops read, of its own session, in
// order, once each; a frame that does not decode, or of another session,
// needs none.
func TestNeededBy(t *testing.T) {
	lr := &lazyRestore{byKey: map[lazyKey]*lazyTensor{}}
	lts := map[lazyKey]*lazyTensor{}
	for _, k := range []lazyKey{{"s1", 1}, {"s1", 2}, {"s1", 3}, {"acme.s1", 1}, {"s2", 1}} {
		lt := &lazyTensor{session: k.session, id: k.id}
		lts[k], lr.byKey[k] = lt, lt
	}
	names := subjects.Default()
	var frame codec.Frame
	for _, c := range []struct {
		subject, body string
		want          []*lazyTensor
	}{
		{"fabric.ops.cpu-0.s1", `{"v":1,"ops":[{"op":"add","out":[9],"in":[3,1]},{"op":"mul","out":[10],"in":[9,3]},{"op":"sum","out":[11],"in":[7]}]}`,
			[]*lazyTensor{lts[lazyKey{"s1", 3}], lts[lazyKey{"s1", 1}]}},
		{"fabric.t.acme.ops.cpu-0.s1", `{"v":1,"ops":[{"op":"neg","out":[9],"in":[1]}]}`, []*lazyTensor{lts[lazyKey{"acme.s1", 1}]}},
		{"fabric.ops.cpu-0.s3", `{"v":1,"ops":[{"op":"neg","out":[9],"in":[1]}]}`, nil},
		{"fabric.ops.cpu-0.s1", `{"v":1,"ops":[`, nil},
		{"fabric.ops.cpu-0", `{"v":1,"ops":[{"op":"neg","out":[9],"in":[1]}]}`, nil},
	} {
		got := lr.neededBy(names, c.subject, "application/json", []byte(c.body), &frame)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %s: %d tensors, want %d", c.subject, c.body, len(got), len(c.want))
		}
	}
	if got := lr.neededBy(names, "fabric.ops.cpu-0.s1", "text/plain", []byte(`{}`), &frame); got != nil {
		t.Errorf("an unknown content type: %v", got)
	}
}
