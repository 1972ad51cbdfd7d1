package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
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
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	names := subjects.Default()
	key := subjects.LeaseKey("cpu-9")
	l, err := acquireLease(ctx, js, kv, names, "cpu-9", "w1", time.Second, nil)
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
	l2, err := acquireLease(ctx, js, kv, names, "cpu-9", "w1", time.Second, nil)
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
