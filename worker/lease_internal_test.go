package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
)

// TestLeaseRenewalStoredUnanswered: a renewal that the control bucket
// stored but never answered (its leader killed with the answer in flight,
// or the answer later than the renewal's timeout) leaves the lease at a
// later revision than the holder knows, with the holder's own value. The
// next renewal and the next fenced write find the lease still the
// holder's and go on, where they used to call it lost (and the device was
// taken over again, replaying from its checkpoint). A lease that another
// worker took, or that was deleted, is lost all the same.
func TestLeaseRenewalStoredUnanswered(t *testing.T) {
	b := brokertest.Run(t)
	_, js, kv := dialCtrl(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := subjects.Default()
	key := subjects.LeaseKey("cpu-9")
	l, err := acquireLease(ctx, js, kv, names, "cpu-9", leaseValue{Worker: "w1"}, time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// What the unanswered renewal stored: w1's value after l.rev.
	stored := func(worker string) uint64 {
		t.Helper()
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		val, _ := json.Marshal(leaseValue{Worker: worker, Acquired: time.Now().UTC()})
		rev, err := kv.Update(ctx, key, val, e.Revision())
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	latest := func() uint64 {
		t.Helper()
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision()
	}

	before := l.rev
	stored("w1")
	if err := l.renew(ctx); err != nil {
		t.Fatalf("renewal after an unanswered one: %v", err)
	}
	if l.rev <= before || l.rev != latest() {
		t.Fatalf("after the renewal the holder knows revision %d, the lease is at %d (was %d)", l.rev, latest(), before)
	}
	stored("w1")
	if err := l.write(ctx, subjects.CheckpointKey("cpu-9"), []byte(`{}`)); err != nil {
		t.Fatalf("fenced write after an unanswered renewal: %v", err)
	}
	if err := l.renew(ctx); err != nil || l.rev != latest() {
		t.Fatalf("renewal after the write: %v (revision %d, the lease's %d)", err, l.rev, latest())
	}

	// The refused renewal may have used up the caller's time: the lease
	// is read all the same.
	stored("w1")
	spent, spend := context.WithCancel(ctx)
	spend()
	l.mu.Lock()
	reclaimed := l.reclaim(spent)
	l.mu.Unlock()
	if !reclaimed || l.rev != latest() {
		t.Fatalf("reclaim with the caller's time spent: %v (revision %d, the lease's %d)", reclaimed, l.rev, latest())
	}

	// Another worker's value: lost, and nothing is written.
	stored("w2")
	if err := l.renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewal of a lease w2 took: %v, want ErrLeaseLost", err)
	}
	if err := l.write(ctx, subjects.CheckpointKey("cpu-9"), []byte(`{"x":1}`)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("fenced write on a lease w2 took: %v, want ErrLeaseLost", err)
	}
	if e, err := kv.Get(ctx, subjects.CheckpointKey("cpu-9")); err != nil || string(e.Value()) != `{}` {
		t.Fatalf("checkpoint key after the refused write: %v %q", err, e.Value())
	}

	// Deleted (released, say): lost.
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	l2, err := acquireLease(ctx, js, kv, names, "cpu-9", leaseValue{Worker: "w1"}, time.Second, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := l2.renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewal of a deleted lease: %v, want ErrLeaseLost", err)
	}
}

// TestLeaseHolderGone: a standby takes a lease at once when its holder's
// connection is gone, not after the lease's TTL (a minute here), and
// never while the holder is connected, even when the holder does not
// answer in time (paused) or names no liveness subject.
func TestLeaseHolderGone(t *testing.T) {
	b := brokertest.Run(t)
	names := subjects.Default()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// holderGone on its own, against a live subscriber, a mute one and none.
	probe, _, _ := dialCtrl(t, b)
	other, _, _ := dialCtrl(t, b)
	if _, err := other.Subscribe(names.WorkerLive("up"), func(m *nats.Msg) { _ = m.Respond(nil) }); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Subscribe(names.WorkerLive("mute"), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		live string
		want bool
	}{
		{"up", false}, {"mute", false}, {"", false}, {"a.b", false}, {"*", false}, {">", false},
		{"nobody", true},
	} {
		if got := holderGone(probe, names, leaseValue{Worker: "h", Live: c.live}, 50*time.Millisecond); got != c.want {
			t.Errorf("holderGone with live %q = %v, want %v", c.live, got, c.want)
		}
	}

	// A holder that answers: the standby stands by while it probes.
	hnc, hjs, hkv := dialCtrl(t, b)
	var answered atomic.Int32
	if _, err := hnc.Subscribe(names.WorkerLive("holder"), func(m *nats.Msg) {
		answered.Add(1)
		_ = m.Respond(nil)
	}); err != nil {
		t.Fatal(err)
	}
	if err := hnc.Flush(); err != nil {
		t.Fatal(err)
	}
	held, err := acquireLease(ctx, hjs, hkv, names, "cpu-8", leaseValue{Worker: "h", Live: "holder"}, time.Minute, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, sjs, skv := dialCtrl(t, b)
	got := make(chan error, 1)
	go func() {
		l, err := acquireLease(ctx, sjs, skv, names, "cpu-8", leaseValue{Worker: "s", Live: "standby"}, time.Minute, nil, nil)
		if err == nil && l.me.Worker != "s" {
			err = errors.New("a lease of another worker")
		}
		got <- err
	}()
	for answered.Load() < 3 {
		select {
		case err := <-got:
			t.Fatalf("the standby took the lease of a connected holder: %v", err)
		case <-ctx.Done():
			t.Fatal("the standby never asked the holder")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !held.held() {
		t.Fatal("the holder lost its lease")
	}
	// The holder's connection goes: the standby takes the lease long
	// before the minute of its TTL.
	hnc.Close()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("standby: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the standby did not take the lease within 30s of its holder's connection closing")
	}
	e, err := skv.Get(ctx, subjects.LeaseKey("cpu-8"))
	if err != nil {
		t.Fatal(err)
	}
	var v leaseValue
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.Worker != "s" || v.Live != "standby" {
		t.Fatalf("lease value after the takeover: %s (%v)", e.Value(), err)
	}
}

// TestAnswerLiveRefused: a worker whose permissions refuse its liveness
// subject names none in its leases (standbys then wait out the TTL), where
// one that nothing answers would read as a dead holder's; one allowed it
// names its token and answers it.
func TestAnswerLiveRefused(t *testing.T) {
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "refused", Password: "p", Permissions: &server.Permissions{
				Subscribe: &server.SubjectPermission{Deny: []string{"fabric.live.>"}}}},
			{Username: "allowed", Password: "p"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	defer s.Shutdown()
	for _, c := range []struct {
		user     string
		answered bool
	}{{"refused", false}, {"allowed", true}} {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo(c.user, "p"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		var logged []string
		cfg := DefaultConfig()
		cfg.Logf = func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
		cfg.Devices = []Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}}
		w, err := New(nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.answerLive(); err != nil {
			t.Fatalf("%s: %v", c.user, err)
		}
		if got := w.live != ""; got != c.answered {
			t.Fatalf("%s: liveness token %q, want one: %v (log %q)", c.user, w.live, c.answered, logged)
		}
		if !c.answered && (len(logged) != 1 || !strings.Contains(logged[0], "after the lease TTL only")) {
			t.Fatalf("%s: log %q, want the fallback said", c.user, logged)
		}
		if c.answered && holderGone(nc, subjects.Default(), leaseValue{Live: w.live}, time.Second) {
			t.Fatalf("%s: a standby would find this live worker gone", c.user)
		}
	}
}

// dialCtrl connects to b, closed when the test ends, with its JetStream
// and control bucket.
func dialCtrl(t *testing.T, b *broker.Broker) (*nats.Conn, jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
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
	return nc, js, kv
}
