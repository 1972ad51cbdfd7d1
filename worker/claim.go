package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// ClaimLive is how recent a serving entry's heartbeat must be for its slot
// to count as taken; it is the client's rule for a live device.
const ClaimLive = 10 * time.Second

// ClaimMax is the default number of slots of a kind (kind-0 ... kind-ClaimMax-1).
const ClaimMax = 1024

// Claim asks for free device slots by kind instead of by name, so that
// identical workers (replicas of one service) each get their own devices
// without per-replica configuration.
type Claim struct {
	// Prefix names the registry bucket (default "fabric").
	Prefix string
	// Kind names the slots: kind-0, kind-1, ... ("cpu" gives cpu-N).
	Kind string
	// Count is the number of slots wanted; at least one.
	Count int
	// Worker is the id the claimed entries name; the worker's Config.ID.
	Worker string
	// Max bounds the slots tried (default ClaimMax).
	Max int
	// Heartbeat is the registry refresh interval of the claiming worker;
	// a live entry is one beaten within max(ClaimLive, 3*Heartbeat).
	Heartbeat time.Duration
}

func (c *Claim) validate() error {
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if c.Max == 0 {
		c.Max = ClaimMax
	}
	if _, err := subjects.New(c.Prefix); err != nil {
		return fmt.Errorf("%w: claim: %v", ErrInvalidConfig, err)
	}
	if c.Kind == "" {
		return fmt.Errorf("%w: claim: no device kind (e.g. cpu)", ErrInvalidConfig)
	}
	if err := subjects.ValidateDevice(c.Kind + "-0"); err != nil {
		return fmt.Errorf("%w: claim: kind %q: %v", ErrInvalidConfig, c.Kind, err)
	}
	if c.Count < 1 || c.Max < 1 || c.Count > c.Max {
		return fmt.Errorf("%w: claim: %d %s slots out of %d: want 1 to %d", ErrInvalidConfig, c.Count, c.Kind, c.Max, c.Max)
	}
	if c.Worker == "" {
		return fmt.Errorf("%w: claim: no worker id", ErrInvalidConfig)
	}
	return nil
}

// ClaimDevices reserves c.Count free slots named c.Kind-0, c.Kind-1, ...
// in the device registry for worker c.Worker and returns their names, lowest
// first. A slot is free if it has no registry entry, if its entry is not
// serving or its heartbeat is older than ClaimLive (3 heartbeats if longer),
// or if the entry already names c.Worker. Each reservation is a
// compare-and-set on the entry's revision, so workers claiming at once get
// distinct slots. A reserved entry keeps the slot's last applied sequence,
// so the worker that starts on it resumes where the previous owner stopped.
// It waits, until ctx ends, for the registry bucket to exist.
func ClaimDevices(ctx context.Context, nc *nats.Conn, c Claim) ([]string, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	names, _ := subjects.New(c.Prefix)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := waitProvisioned(ctx, js, names); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, names.CtrlBucket())
	if err != nil {
		return nil, fmt.Errorf("worker: bucket %s: %w", names.CtrlBucket(), err)
	}
	live := max(ClaimLive, 3*c.Heartbeat)
	var got []string
	for i := 0; i < c.Max && len(got) < c.Count; i++ {
		name := fmt.Sprintf("%s-%d", c.Kind, i)
		ok, err := claimSlot(ctx, kv, name, c.Kind, c.Worker, live)
		if err != nil {
			release(kv, got, c.Worker)
			return nil, err
		}
		if ok {
			got = append(got, name)
		}
	}
	if len(got) < c.Count {
		release(kv, got, c.Worker)
		return nil, fmt.Errorf("worker: claim: only %d of %d %s slots free among %s-0 to %s-%d (got %v)", len(got), c.Count, c.Kind, c.Kind, c.Kind, c.Max-1, got)
	}
	return got, nil
}

// release marks slots claimed by a failed claim stopped again.
func release(kv jetstream.KeyValue, slots []string, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range slots {
		e, err := kv.Get(ctx, subjects.DeviceKey(name))
		if err != nil {
			continue
		}
		var d codec.Device
		if json.Unmarshal(e.Value(), &d) != nil || d.Worker != id {
			continue
		}
		d.State, d.Beat = "stopped", time.Now().UTC()
		if b, err := json.Marshal(d); err == nil {
			_, _ = kv.Update(ctx, subjects.DeviceKey(name), b, e.Revision())
		}
	}
}

// claimSlot takes one slot if it is free, retrying when another claimer
// wrote the entry between the read and the write.
func claimSlot(ctx context.Context, kv jetstream.KeyValue, name, kind, id string, live time.Duration) (bool, error) {
	key := subjects.DeviceKey(name)
	for attempt := 0; ; attempt++ {
		var prev codec.Device
		var rev uint64
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return false, fmt.Errorf("worker: claim %s: registry: %w", name, err)
		default:
			rev = e.Revision()
			if json.Unmarshal(e.Value(), &prev) == nil && prev.Worker != id &&
				prev.State == "serving" && time.Since(prev.Beat) < live {
				return false, nil // served by a live worker
			}
		}
		now := time.Now().UTC()
		entry := codec.Device{
			Name: name, Kind: kind, Worker: id, Host: hostname(),
			Started: now, Beat: now, Applied: prev.Applied, State: "serving",
		}
		b, err := json.Marshal(entry)
		if err != nil {
			return false, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, b)
		} else {
			_, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, fmt.Errorf("worker: claim %s: %w", name, err)
		}
		if attempt >= 8 {
			return false, fmt.Errorf("worker: claim %s: the entry keeps changing: %w", name, err)
		}
		// Another worker wrote the entry first: read it again.
	}
}
