package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/natsconn"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/subjects"
)

// Device is a device's registry entry.
type Device = codec.Device

// Client is a connection to a fabric.
type Client struct {
	opts  options
	names subjects.Names
	nc    *nats.Conn
	owns  bool
	js    jetstream.JetStream

	mu       sync.Mutex
	sessions map[string]*Session // by op subject, for the stream's acknowledgements
	closed   bool

	// laneJS are the JetStreams of the connections laneNC dialled beside
	// the client's own (see lanesOf), dialled once; lanes holds each
	// bucket on all of them. laneMu guards the three, apart from mu,
	// since dialling takes a while.
	laneMu sync.Mutex
	dialed bool
	laneJS []jetstream.JetStream
	laneNC []*nats.Conn
	lanes  map[string]objectstore.Lanes

	// redeliv publishes again the frames whose publish failed (see
	// redelivery); its goroutine runs from newClient to Close.
	redeliv redelivery
	// beating: the heartbeat goroutine runs (started by the first Open);
	// stop ends it and the redelivery goroutine, and wg waits for them.
	beating bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// Connect dials url and returns a client that owns the connection. A
// failure is a *ConnectError, which says what it most likely means.
func Connect(url string, opts ...Option) (*Client, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	// Reconnect for ever, trying the other nodes of a cluster at once and
	// a node tried lately after a short wait, so that the connection moves
	// to a surviving node by itself.
	nopts := append([]nats.Option{nats.Name("jetfabric-client"), nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, time.Second)}, o.natsOpts...)
	if t := o.tenantName(); t != "" {
		names, err := subjects.New(o.prefix)
		if err != nil {
			return nil, err
		}
		if names, err = names.ForTenant(t); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidOption, err)
		}
		nopts = append(nopts, nats.CustomInboxPrefix(names.InboxPrefix()))
	}
	nc, err := nats.Connect(url, nopts...)
	if err != nil {
		return nil, connectError(url, o, err)
	}
	c, err := newClient(nc, o)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.owns = true
	return c, nil
}

// New returns a client on an existing connection, which the caller keeps
// and closes.
func New(nc *nats.Conn, opts ...Option) (*Client, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	return newClient(nc, o)
}

func buildOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

func newClient(nc *nats.Conn, o options) (*Client, error) {
	names, err := subjects.New(o.prefix)
	if err != nil {
		return nil, err
	}
	if names, err = names.ForTenant(o.tenantName()); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	if t := names.Tenant(); t != "" && nc.Opts.InboxPrefix != names.InboxPrefix() {
		return nil, fmt.Errorf("%w: tenant %s's connection needs the inbox prefix %s (nats.CustomInboxPrefix), has %q", ErrInvalidOption, t, names.InboxPrefix(), nc.Opts.InboxPrefix)
	}
	c := &Client{opts: o, names: names, nc: nc, sessions: map[string]*Session{}, stop: make(chan struct{})}
	c.redeliv.pending = map[string]*undelivered{}
	c.redeliv.wake = make(chan struct{}, 1)
	c.js, err = jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(o.window),
		// An acknowledgement lost with a node (a leader shutting down
		// with the frame in hand) would otherwise be waited for for ever:
		// the frame is published again (same Nats-Msg-Id) after this.
		jetstream.WithPublishAsyncTimeout(ackTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) { c.published(m, nil) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { c.published(m, err) }))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c.wg.Go(c.redeliverLoop)
	return c, nil
}

// ackTimeout bounds the wait for the stream's acknowledgement of a frame
// published asynchronously.
const ackTimeout = 2 * time.Second

// published hands the stream's answer to an acknowledged publish (err nil
// when it stored the message) to the session whose frame it was. Answers
// to other publishes on the client's JetStream context (the object store's
// chunks) find no session.
func (c *Client) published(m *nats.Msg, err error) {
	c.mu.Lock()
	s := c.sessions[m.Subject]
	c.mu.Unlock()
	if s != nil {
		s.published(m, err)
	}
}

