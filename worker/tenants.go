package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// tenants is what a worker with Config.Tenants knows of the fabric's
// tenants: their records (quotas), watched in the control bucket, their
// use of the devices as the registry reports it, and their object buckets.
type tenants struct {
	mu     sync.Mutex
	recs   map[string]*tenantState
	stores map[string]objectstore.Lanes
	// looked: when a record the watch had not brought was last looked up
	// (at most once a tenantLookup for a name: a tenant with credentials
	// and no record cannot make every frame a round trip).
	looked map[string]time.Time
	// entries are the registry entries that report tenants' use, by
	// device, for the quota views (quota.go).
	entries map[string]codec.Device
}

// tenantState is one tenant's record on this worker.
type tenantState struct {
	rec atomic.Pointer[codec.Tenant]
	// signed is when rec was signed: an older record never replaces it.
	// Under tenants.mu.
	signed time.Time
}

// watchTenants follows the tenant records in the control bucket until
// Stop; it returns once the records present now are loaded.
func (w *Worker) watchTenants(ctx context.Context) error {
	w.tn.recs = map[string]*tenantState{}
	w.tn.stores = map[string]objectstore.Lanes{}
	watcher, err := w.ctrl.Watch(w.ctx, subjects.TenantKeys)
	if err != nil {
		return fmt.Errorf("worker: watch tenant records: %w", err)
	}
	loaded := make(chan struct{})
	once := sync.OnceFunc(func() { close(loaded) })
	w.follow(watcher, once, func(e jetstream.KeyValueEntry) {
		if testHookTenantWatch != nil {
			testHookTenantWatch()
		}
		w.noteTenant(e)
	})
	select {
	case <-loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("worker: tenant records: %w", ctx.Err())
	}
}

// follow runs note on each entry that watcher brings, on a goroutine of
// its own, until Stop or the watcher's end, and then stops it; caught up
// runs once the values present at the start are in, or at the end.
func (w *Worker) follow(watcher jetstream.KeyWatcher, caughtUp func(), note func(jetstream.KeyValueEntry)) {
	w.wg.Go(func() {
		defer func() { _ = watcher.Stop() }()
		defer caughtUp()
		for {
			select {
			case <-w.stop:
				return
			case e, ok := <-watcher.Updates():
				switch {
				case !ok:
					return
				case e == nil:
					caughtUp()
				default:
					note(e)
				}
			}
		}
	})
}

// testHookTenantWatch, when set (by tests, before a worker starts), runs
// in the watch of the tenant records before each record it brings.
var testHookTenantWatch func()

// noteTenant takes a new value of a tenant's record if the fabric's
// account signed it, for that tenant, no earlier than the record held.
// Anything else (a deletion, a value written by someone else, an older
// record) is ignored: the record held stays.
func (w *Worker) noteTenant(e jetstream.KeyValueEntry) {
	name := strings.TrimPrefix(e.Key(), subjects.TenantKey(""))
	if e.Operation() != jetstream.KeyValuePut {
		w.logf("worker: tenant record %s deleted; the record held stays (tenants are removed by revoking their credentials)", name)
		return
	}
	rec, signed, err := tenant.VerifyRecord(e.Value(), w.cfg.TenantIssuer, name)
	if err != nil {
		w.logf("worker: tenant record %s at revision %d ignored: %v", name, e.Revision(), err)
		return
	}
	w.tn.mu.Lock()
	defer w.tn.mu.Unlock()
	st := w.tn.recs[name]
	if st == nil {
		st = &tenantState{}
		w.tn.recs[name] = st
	}
	if signed.Before(st.signed) {
		w.logf("worker: tenant record %s signed at %v ignored: the record held was signed at %v", name, signed, st.signed)
		return
	}
	st.signed = signed
	st.rec.Store(&rec)
}

// tenantLookup bounds the look-up of a record the watch has not brought,
// and is the least time between two of one name.
const tenantLookup = 2 * time.Second

// tenant returns tenant name's state, or a permission error when the
// fabric has no record of it (deleted, or added without provisioning).
func (w *Worker) tenant(name string) (*tenantState, *codec.Tenant, error) {
	w.tn.mu.Lock()
	st := w.tn.recs[name]
	lookUp := st == nil && time.Since(w.tn.looked[name]) >= tenantLookup
	if lookUp {
		if w.tn.looked == nil {
			w.tn.looked = map[string]time.Time{}
		}
		w.tn.looked[name] = time.Now()
	}
	w.tn.mu.Unlock()
	if lookUp {
		// Provisioned a moment ago, its record may still be on its way
		// to the watch: look it up.
		ctx, cancel := context.WithTimeout(w.ctx, tenantLookup)
		if e, err := w.ctrl.Get(ctx, subjects.TenantKey(name)); err == nil {
			w.noteTenant(e)
		}
		cancel()
		w.tn.mu.Lock()
		st = w.tn.recs[name]
		w.tn.mu.Unlock()
	}
	if st == nil {
		return nil, nil, failf(codec.CodePermission, "tenant %s has no record in %s (provision it: jetfabric tenant add --server)", name, w.names.CtrlBucket())
	}
	rec := st.rec.Load()
	if rec == nil {
		return nil, nil, failf(codec.CodePermission, "tenant %s was removed", name)
	}
	return st, rec, nil
}

// tenantStore is tenant's object bucket on every transfer lane, opened
// on first use.
func (w *Worker) tenantStore(tenant string) (objectstore.Lanes, error) {
	w.tn.mu.Lock()
	s := w.tn.stores[tenant]
	w.tn.mu.Unlock()
	if s != nil {
		return s, nil
	}
	// Opened without the lock (it asks the server); two at once keep
	// the first.
	bucket := w.names.TenantXferBucket(tenant)
	s, err := w.openLanes(bucket)
	if err != nil {
		if errors.Is(err, objectstore.ErrBucketNotFound) {
			return nil, failf(codec.CodePermission, "tenant %s has no object bucket %s (provision it: jetfabric tenant add --server)", tenant, bucket)
		}
		return nil, failf(codec.CodeUnavailabe, "tenant %s: bucket %s: %v", tenant, bucket, err)
	}
	w.tn.mu.Lock()
	defer w.tn.mu.Unlock()
	if first := w.tn.stores[tenant]; first != nil {
		return first, nil
	}
	w.tn.stores[tenant] = s
	return s, nil
}

// objects is the bucket of the session's uploads and large results: the
// tenant's own, or the shared transfer bucket.
func (x *exec) objects() (*objectstore.Store, error) {
	lanes, err := x.lanes()
	if err != nil {
		return nil, err
	}
	return lanes[0], nil
}

// lanes is the session's bucket (see objects) on every transfer lane.
func (x *exec) lanes() (objectstore.Lanes, error) {
	if x.s.tenant == "" {
		return x.d.w.xfer, nil
	}
	return x.d.w.tenantStore(x.s.tenant)
}
