package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
)

// readAheadRig is a restore rig whose worker "first" owns cpu-0 with
// tensors 1..4 of 1 MiB each (tensor k filled with k) in a committed
// checkpoint, and a standby "second" once started.
type readAheadRig struct {
	*restoreRig
	first, second *Worker
	obj           jetstream.ObjectStore
	seq           uint64 // of the checkpoint committed last by the rig
}

func newReadAheadRig(t *testing.T) *readAheadRig {
	r := &readAheadRig{restoreRig: newRestoreRig(t)}
	r.first = r.start("first")
	var err error
	if r.obj, err = r.js.ObjectStore(context.Background(), "FABRIC_CKPT"); err != nil {
		t.Fatal(err)
	}
	const n = 1 << 18
	var ops []string
	for k := 1; k <= 4; k++ {
		ops = append(ops, fmt.Sprintf(`{"op":"full","out":[%d],"shape":[%d],"value":%d}`, k, n, k))
	}
	r.checkpoint(strings.Join(ops, ","))
	return r
}

// standby starts the standby, its config edited by edit.
func (r *readAheadRig) standby(edit ...func(*Config)) {
	r.second = r.start("second", edit...)
}

// checkpoint runs ops (comma-separated JSON) and a checkpoint, and waits
// until it is committed.
func (r *readAheadRig) checkpoint(ops string) {
	r.t.Helper()
	r.send(`{"v":1,"ops":[` + ops + `,{"op":"checkpoint"},{"op":"sync","tag":1}]}`)
	if res := r.result(); len(res.Errors) > 0 {
		r.t.Fatal(res.Errors)
	}
	kv, err := r.js.KeyValue(context.Background(), "FABRIC_CTRL")
	if err != nil {
		r.t.Fatal(err)
	}
	checkUntil(r.t, 20*time.Second, func() error {
		e, err := kv.Get(context.Background(), subjects.CheckpointKey("cpu-0"))
		if err != nil {
			return err
		}
		var ref checkpointRef
		if err := json.Unmarshal(e.Value(), &ref); err != nil {
			return err
		}
		if ref.Seq <= r.seq {
			return fmt.Errorf("checkpoint at %d, not past %d", ref.Seq, r.seq)
		}
		r.seq = ref.Seq
		return nil
	})
}

// warmBytes waits until the standby holds want bytes read ahead.
func (r *readAheadRig) warmBytes(want int64) {
	r.t.Helper()
	d := r.second.devices[0]
	checkUntil(r.t, 20*time.Second, func() error {
		if got := d.m.warmBytes.Load(); got != want {
			return fmt.Errorf("the standby read %d bytes ahead, want %d\n%s", got, want, r.logs)
		}
		return nil
	})
}

