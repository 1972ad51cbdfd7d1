package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// Quotas across the fabric.
//
// A tenant's quotas (codec.Tenant) bound its use of every device together.
// A device counts its own use exactly, and the other devices' as their
// registry entries last reported it (each heartbeat, codec.Device.Tenants):
// the device's worker sums the other serving devices' entries into a view
// (codec.QuotaView) and, when the view changes, publishes it into the
// device's own frames. The device takes the view at its place in the
// stream, and its checkpoints keep the view in effect (and the frame
// quota's buckets, which run on the stream's times), so a replay after a
// takeover decides each frame as its first run did: the same sessions
// admitted, the same frames and allocations refused. A tenant's use of
// another device counts from that device's next heartbeat: a tenant busy on
// several devices at once can pass a quota, for a heartbeat or two, by what
// it takes on them meanwhile.

// tenantUse is a tenant's use of one device. Device loop only (a job
// loop's own, for its device).
type tenantUse struct {
	// held is the tensor bytes of the tenant's sessions on the device.
	held int64
	// frames counts the tenant's frames the device admitted; noted is
	// frames as of the last noteUse.
	frames, noted uint64
	// tokens and at are the frame quota's bucket: refilled at the
	// tenant's share of its frames per second, holding at most one
	// second's worth (and at least one frame); at is the stream's time of
	// the last frame rated. Checkpoints keep them (ckptBucket).
	tokens float64
	at     time.Time
}

// useOf is tenant's use of the device, made on first use. Device loop only.
func (d *device) useOf(tenant string) *tenantUse {
	u := d.tenantUses[tenant]
	if u == nil {
		if d.tenantUses == nil {
			d.tenantUses = map[string]*tenantUse{}
		}
		u = &tenantUse{}
		d.tenantUses[tenant] = u
	}
	return u
}

// elsewhere is the tenant's use of the other devices as of the device's
// view. Device loop only.
func (d *device) elsewhere(tenant string) codec.TenantUse {
	if v := d.view.Load(); v != nil {
		return v.Tenants[tenant]
	}
	return codec.TenantUse{}
}

// allowFrame takes a frame of tenant from its bucket on this device; false
// when the tenant is over its frames per second. Its share here is the
// quota less what the other devices ran for it, and at least an equal share
// among the devices running its frames, so that a tenant busy on several
// devices settles at its quota in all.
func (d *device) allowFrame(u *tenantUse, tenant string, rec *codec.Tenant, now time.Time) bool {
	if rec.FPS <= 0 {
		return true
	}
	rate := rec.FPS
	if e := d.elsewhere(tenant); e.FPS > 0 {
		rate = max(rec.FPS/float64(e.Devices+1), rec.FPS-e.FPS)
	}
	burst := max(1, rate)
	switch {
	case u.at.IsZero():
		u.tokens, u.at = burst, now
	case now.After(u.at): // a stream leader on another node may stamp earlier
		u.tokens = min(burst, u.tokens+now.Sub(u.at).Seconds()*rate)
		u.at = now
	}
	if u.tokens < 1 {
		return false
	}
	u.tokens--
	return true
}

// quotaBytes is the byte quota's error when the session's tenant, with n
// more bytes, would hold more than its quota on all devices.
func (x *exec) quotaBytes(n int64) error {
	s := x.s
	if s.st == nil || s.use == nil {
		return nil
	}
	rec := s.st.rec.Load()
	if rec == nil || rec.Bytes <= 0 {
		return nil
	}
	there := x.d.elsewhere(s.tenant).Bytes
	if s.use.held+there+n > rec.Bytes {
		return failf(codec.CodeQuota, "tenant %s's byte quota: %d bytes held on device %s and %d on others, %d more asked, quota %d",
			s.tenant, s.use.held, x.d.cfg.Name, there, n, rec.Bytes)
	}
	return nil
}

// quotaSessions is the session quota's error when a new session of tenant
// would pass its quota on all devices. Device loop only.
func (d *device) quotaSessions(tenant string, rec *codec.Tenant) *opError {
	if rec.Sessions <= 0 {
		return nil
	}
	here, there := d.tenantSessions(tenant), d.elsewhere(tenant).Sessions
	if here+there >= rec.Sessions {
		return failf(codec.CodeQuota, "tenant %s's session quota of %d: %d live on device %s and %d on others; the frame was not run",
			tenant, rec.Sessions, here, d.cfg.Name, there)
	}
	return nil
}

// tenantSessions counts tenant's live sessions on the device. Loop only.
func (d *device) tenantSessions(tenant string) int {
	n := 0
	p := tenant + "."
	for k := range d.sessions {
		if strings.HasPrefix(k, p) {
			n++
		}
	}
	return n
}

// maxViewTenants bounds the tenants of a view a device takes.
const maxViewTenants = 1 << 16

// applyView takes a view frame's body as the device's view; a body that is
// not a valid view is logged and changes nothing. Device loop only.
func (d *device) applyView(data []byte, seq uint64) {
	v, err := decodeView(data)
	if err != nil {
		d.w.logf("worker: %s: quota view at sequence %d ignored: %v", d.cfg.Name, seq, err)
		return
	}
	d.view.Store(v)
	d.m.views.Add(1)
}

