package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// Adopt makes a worker take over devices of a kind that lost their worker:
// a device whose lease has not been renewed for two lease TTLs (its worker
// died or hangs) or whose worker's connection has been gone for one (see
// holderGone), or one whose worker stopped cleanly while it still had
// sessions. The adopter restores the device's checkpoint and replays its
// frames, as a standby would, so the device's sessions carry on. Workers
// that claim slots (replicas of one service) adopt each other's devices
// when one of them dies; explicit standbys, which act after one TTL, win
// over adopters.
type Adopt struct {
	// Kind is the device kind adopted, e.g. "cpu" for cpu-N.
	Kind string
	// NewBackend makes the backend of an adopted device.
	NewBackend func() (kernels.Backend, error)
	// Max bounds how many devices the worker adopts (default 4).
	Max int
}

func (a *Adopt) validate() error {
	if err := subjects.ValidateToken(a.Kind); err != nil {
		return fmt.Errorf("%w: adopt kind: %v", ErrInvalidConfig, err)
	}
	if a.NewBackend == nil {
		return fmt.Errorf("%w: adopt: no backend constructor", ErrInvalidConfig)
	}
	if a.Max < 0 {
		return fmt.Errorf("%w: adopt: max %d", ErrInvalidConfig, a.Max)
	}
	return nil
}

// allDevices is the configured devices and the adopted ones.
func (w *Worker) allDevices() []*device {
	w.adoptMu.Lock()
	defer w.adoptMu.Unlock()
	return append(slices.Clip(w.devices), w.adopted...)
}

func (w *Worker) serves(name string) bool {
	return slices.ContainsFunc(w.allDevices(), func(d *device) bool { return d.cfg.Name == name })
}

// adoptLoop watches the registry for orphaned devices of the kind until
// the worker stops.
func (w *Worker) adoptLoop() {
	a := w.cfg.Adopt
	max := a.Max
	if max == 0 {
		max = 4
	}
	type seen struct {
		rev  uint64
		at   time.Time
		gone absence // of the lease's holder
	}
	last := map[string]seen{}
	t := time.NewTicker(w.cfg.LeaseTTL / 2)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		w.adoptMu.Lock()
		n := len(w.adopted)
		w.adoptMu.Unlock()
		if n >= max {
			continue
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.LeaseTTL)
		names, err := w.registered(ctx, a.Kind)
		for _, name := range names {
			if err != nil || w.serves(name) {
				continue
			}
			orphan := false
			e, lerr := w.ctrl.Get(ctx, subjects.LeaseKey(name))
			switch {
			case lerr == nil:
				s, ok := last[name]
				if !ok || s.rev != e.Revision() {
					last[name] = seen{rev: e.Revision(), at: time.Now()}
					break
				}
				// Unchanged since the last look, half a TTL ago: a live
				// holder has renewed it twice meanwhile. Is it gone?
				var held leaseValue
				_ = json.Unmarshal(e.Value(), &held)
				away := s.gone.look(holderGone(w.nc, w.names, held, w.cfg.LeaseTTL/8))
				last[name] = s
				orphan = time.Since(s.at) >= 2*w.cfg.LeaseTTL || away >= w.cfg.LeaseTTL
			case errors.Is(lerr, jetstream.ErrKeyNotFound) || errors.Is(lerr, jetstream.ErrKeyDeleted):
				// Nobody holds it: adopt it if it stopped with sessions.
				if re, err := w.ctrl.Get(ctx, subjects.DeviceKey(name)); err == nil {
					var d codec.Device
					orphan = json.Unmarshal(re.Value(), &d) == nil && d.State == "stopped" && d.Sessions > 0
				}
			}
			if orphan {
				delete(last, name)
				w.adopt(name)
				break // one at a time: the others may adopt the rest
			}
		}
		cancel()
	}
}

// registered lists the registry's devices of kind.
func (w *Worker) registered(ctx context.Context, kind string) ([]string, error) {
	stream, err := w.js.Stream(ctx, w.names.CtrlStream())
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(w.names.CtrlSubject(subjects.DeviceKey(kind+"-*"))))
	if err != nil {
		return nil, err
	}
	prefix := w.names.CtrlSubject(subjects.DeviceKey(""))
	names := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		names = append(names, strings.TrimPrefix(subj, prefix))
	}
	slices.Sort(names)
	return names, nil
}

// adopt starts serving an orphaned device.
func (w *Worker) adopt(name string) {
	b, err := w.cfg.Adopt.NewBackend()
	if err != nil {
		w.logf("worker: %s: cannot adopt: %v", name, err)
		return
	}
	d := newDevice(w, Device{Name: name, Kind: w.cfg.Adopt.Kind, Backend: b})
	d.adopting = true
	w.adoptMu.Lock()
	w.adopted = append(w.adopted, d)
	w.adoptMu.Unlock()
	w.logf("worker: %s: adopting: its worker is gone", name)
	w.wg.Go(func() {
		d.serve(make(chan error, 1))
		w.adoptMu.Lock()
		w.adopted = slices.DeleteFunc(w.adopted, func(x *device) bool { return x == d })
		if d.stopErr != nil {
			w.adoptErrs = append(w.adoptErrs, d.stopErr)
		}
		w.adoptMu.Unlock()
	})
}