// tensorObjects returns the checkpoint's tensor objects by name.
func (r *readAheadRig) tensorObjects() map[string][]byte {
	r.t.Helper()
	l, err := r.obj.List(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, o := range l {
		if strings.HasPrefix(o.Name, "ckpt-cpu-0-t-") {
			b, err := r.obj.GetBytes(context.Background(), o.Name)
			if errors.Is(err, jetstream.ErrObjectNotFound) {
				continue // swept since the listing
			}
			if err != nil {
				r.t.Fatal(err)
			}
			out[o.Name] = b
		}
	}
	return out
}

// takeOver stops the owner (its last checkpoint writes no tensor: none
// changed) and checks that the standby, now the owner, reads tensor k
// filled with k for each k in want.
func (r *readAheadRig) takeOver(want ...int) {
	r.t.Helper()
	if err := r.first.Stop(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	for i, k := range want {
		r.send(fmt.Sprintf(`{"v":1,"ops":[{"op":"read","in":[%d],"tag":%d}]}`, k, 10+i))
		res := r.result()
		if len(res.Errors) > 0 || res.Tensor == nil || len(res.Tensor.Values) != 1<<18 {
			r.t.Fatalf("read of restored tensor %d: errors %v\n%s", k, res.Errors, r.logs)
		}
		for j, v := range res.Tensor.Values {
			if v != float64(k) {
				r.t.Fatalf("restored tensor %d holds %v at %d", k, v, j)
			}
		}
	}
}

// TestStandbyReadsAhead: a standby reads the tensors of each checkpoint the
// owner commits, and lets go of those a later checkpoint no longer names;
// when it takes the device over, the restore adopts them: the objects are
// deleted here before the takeover, and the device answers with the same
// bits all the same.
func TestStandbyReadsAhead(t *testing.T) {
	r := newReadAheadRig(t)
	r.standby()
	r.warmBytes(4 << 20)
	r.checkpoint(`{"op":"free","in":[4]}`)
	r.warmBytes(3 << 20)
	// The commit sweeps tensor 4's object.
	var objects map[string][]byte
	checkUntil(t, 20*time.Second, func() error {
		if objects = r.tensorObjects(); len(objects) != 3 {
			return fmt.Errorf("%d tensor objects after tensor 4 was freed, want 3", len(objects))
		}
		return nil
	})
	for name := range objects {
		if err := r.obj.Delete(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	r.takeOver(1, 2, 3)
	d := r.second.devices[0]
	if hits, left := d.m.warmHits.Load(), d.m.warmBytes.Load(); hits != 3 || left != 0 {
		t.Fatalf("the takeover found %d tensors read ahead, %d bytes left over; want 3 and 0", hits, left)
	}
	if got := d.m.restorePending.Load(); got != 0 {
		t.Fatalf("%d bytes left to read from objects after a takeover that found every tensor read ahead", got)
	}
}

// TestStandbyReadsAheadWithinLimits: a tensor object that does not match
// its digest is not read ahead (the others are); a standby whose device has
// a memory budget reads ahead no more than it allows; and with NoReadAhead
// nothing. The takeovers read the rest from the objects, with the same
// bits.
func TestStandbyReadsAheadWithinLimits(t *testing.T) {
	t.Run("corrupt object", func(t *testing.T) {
		r := newReadAheadRig(t)
		objects := r.tensorObjects()
		var bad string
		var good []byte
		for name, b := range objects {
			if math.Float32frombits(binary.LittleEndian.Uint32(b)) == 2 { // tensor 2
				bad, good = name, b
			}
		}
		if bad == "" {
			t.Fatalf("no object of tensor 2 among %d", len(objects))
		}
		// The object put again, with other bytes, under its name.
		if _, err := r.obj.PutBytes(context.Background(), bad, bytes.Repeat([]byte{9}, len(good))); err != nil {
			t.Fatal(err)
		}
		r.standby()
		r.warmBytes(3 << 20)
		checkUntil(t, 20*time.Second, func() error {
			if !strings.Contains(r.logs.String(), "the manifest names") {
				return fmt.Errorf("no failed read ahead logged:\n%s", r.logs)
			}
			return nil
		})
		if _, err := r.obj.PutBytes(context.Background(), bad, good); err != nil {
			t.Fatal(err)
		}
		r.takeOver(1, 2, 3, 4)
		// Tensor 2 is read again a second after the failure: the takeover
		// may come before or after.
		if hits := r.second.devices[0].m.warmHits.Load(); hits != 3 && hits != 4 {
			t.Fatalf("the takeover found %d tensors read ahead, want 3 or 4", hits)
		}
	})
	t.Run("budget", func(t *testing.T) {
		// The owner has no budget; the standby's allows two tensors.
		r := newReadAheadRig(t)
		r.standby(func(c *Config) { c.Devices[0].Budget = 5 << 20 / 2 })
		r.warmBytes(2 << 20)
		r.takeOver(1, 2, 3, 4)
		if hits := r.second.devices[0].m.warmHits.Load(); hits != 2 {
			t.Fatalf("the takeover found %d tensors read ahead, want 2", hits)
		}
	})
	t.Run("uploaded", func(t *testing.T) {
		// A backend that cannot take host memory over (a GPU's): the
		// copies read ahead are uploaded after the takeover.
		r := newReadAheadRig(t)
		r.standby(func(c *Config) { c.Devices[0].Backend = uploadOnly{cpu.New(cpu.WithCache(0))} })
		r.warmBytes(4 << 20)
		for name := range r.tensorObjects() {
			if err := r.obj.Delete(context.Background(), name); err != nil {
				t.Fatal(err)
			}
		}
		r.takeOver(1, 2, 3, 4)
		if hits := r.second.devices[0].m.warmHits.Load(); hits != 4 {
			t.Fatalf("the takeover found %d tensors read ahead, want 4", hits)
		}
	})
	t.Run("NoReadAhead", func(t *testing.T) {
		r := newReadAheadRig(t)
		r.standby(func(c *Config) { c.NoReadAhead = true })
		r.checkpoint(`{"op":"full","out":[5],"shape":[4],"value":5}`)
		r.takeOver(1, 2, 3, 4)
		if hits := r.second.devices[0].m.warmHits.Load(); hits != 0 {
			t.Fatalf("the takeover found %d tensors read ahead with NoReadAhead", hits)
		}
	})
}

// TestWarmestStandbyTakesOver: of two standbys, the one that read the
// device's checkpoint ahead takes the device over, the one that could not
// (its budget holds no tensor) leaving the lease to it.
func TestWarmestStandbyTakesOver(t *testing.T) {
	// Long enough that the warm standby takes the lease first on any
	// machine; put back once the rig's workers have stopped (cleanups run
	// last registered first).
	lag := maxTakeoverLag
	maxTakeoverLag = 10 * time.Second
	t.Cleanup(func() { maxTakeoverLag = lag })
	r := newReadAheadRig(t)
	cold := r.start("cold", func(c *Config) { c.Devices[0].Budget = 1 << 19 })
	r.standby()
	r.warmBytes(4 << 20)
	cd := cold.devices[0]
	checkUntil(t, 20*time.Second, func() error {
		if got := cd.warmWant.Load(); got != 1<<19 {
			return fmt.Errorf("the cold standby wants %d bytes read ahead, want its budget", got)
		}
		return nil
	})
	if lag := cd.takeoverLag(); lag != maxTakeoverLag {
		t.Fatalf("the cold standby's lag is %v, want %v", lag, maxTakeoverLag)
	}
	if lag := r.second.devices[0].takeoverLag(); lag != 0 {
		t.Fatalf("the warm standby's lag is %v, want 0", lag)
	}
	r.takeOver(1, 2, 3, 4)
	if hits := r.second.devices[0].m.warmHits.Load(); hits != 4 {
		t.Fatalf("the warm standby restored %d tensors read ahead, want 4 (it did not take the device over?)\n%s", hits, r.logs)
	}
	if cd.serving() {
		t.Fatal("the cold standby serves the device too")
	}
}

// uploadOnly is a backend with nothing but kernels.Backend's methods: no
// uninitialised allocation, no wrapping of host memory.
type uploadOnly struct{ kernels.Backend }

// TestStandbyReadsEarly: a tensor object stored for a checkpoint not yet
// committed is read as soon as it is stored; one that no checkpoint
// names by the second commit after it is let go.
func TestStandbyReadsEarly(t *testing.T) {
	r := newReadAheadRig(t)
	r.standby()
	r.warmBytes(4 << 20)
	data := bytes.Repeat([]byte{7}, 1<<20)
	sum := sha256.Sum256(data)
	if _, err := r.obj.PutBytes(context.Background(), tensorObject("cpu-0", hex.EncodeToString(sum[:])), data); err != nil {
		t.Fatal(err)
	}
	r.warmBytes(5 << 20)
	r.checkpoint(`{"op":"full","out":[5],"shape":[4],"value":5}`)
	r.checkpoint(`{"op":"full","out":[6],"shape":[4],"value":6}`)
	r.warmBytes(4 << 20)
	r.takeOver(1, 2, 3, 4)
}