// decodeView decodes and checks a view frame's body.
func decodeView(data []byte) (*codec.QuotaView, error) {
	var v codec.QuotaView
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("not a quota view: %w", err)
	}
	if len(v.Tenants) > maxViewTenants {
		return nil, fmt.Errorf("%d tenants, at most %d", len(v.Tenants), maxViewTenants)
	}
	for tn, u := range v.Tenants {
		if err := subjects.ValidateTenant(tn); err != nil {
			return nil, err
		}
		if u.Sessions < 0 || u.Bytes < 0 || u.Devices < 0 || u.FPS < 0 || math.IsNaN(u.FPS) || math.IsInf(u.FPS, 0) {
			return nil, fmt.Errorf("tenant %s: use %+v: negative or not finite", tn, u)
		}
	}
	return &v, nil
}

// noteUse publishes each tenant's use of the device for its registry
// entry: live sessions, bytes held, and the frames a second admitted since
// the last note. A tenant with no session, no bytes and no frame bucket on
// the device is forgotten. Device loop only (housekeeping).
func (d *device) noteUse(now time.Time) {
	if !d.w.cfg.Tenants {
		return
	}
	use := map[string]codec.TenantUse{}
	for _, s := range d.sessions {
		if s.tenant != "" {
			u := use[s.tenant]
			u.Sessions++
			use[s.tenant] = u
		}
	}
	el := now.Sub(d.usedAt).Seconds()
	for tn, tu := range d.tenantUses {
		u, live := use[tn]
		if !live && tu.held == 0 && tu.at.IsZero() {
			// No session refers to it, and it has no bucket that a
			// replay would need as it is.
			delete(d.tenantUses, tn)
			continue
		}
		u.Bytes = tu.held
		if tu.frames > tu.noted && !d.usedAt.IsZero() && el > 0 {
			u.FPS = float64(tu.frames-tu.noted) / el
		}
		tu.noted = tu.frames
		if u != (codec.TenantUse{}) {
			use[tn] = u
		}
	}
	d.usedAt = now
	d.useSnap.Store(&use)
}

// used is the tenants' use of the device as of its last noteUse.
func (d *device) used() map[string]codec.TenantUse {
	if p := d.useSnap.Load(); p != nil && len(*p) > 0 {
		return *p
	}
	return nil
}

// watchUse follows the registry entries, for the views, until Stop.
func (w *Worker) watchUse() error {
	watcher, err := w.ctrl.Watch(w.ctx, subjects.DeviceKeys)
	if err != nil {
		return fmt.Errorf("worker: watch the registry: %w", err)
	}
	w.tn.entries = map[string]codec.Device{}
	w.follow(watcher, func() {}, w.noteEntry)
	return nil
}

// noteEntry keeps the tenants' use that a registry entry reports.
func (w *Worker) noteEntry(e jetstream.KeyValueEntry) {
	name := strings.TrimPrefix(e.Key(), subjects.DeviceKey(""))
	var dev codec.Device
	if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &dev) == nil && len(dev.Tenants) > 0 {
		w.tn.mu.Lock()
		w.tn.entries[name] = dev
		w.tn.mu.Unlock()
		return
	}
	w.tn.mu.Lock()
	delete(w.tn.entries, name)
	w.tn.mu.Unlock()
}

// viewOf sums the tenants' use of the serving devices other than device
// whose heartbeat is recent, for the tenants with a quota.
func (w *Worker) viewOf(device string, now time.Time) map[string]codec.TenantUse {
	v := map[string]codec.TenantUse{}
	w.tn.mu.Lock()
	defer w.tn.mu.Unlock()
	for name, e := range w.tn.entries {
		if name == device || e.State != "serving" || now.Sub(e.Beat) > ClaimLive {
			continue
		}
		for tn, u := range e.Tenants {
			st := w.tn.recs[tn]
			if st == nil {
				continue
			}
			if rec := st.rec.Load(); rec == nil || rec.Sessions <= 0 && rec.Bytes <= 0 && rec.FPS <= 0 {
				continue
			}
			s := v[tn]
			s.Sessions += u.Sessions
			s.Bytes += u.Bytes
			s.FPS += u.FPS
			if u.FPS > 0 {
				s.Devices++
			}
			v[tn] = s
		}
	}
	for tn, u := range v {
		u.FPS = roundRate(u.FPS)
		v[tn] = u
	}
	return v
}

// roundRate keeps two significant digits of a rate, so that a tenant's
// steady rate elsewhere does not make a new view every heartbeat.
func roundRate(r float64) float64 {
	if r <= 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(r))-1)
	return math.Round(r/p) * p
}

// publishViews publishes, for each device the worker serves, its view of
// the other devices when it differs from the view the device holds (taken
// from its stream, or restored), unless the same view was published a
// moment ago and is still on its way. Heartbeat goroutine only.
func (w *Worker) publishViews() {
	now := time.Now()
	for _, d := range w.allDevices() {
		if !d.serving() {
			continue
		}
		v := w.viewOf(d.cfg.Name, now)
		var held map[string]codec.TenantUse
		if cur := d.view.Load(); cur != nil {
			held = cur.Tenants
		}
		if maps.Equal(v, held) || d.viewSent.ok && maps.Equal(v, d.viewSent.view) && now.Sub(d.viewSent.at) < 4*w.cfg.Heartbeat {
			continue
		}
		b, err := json.Marshal(codec.QuotaView{Tenants: v})
		if err == nil {
			ctx, cancel := context.WithTimeout(w.ctx, w.cfg.Heartbeat)
			_, err = w.js.Publish(ctx, w.names.QuotaView(d.cfg.Name), b, jetstream.WithExpectStream(w.names.OpsStream()))
			cancel()
		}
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				w.logf("worker: %s: publish the quota view: %v", d.cfg.Name, err)
			}
			continue
		}
		d.viewSent.ok, d.viewSent.view, d.viewSent.at = true, v, now
	}
}