// Conn is the underlying NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Devices lists the registered devices, sorted by name. It lists the keys
// from the bucket's stream state and reads each one, so an entry being
// refreshed while it lists is never missed.
func (c *Client) Devices(ctx context.Context) ([]Device, error) {
	if c.names.Tenant() != "" {
		return c.tenantDevices(ctx)
	}
	kv, err := c.js.KeyValue(ctx, c.names.CtrlBucket())
	if err != nil {
		return nil, fmt.Errorf("client: device registry %s: %w", c.names.CtrlBucket(), err)
	}
	stream, err := c.js.Stream(ctx, c.names.CtrlStream())
	if err != nil {
		return nil, fmt.Errorf("client: device registry: %w", err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.names.CtrlSubject(subjects.DeviceKeys)))
	if err != nil {
		return nil, fmt.Errorf("client: device registry: %w", err)
	}
	prefix := c.names.CtrlSubject("")
	var devs []Device
	for subj := range info.State.Subjects {
		key := strings.TrimPrefix(subj, prefix)
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("client: registry entry %s: %w", key, err)
		}
		var d Device
		if err := json.Unmarshal(e.Value(), &d); err != nil {
			return nil, fmt.Errorf("client: registry entry %s: %w", key, err)
		}
		devs = append(devs, d)
	}
	slices.SortFunc(devs, func(a, b Device) int { return compareNames(a.Name, b.Name) })
	return devs, nil
}

// compareNames orders cpu-2 before cpu-10.
func compareNames(a, b string) int {
	if len(a) != len(b) {
		ia, ib := lastDigits(a), lastDigits(b)
		if a[:ia] == b[:ib] {
			return len(a) - len(b)
		}
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func lastDigits(s string) int {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	return i
}

// Live reports whether a registry entry is a serving device whose last
// heartbeat is recent.
func Live(d Device, now time.Time) bool {
	return d.State == "serving" && now.Sub(d.Beat) < 10*time.Second
}

// Open starts a session on device. The device must be registered and live.
func (c *Client) Open(ctx context.Context, device string) (*Session, error) {
	if err := subjects.ValidateDevice(device); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	value, err := c.deviceEntry(ctx, device)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("%w: %s is not registered (jetfabric devices lists them)", ErrNoDevice, device)
	} else if err != nil {
		return nil, fmt.Errorf("client: device registry: %w", err)
	}
	var d Device
	if err := json.Unmarshal(value, &d); err != nil {
		return nil, fmt.Errorf("client: registry entry %s: %w", device, err)
	}
	if !Live(d, time.Now()) && c.names.Tenant() != "" {
		// A tenant's direct get may be answered by a replica that has
		// not caught up: the registry service reads the leader's.
		if ld, ok, err := c.tenantDevice(ctx, device); err == nil && ok {
			d = ld
		}
	}
	if !Live(d, time.Now()) {
		return nil, fmt.Errorf("%w: %s is %s, last heartbeat %v ago", ErrNoDevice, device, d.State, time.Since(d.Beat).Round(time.Second))
	}
	s, err := newSession(c, device)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		s.sub.Unsubscribe()
		return nil, ErrClosed
	}
	c.sessions[s.subject] = s
	if !c.beating && c.opts.heartbeat > 0 {
		c.beating = true
		c.wg.Go(c.heartbeat)
	}
	return s, nil
}

