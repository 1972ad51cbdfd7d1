package broker

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
)

// Broker is an embedded nats-server with JetStream and the fabric's streams.
type Broker struct {
	cfg   Config
	names subjects.Names
	srv   *server.Server

	mu       sync.Mutex
	shutdown bool
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
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if cfg.Logs {
		srv.ConfigureLogger()
	}
	return &Broker{cfg: cfg, names: names, srv: srv}, nil
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
	}
	return opts, nil
}

// Start runs the server and returns once JetStream answers and the fabric's
// stream and buckets exist, or ctx ends, or Config.ReadyTimeout passes.
func (b *Broker) Start(ctx context.Context) error {
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
	if p.XferStorage == jetstream.MemoryStorage {
		// Transfers in memory: bound the bucket by what the server may
		// hold in memory, leaving half for everything else.
		if jc := b.srv.JetStreamConfig(); jc != nil && jc.MaxMemory > 0 && (p.XferMaxBytes == 0 || p.XferMaxBytes > jc.MaxMemory/2) {
			p.XferMaxBytes = jc.MaxMemory / 2
		}
	}
	// In a cluster the meta leader may still be settling: retry.
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		last = ProvisionStreams(pctx, js, b.names, p)
		pcancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker: provisioning did not finish: %w", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Ready waits until the server accepts connections and JetStream is
// healthy (in a cluster: has a meta leader).
func (b *Broker) Ready(ctx context.Context) error {
	for {
		if b.srv.ReadyForConnections(10 * time.Millisecond) {
			hs := b.srv.Healthz(&server.HealthzOptions{JSEnabledOnly: true})
			if hs.Status == "ok" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			hs := b.srv.Healthz(&server.HealthzOptions{JSEnabledOnly: true})
			return fmt.Errorf("broker: JetStream not ready: %w (health: %s %s)", ctx.Err(), hs.Status, hs.Error)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Connect opens a connection to this broker as a fabric service: in process
// when there is no listener, otherwise over its client URL, with the first
// configured user's credentials.
func (b *Broker) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name("jetfabric-broker")}, opts...)
	if len(b.cfg.Users) > 0 {
		opts = append(opts, nats.UserInfo(b.cfg.Users[0].Name, b.cfg.Users[0].Password))
	}
	url := ""
	if b.cfg.InProcess {
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

// ClientURL is the nats:// URL clients connect to (empty when in-process only).
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
	b.mu.Unlock()
	done := make(chan struct{})
	go func() {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("broker: shutdown: %w", ctx.Err())
	}
}
