package worker

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/jetfabric/jetfabric/subjects"
)

// ServiceVersion is the version a worker's micro service announces: the
// wire protocol's version, as semver.
const ServiceVersion = "1.0.0"

// stallAfter is how long a device loop may go without coming round before
// its health endpoint reports it stalled. The loop comes round at least
// once a second when idle; a frame running longer than this (a very large
// kernel) also reads as stalled until it ends.
const stallAfter = 5 * time.Second

// Health is the answer of a device's health endpoint
// (fabric.svc.<device>.health).
type Health struct {
	Device string `json:"device"`
	Worker string `json:"worker"`
	// Status is "ok" or "stalled".
	Status string `json:"status"`
	// LoopAge is how long ago the device loop last came round.
	LoopAge  time.Duration `json:"loop_age_ns"`
	Sessions int           `json:"sessions"`
	Applied  uint64        `json:"applied"`
	// Message says what is wrong when Status is not "ok".
	Message string `json:"message,omitempty"`
}

// startService registers the worker as one instance of the NATS micro
// service subjects.ServiceName, with an info and a health endpoint per
// device. `nats micro list` and `nats micro info jetfabric-worker` show it.
func (w *Worker) startService() error {
	svc, err := micro.AddService(w.nc, micro.Config{
		Name:        subjects.ServiceName,
		Version:     ServiceVersion,
		Description: "jetfabric worker: executes the op streams of its devices",
		Metadata: map[string]string{
			"worker":  w.cfg.ID,
			"host":    hostname(),
			"devices": strings.Join(w.Devices(), ","),
			"prefix":  w.names.Prefix(),
		},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			w.logf("worker: service: %v", e)
		},
	})
	if err != nil {
		return fmt.Errorf("worker: micro service: %w", err)
	}
	for _, d := range w.devices {
		meta := map[string]string{"device": d.cfg.Name, "kind": d.cfg.Kind, "backend": d.cfg.Backend.Name()}
		err := svc.AddEndpoint(d.cfg.Name+"-info", micro.HandlerFunc(func(r micro.Request) { w.serveInfo(d, r) }),
			micro.WithEndpointSubject(w.names.ServiceInfo(d.cfg.Name)), micro.WithEndpointMetadata(meta))
		if err == nil {
			err = svc.AddEndpoint(d.cfg.Name+"-health", micro.HandlerFunc(func(r micro.Request) { w.serveHealth(d, r) }),
				micro.WithEndpointSubject(w.names.ServiceHealth(d.cfg.Name)), micro.WithEndpointMetadata(meta))
		}
		if err != nil {
			_ = svc.Stop()
			return fmt.Errorf("worker: micro service endpoints of %s: %w", d.cfg.Name, err)
		}
	}
	w.svc = svc
	// The subscriptions reach the server before Start returns, so the
	// service is visible to anyone who asks after that. A broker lost in
	// the meantime fails the flush (nats.go ends the flushes in flight as
	// "connection closed" when it starts reconnecting), yet the
	// subscriptions are sent again on reconnect: only a closed connection
	// is an error.
	if err := w.nc.Flush(); err != nil {
		if w.nc.IsClosed() {
			return fmt.Errorf("worker: micro service: %w", err)
		}
		w.logf("worker: micro service: %v; its endpoints are subscribed again when the broker is back", err)
	}
	return nil
}

// stopService removes the worker's service instance; safe when none runs.
func (w *Worker) stopService() {
	if w.svc != nil {
		if err := w.svc.Stop(); err != nil {
			w.logf("worker: stop micro service: %v", err)
		}
	}
}

// serveInfo answers with the device's registry entry as it is now.
func (w *Worker) serveInfo(d *device, r micro.Request) {
	if !w.names.Answerable(r.Reply()) {
		return // see subjects.Names.Answerable
	}
	b, err := json.Marshal(w.entry(d, "serving"))
	if err != nil {
		_ = r.Error("500", err.Error(), nil)
		return
	}
	_ = r.Respond(b)
}

// serveHealth answers with Health; a stalled device loop or a stopping
// worker is a 503 service error carrying the same JSON.
func (w *Worker) serveHealth(d *device, r micro.Request) {
	if !w.names.Answerable(r.Reply()) {
		return // see subjects.Names.Answerable
	}
	age := time.Since(time.Unix(0, d.loopAt.Load()))
	h := Health{Device: d.cfg.Name, Worker: w.cfg.ID, Status: "ok", LoopAge: age,
		Sessions: int(d.sessionCount.Load()), Applied: d.applied.Load()}
	select {
	case <-w.stop:
		h.Status, h.Message = "stopped", "the worker is stopping"
	default:
		if age > stallAfter {
			h.Status = "stalled"
			h.Message = fmt.Sprintf("the device loop has not come round for %v (a long op, or stuck)", age.Round(time.Millisecond))
		}
	}
	b, _ := json.Marshal(h)
	if h.Status != "ok" {
		_ = r.Error("503", h.Message, b)
		return
	}
	_ = r.Respond(b)
}
