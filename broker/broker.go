package broker

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// Broker is an embedded nats-server with JetStream and the fabric's streams.
type Broker struct {
	cfg   Config
	names subjects.Names
	srv   *server.Server
	// tls: the client listener requires TLS (from Config.TLS or the
	// configuration file), so the broker's own connections go in process.
	tls bool
	// auth is the auth directory (nil without one); viol counts the
	// refusals the server logs (with one).
	auth *tenant.Dir
	viol *violations
	// resolver holds the accounts' JWTs (auth only); reloads counts the
	// account JWTs applied after start (see watchAccount).
	resolver *server.MemAccResolver
	reloads  atomic.Uint64
	// accMu guards applied, the account JWTs in force by public key.
	accMu   sync.Mutex
	applied map[string]string

	mu       sync.Mutex
	shutdown bool
	// raft: Start set nats-server's raft timers for this node
	// (acquireRaftTimers); released once its server has shut down.
	raft  bool
	stops []func() // see Attach
	// registryConn answers the tenants' registry requests (auth only).
	registryConn *nats.Conn
}

// Attach registers stop, the end of a service running beside the broker
// on a connection to it (the sweeper of unrunnable frames, say): Shutdown
// calls it, latest attached first, before it stops the server.
func (b *Broker) Attach(stop func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stops = append(b.stops, stop)
}

// MetaLeader reports whether this node leads JetStream's meta group (a
// single node always does): services that must run once in a cluster
// run where it is true.
func (b *Broker) MetaLeader() bool {
	return !b.srv.JetStreamIsClustered() || b.srv.JetStreamIsLeader()
}

// New checks cfg and builds the server; Start runs it.
func New(cfg Config) (*Broker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	names, _ := subjects.New(cfg.Prefix)
	opts, err := serverOptions(cfg)
	if err != nil {
		return nil, err
	}
	var auth *tenant.Dir
	var res *server.MemAccResolver
	if cfg.AuthDir != "" {
		if auth, err = tenant.Load(cfg.AuthDir); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
		if res, err = operatorMode(opts, auth); err != nil {
			return nil, err
		}
		cfg.Provision.Tenants = true
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if cfg.Logs {
		srv.ConfigureLogger()
	}
	b := &Broker{cfg: cfg, names: names, srv: srv, tls: opts.TLSConfig != nil, auth: auth, resolver: res}
	if auth != nil {
		b.applied = maps.Clone(auth.Accounts)
		b.viol = &violations{inner: srv.Logger()}
		srv.SetLogger(b.viol, false, false)
	}
	return b, nil
}

func serverOptions(cfg Config) (*server.Options, error) {
	opts := &server.Options{}
	if cfg.ConfigFile != "" {
		var err error
		if opts, err = server.ProcessConfigFile(cfg.ConfigFile); err != nil {
			return nil, fmt.Errorf("%w: config file %s: %v", ErrInvalidConfig, cfg.ConfigFile, err)
		}
	}
	opts.ServerName = cfg.Name
	opts.Host = cfg.Host
	opts.Port = cfg.Port
	opts.DontListen = cfg.InProcess
	opts.HTTPHost = cfg.HTTPHost
	opts.HTTPPort = cfg.HTTPPort
	opts.MaxPayload = cfg.MaxPayload
	if opts.MaxPending < int64(cfg.MaxPayload) {
		opts.MaxPending = 64 << 20
	}
	opts.JetStream = true
	opts.StoreDir = cfg.StoreDir
	// Large objects are written as many chunks at once; a roomy ingest
	// queue keeps the server from refusing them under load.
	opts.StreamMaxBufferedSize = 1 << 30
	opts.StreamMaxBufferedMsgs = 1 << 20
	opts.NoSigs = true
	opts.NoLog = !cfg.Logs
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.serverTLS("client", false)
		if err != nil {
			return nil, err
		}
		opts.TLSConfig, opts.TLSVerify, opts.TLSTimeout = tc, cfg.TLS.Verify, tlsTimeout
	}
	// A cluster node shuts down in lame duck mode: it hands the leadership
	// of its streams, consumers and JetStream's meta group to the other
	// nodes first (elections that would otherwise wait for the raft's
	// election timeout, see RaftTimers), then closes its clients over a
	// few seconds, which reconnect to the others.
	opts.LameDuckDuration = 3 * time.Second
	opts.LameDuckGracePeriod = time.Second
	for _, u := range cfg.Users {
		opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password})
	}
	if c := cfg.Cluster; c.Name != "" {
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: c.Host, Port: c.Port}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("%w: route %q: %v", ErrInvalidConfig, r, err)
			}
			opts.Routes = append(opts.Routes, u)
		}
		if c.TLS.Enabled() {
			tc, err := c.TLS.serverTLS("route", true)
			if err != nil {
				return nil, err
			}
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, tlsTimeout
		}
	}
	return opts, nil
}