// deviceEntry reads a device's registry entry: through the bucket, or
// for a tenant by a direct get of its key. A missing entry is
// jetstream.ErrKeyNotFound.
func (c *Client) deviceEntry(ctx context.Context, device string) ([]byte, error) {
	if c.names.Tenant() != "" {
		v, err := c.registryEntry(ctx, device)
		if errors.Is(err, errKeyNotFound) {
			// Any replica answers a direct get, one just started again
			// perhaps before it caught up: before calling the device
			// unregistered, ask the registry service, which reads the
			// leader's.
			d, ok, lerr := c.tenantDevice(ctx, device)
			if lerr != nil || !ok {
				return nil, jetstream.ErrKeyNotFound
			}
			return json.Marshal(d)
		}
		return v, err
	}
	kv, err := c.js.KeyValue(ctx, c.names.CtrlBucket())
	if err != nil {
		return nil, err
	}
	e, err := kv.Get(ctx, subjects.DeviceKey(device))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// A key-value get is a direct get, which any replica answers: one
		// on a cluster node just started again may not have caught up
		// yet. Before calling the device unregistered, ask the leader.
		return c.leaderEntry(ctx, subjects.DeviceKey(device))
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

// leaderEntry reads key of the control bucket from its stream's leader
// (STREAM.MSG.GET, not a direct get). A missing or deleted key is
// jetstream.ErrKeyNotFound.
func (c *Client) leaderEntry(ctx context.Context, key string) ([]byte, error) {
	stream := "KV_" + c.names.CtrlBucket()
	req, _ := json.Marshal(map[string]string{"last_by_subj": c.names.CtrlSubject(key)})
	m, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var r struct {
		Message *struct {
			Data []byte `json:"data"`
			Hdrs []byte `json:"hdrs"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", stream, err)
	}
	switch {
	case r.Error != nil && r.Error.Code == 404:
		return nil, jetstream.ErrKeyNotFound
	case r.Error != nil:
		return nil, fmt.Errorf("%s: %s (%d)", stream, r.Error.Description, r.Error.Code)
	case r.Message == nil:
		return nil, fmt.Errorf("%s: no message in the answer", stream)
	}
	// A delete or purge marker: the key is gone.
	if bytes.Contains(r.Message.Hdrs, []byte("KV-Operation")) {
		return nil, jetstream.ErrKeyNotFound
	}
	return r.Message.Data, nil
}

func (c *Client) forget(s *Session) {
	c.mu.Lock()
	delete(c.sessions, s.subject)
	c.mu.Unlock()
}

// objects is the transfer bucket on the client's own connection.
func (c *Client) objects() (*objectstore.Store, error) {
	lanes, err := c.transferLanes()
	if err != nil {
		return nil, err
	}
	return lanes[0], nil
}

// transferLanes is the transfer bucket on the client's lanes (see lanesOf).
func (c *Client) transferLanes() (objectstore.Lanes, error) {
	return c.lanesOf(c.names.XferBucket())
}

// lanesOf is bucket on WithLanes connections: the client's own and the
// others, dialled on first use with its connection's options. A lane that
// cannot be dialled (a tenant's connection limit, say) is done without.
func (c *Client) lanesOf(bucket string) (objectstore.Lanes, error) {
	c.laneMu.Lock()
	defer c.laneMu.Unlock()
	if l := c.lanes[bucket]; l != nil {
		return l, nil
	}
	if !c.dialed {
		c.dialLanes()
	}
	lanes, err := objectstore.NewLanes(append([]jetstream.JetStream{c.js}, c.laneJS...), bucket, objectstore.WithTimeout(c.opts.objectTimeout))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if c.lanes == nil {
		c.lanes = map[string]objectstore.Lanes{}
	}
	c.lanes[bucket] = lanes
	return lanes, nil
}

// dialLanes dials the lanes beside the client's connection, under laneMu;
// none once the client is closed (Close would not close them).
func (c *Client) dialLanes() {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return
	}
	c.dialed = true
	for i := 1; i < c.opts.lanes; i++ {
		nc, err := natsconn.Another(c.nc, fmt.Sprintf("%s lane %d", c.nc.Opts.Name, i+1))
		if err != nil {
			return
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return
		}
		c.laneJS = append(c.laneJS, js)
		c.laneNC = append(c.laneNC, nc)
	}
}

// Close closes every session's subscription and, if the client dialled
// the connection, the connection. It does not wait for workers; close
// sessions first to free their tensors.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sessions := make([]*Session, 0, len(c.sessions))
	for _, s := range c.sessions {
		sessions = append(sessions, s)
	}
	close(c.stop)
	c.mu.Unlock()
	c.wg.Wait()
	for _, s := range sessions {
		s.abandon()
	}
	c.laneMu.Lock()
	for _, nc := range c.laneNC {
		nc.Close()
	}
	c.laneNC = nil
	c.laneMu.Unlock()
	if c.owns {
		c.nc.Close()
	}
	return nil
}

// heartbeat tells the workers, every opts.heartbeat, that the client's
// open sessions are alive, so that a session waiting for its client (a
// long computation on the client's side, a person at a prompt) is not
// freed as idle. It publishes over core NATS and waits for nothing. It
// runs from the first Open until Close.
func (c *Client) heartbeat() {
	t := time.NewTicker(c.opts.heartbeat)
	defer t.Stop()
	var subjects []string
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		subjects = subjects[:0]
		c.mu.Lock()
		for _, s := range c.sessions {
			subjects = append(subjects, c.names.Alive(s.device, s.id))
		}
		c.mu.Unlock()
		for _, subj := range subjects {
			_ = c.nc.Publish(subj, nil) // a lost beat is made up by the next
		}
	}
}