// Start runs the server and returns once JetStream answers and the fabric's
// stream and buckets exist, or ctx ends, or Config.ReadyTimeout passes.
//
// A cluster node first sets nats-server's raft timers to
// Config.Cluster.Raft (see RaftTimers); it fails when another node of
// this process runs with other timers.
func (b *Broker) Start(ctx context.Context) error {
	if b.cfg.Cluster.Name != "" {
		var err error
		b.mu.Lock()
		if !b.raft && !b.shutdown {
			if err = acquireRaftTimers(b.cfg.Cluster.raftTimers()); err == nil {
				b.raft = true
			}
		}
		b.mu.Unlock()
		if err != nil {
			return err
		}
	}
	go b.srv.Start()
	timeout := b.cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := b.Ready(ctx); err != nil {
		return err
	}
	nc, err := b.Connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	p := b.cfg.Provision
	// Results in memory: a quarter of what the server may hold in memory.
	if jc := b.srv.JetStreamConfig(); jc != nil && jc.MaxMemory > 0 && (p.ResultsMaxBytes == 0 || p.ResultsMaxBytes > jc.MaxMemory/4) {
		p.ResultsMaxBytes = jc.MaxMemory / 4
	}
	if p.XferStorage == jetstream.MemoryStorage {
		// Transfers in memory: bound the bucket by what the server may
		// hold in memory, leaving half for everything else.
		if jc := b.srv.JetStreamConfig(); jc != nil && jc.MaxMemory > 0 && (p.XferMaxBytes == 0 || p.XferMaxBytes > jc.MaxMemory/2) {
			p.XferMaxBytes = jc.MaxMemory / 2
		}
	}
	if b.cfg.Cluster.Name != "" && !b.srv.JetStreamIsLeader() {
		// Of nodes that ask for the same new stream at once, all but one
		// may get no answer: the other nodes let the meta leader's node
		// provision first, then check the configuration themselves (the
		// same, quick). A leader that does not get there lets them go on.
		wctx, wcancel := context.WithTimeout(ctx, leaderProvisions)
		_ = WaitProvisioned(wctx, js, b.names)
		wcancel()
	}
	// In a cluster the meta leader may still be settling: retry, waiting
	// longer each time.
	var last error
	for wait := time.Second; ; wait = min(2*wait, 5*time.Second) {
		pctx, pcancel := context.WithTimeout(ctx, wait)
		last = ProvisionStreams(pctx, js, b.names, p)
		if last == nil {
			last = b.provisionTenants(pctx, js, p)
		}
		pcancel()
		if last == nil {
			if b.auth == nil {
				return nil
			}
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				b.watchAccount(stop)
			}()
			b.Attach(func() { close(stop); <-done })
			return b.serveRegistry()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker: provisioning did not finish: %w", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// leaderProvisions is how long a cluster node that is not the meta leader
// waits for the leader's node to provision the fabric before it does.
const leaderProvisions = 10 * time.Second

// Ready waits until the server accepts connections and JetStream is
// healthy (in a cluster: has a meta leader).
func (b *Broker) Ready(ctx context.Context) error {
	// JSEnabledOnly answers ok as soon as JetStream runs; in a cluster
	// its API answers nothing until the nodes elect a meta leader (a
	// request made before waits out its whole timeout), which
	// JSMetaOnly waits for.
	health := &server.HealthzOptions{JSEnabledOnly: true}
	if b.cfg.Cluster.Name != "" {
		health = &server.HealthzOptions{JSMetaOnly: true}
	}
	for {
		if b.srv.ReadyForConnections(10 * time.Millisecond) {
			if hs := b.srv.Healthz(health); hs.Status == "ok" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			hs := b.srv.Healthz(health)
			why := ""
			if b.cfg.Cluster.Name != "" {
				why = fmt.Sprintf("; a node of cluster %s serves once a majority of its nodes (routes %s) have elected a meta leader: are they up?",
					b.cfg.Cluster.Name, strings.Join(b.cfg.Cluster.Routes, ", "))
			}
			return fmt.Errorf("broker: JetStream not ready: %w (health: %s %s)%s", ctx.Err(), hs.Status, hs.Error, why)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Connect opens a connection to this broker as a fabric service: in process
// when there is no listener or the listener requires TLS (the broker holds
// no client certificate of its own), otherwise over its client URL; with the
// first configured user's credentials.
func (b *Broker) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("jetfabric-broker")}, opts...)
	if len(b.cfg.Users) > 0 {
		opts = append(opts, nats.UserInfo(b.cfg.Users[0].Name, b.cfg.Users[0].Password))
	}
	if b.auth != nil {
		opts = append(opts, ServiceUser(b.auth))
	}
	url := ""
	if b.cfg.InProcess || b.tls {
		opts = append(opts, nats.InProcessServer(b.srv))
	} else {
		url = b.srv.ClientURL()
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("broker: connect: %w", err)
	}
	return nc, nil
}

// provisionTenants provisions every tenant of the auth directory.
func (b *Broker) provisionTenants(ctx context.Context, js jetstream.JetStream, p Provision) error {
	for _, t := range b.Tenants() {
		if err := ProvisionTenant(ctx, js, b.names, p, t, b.auth.Signed[t.Name]); err != nil {
			return err
		}
	}
	return nil
}

// ServiceUser is the nats.Option that authenticates as the service user
// of an auth directory.
func ServiceUser(d *tenant.Dir) nats.Option {
	tok, seed := d.ServiceJWT, d.ServiceSeed
	return nats.UserJWTAndSeed(tok, string(seed))
}

// ClientURL is the URL clients connect to: nats://host:port, or
// tls://host:port when the listener requires TLS (empty when in-process
// only).
func (b *Broker) ClientURL() string {
	if b.cfg.InProcess {
		return ""
	}
	return b.srv.ClientURL()
}

// MonitorURL is the http:// URL of the monitoring listener, or "".
func (b *Broker) MonitorURL() string {
	if a := b.srv.MonitorAddr(); a != nil {
		return "http://" + a.String()
	}
	return ""
}

// Server is the embedded nats-server, for in-process connections.
func (b *Broker) Server() *server.Server { return b.srv }

// Names are the fabric's subject and bucket names.
func (b *Broker) Names() subjects.Names { return b.names }

// Shutdown stops the server, waiting for it until ctx ends. It is safe to
// call more than once.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	if b.shutdown {
		b.mu.Unlock()
		return nil
	}
	b.shutdown = true
	stops := b.stops
	b.stops = nil
	rc := b.registryConn
	raft := b.raft
	b.mu.Unlock()
	if rc != nil {
		rc.Close()
	}
	done := make(chan struct{})
	go func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
		// (A server that never started listening has nothing to hand
		// over: lame duck mode returns at once.)
		if b.cfg.Cluster.Name != "" && b.srv.Running() {
			b.srv.LameDuckShutdown()
		}
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		if raft {
			releaseRaftTimers()
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("broker: shutdown: %w", ctx.Err())
	}
}
