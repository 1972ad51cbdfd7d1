package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// brokerFlags are the flags of broker and up.
type brokerFlags struct {
	listen, http, store, config, name string
	maxPayload                        int
	users                             userList
	cluster, clusterListen, routes    string
	raftTimers                        string
	replicas                          int
	logs                              bool
	xferStorage                       string
	tlsCert, tlsKey, tlsCA            string
	tlsVerify                         bool
	auth                              string
	unservedGrace                     time.Duration
}

func (f *brokerFlags) register(fs *flag.FlagSet, listen string) {
	fs.StringVar(&f.listen, "listen", listen, "client listener host:port")
	fs.StringVar(&f.http, "http", "127.0.0.1:8222", "monitoring listener host:port (/healthz, /varz, /jsz); empty disables")
	fs.StringVar(&f.store, "store", os.Getenv("JETFABRIC_STORE"), "JetStream store directory (required; env JETFABRIC_STORE)")
	fs.StringVar(&f.config, "config", "", "nats-server configuration file, read first; flags override it")
	fs.StringVar(&f.name, "name", "jetfabric", "server name (unique per cluster node)")
	fs.IntVar(&f.maxPayload, "max-payload", 8<<20, "largest message in bytes")
	fs.Var(&f.users, "user", "name:password a client must present (repeatable; none: no auth)")
	fs.StringVar(&f.cluster, "cluster", "", "cluster name; set to join a JetStream cluster")
	fs.StringVar(&f.clusterListen, "cluster-listen", "0.0.0.0:6222", "route listener host:port, with -cluster")
	fs.StringVar(&f.routes, "routes", "", "comma-separated nats://host:port of every cluster node, with -cluster")
	fs.StringVar(&f.raftTimers, "raft-timers", "", "with -cluster: the raft's heartbeat,election-min,election-max, how soon the others replace a leader that died without handing over (empty or default: "+
		broker.DefaultRaftTimers().String()+"; nats: nats-server's own, "+broker.NATSRaftTimers().String()+")")
	fs.IntVar(&f.replicas, "replicas", 1, "replicas of the stream and buckets (3 in a cluster)")
	fs.BoolVar(&f.logs, "logs", false, "print the NATS server's own log")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate of the client listener (jetfabric certs writes one): clients must then use TLS; with -cluster the routes use it too, under mutual TLS")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key of -tls-cert")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "PEM certificates of the authorities that sign client certificates (with -tls-verify) and, with -cluster, the routes' peers")
	fs.BoolVar(&f.tlsVerify, "tls-verify", false, "require every client to present a certificate signed by -tls-ca")
	fs.StringVar(&f.auth, "auth", os.Getenv("JETFABRIC_AUTH"), "auth directory made by jetfabric tenant init: tenants, operator mode (env JETFABRIC_AUTH)")
	fs.DurationVar(&f.unservedGrace, "unserved-grace", 30*time.Second, "answer no_device to the frames of a device no worker served this long, and remove them (the broker leading JetStream does)")
	fs.StringVar(&f.xferStorage, "xfer-storage", "file", "where FABRIC_XFER keeps transfers, large uploads and results: file (survives a broker restart) or memory (faster; lost on restart)")
}

func (f *brokerFlags) brokerConfig() (broker.Config, error) {
	cfg := broker.DefaultConfig()
	var err error
	if cfg.Host, cfg.Port, err = hostPort(f.listen); err != nil {
		return cfg, fmt.Errorf("-listen: %w", err)
	}
	if f.http == "" {
		cfg.HTTPPort = 0
	} else if cfg.HTTPHost, cfg.HTTPPort, err = hostPort(f.http); err != nil {
		return cfg, fmt.Errorf("-http: %w", err)
	}
	cfg.StoreDir, cfg.ConfigFile, cfg.Name = f.store, f.config, f.name
	cfg.MaxPayload = int32(f.maxPayload)
	cfg.Users = f.users
	cfg.AuthDir = f.auth
	cfg.Logs = f.logs
	cfg.Provision.Replicas = f.replicas
	switch f.xferStorage {
	case "file", "":
		cfg.Provision.XferStorage = jetstream.FileStorage
	case "memory":
		cfg.Provision.XferStorage = jetstream.MemoryStorage
	default:
		return cfg, fmt.Errorf("-xfer-storage %q: want file or memory", f.xferStorage)
	}
	if cfg.Provision.OpsMaxMsgSize > cfg.MaxPayload {
		cfg.Provision.OpsMaxMsgSize = cfg.MaxPayload
	}
	cfg.TLS = broker.TLSConfig{CertFile: f.tlsCert, KeyFile: f.tlsKey, CAFile: f.tlsCA, Verify: f.tlsVerify}
	if f.cluster != "" {
		cfg.Cluster.Name = f.cluster
		if f.tlsCert != "" {
			if f.tlsCA == "" {
				return cfg, fmt.Errorf("-tls-cert with -cluster: the routes verify their peers by -tls-ca: give the CA that signed the nodes' certificates")
			}
			cfg.Cluster.TLS = broker.TLSConfig{CertFile: f.tlsCert, KeyFile: f.tlsKey, CAFile: f.tlsCA}
		}
		if cfg.Cluster.Host, cfg.Cluster.Port, err = hostPort(f.clusterListen); err != nil {
			return cfg, fmt.Errorf("-cluster-listen: %w", err)
		}
		if f.routes != "" {
			cfg.Cluster.Routes = strings.Split(f.routes, ",")
		}
		if f.raftTimers != "" {
			if cfg.Cluster.Raft, err = broker.ParseRaftTimers(f.raftTimers); err != nil {
				return cfg, fmt.Errorf("-raft-timers: %w", err)
			}
		}
	} else if f.raftTimers != "" {
		return cfg, fmt.Errorf("-raft-timers %q without -cluster: a single broker elects nothing", f.raftTimers)
	}
	return cfg, cfg.Validate()
}

func hostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return h, port, nil
}

type userList []broker.User

func (u *userList) String() string { return fmt.Sprint(len(*u), " users") }
func (u *userList) Set(s string) error {
	name, pass, ok := strings.Cut(s, ":")
	if !ok || name == "" || pass == "" {
		return fmt.Errorf("want name:password")
	}
	*u = append(*u, broker.User{Name: name, Password: pass})
	return nil
}

// workerFlags are the flags of worker and up.
type workerFlags struct {
	cpus       int
	devices    string
	idle       time.Duration
	id         string
	leaseTTL   time.Duration // 0: the worker default
	checkpoint time.Duration // 0: the worker default; negative: only on request
	jobs       string
	jobAckWait time.Duration
	adopt      bool
	gpus       string // all, N or none; "" (a literal workerFlags) is none
	tf32       bool
	noChains   bool
	noFusion   bool
	noPrograms bool
	syncColl   bool
	noAhead    bool
	cpuThreads int
	lanes      int // 0 (a literal workerFlags): the worker default
	// budget: bytes for every device (>0), or 0 and fraction (of each
	// device's memory; the host's shared among the CPU devices).
	budget   int64
	fraction float64
}

func (f *workerFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.cpus, "cpus", 1, "number of CPU devices to serve (cpu-0 ...), when -devices is empty")
	fs.StringVar(&f.devices, "devices", "", "comma-separated device names to serve, e.g. cpu-0,cpu-1")
	fs.DurationVar(&f.idle, "idle-timeout", 10*time.Minute, "free a session idle this long (0: never)")
	fs.StringVar(&f.id, "id", "", "worker id in the registry (default host-pid)")
	fs.StringVar(&f.gpus, "gpus", "all", "NVIDIA GPUs to serve as gpu-0 ...: all (those found; none without a driver), N (the first N) or none")
	fs.BoolVar(&f.noFusion, "no-fusion", false, "run every op by itself into fresh outputs, even where the backend could fuse runs of elementwise ops, fold a transpose into a matmul or write an output over a freed input")
	fs.BoolVar(&f.noPrograms, "no-programs", false, "replay captured graphs op by op on a GPU, instead of recording a replay's device work at its second run and launching it as one CUDA graph from then on (the same bits either way)")
	fs.IntVar(&f.cpuThreads, "cpu-threads", 0, "goroutines one op on a CPU device splits its work over (0: GOMAXPROCS); with fewer than GOMAXPROCS, the processors left over serve the network and collectives while ops run")
	fs.IntVar(&f.lanes, "lanes", worker.DefaultLanes(), "connections that move a large upload or result as pieces in parallel when the broker keeps transfers in memory, 1 to 16 (default: one for every four cores, up to 4); 1 moves every object whole on one connection")
	fs.BoolVar(&f.syncColl, "sync-collectives", false, "run each collective to its end before the device's next op, even on a CPU device, where by default it runs beside the ops that do not read its output")
	fs.BoolVar(&f.noAhead, "no-read-ahead", false, "as a standby, do not read the tensors of the device's committed checkpoints ahead of a takeover (by default a standby holds a copy of them, up to the device's memory budget, so that a takeover need not read them after the owner died)")
	fs.BoolVar(&f.noChains, "no-gpu-chains", false, "launch each elementwise op on a GPU by itself, instead of a run of them as one kernel (the same bits either way)")
	fs.BoolVar(&f.tf32, "tf32", false, "let float32 matmuls on GPUs use TF32 tensor cores (faster, about 1e-3 relative error)")
	fs.StringVar(&f.jobs, "jobs", "", "also take jobs of this device kind from the jobs stream (cpu); with -cpus 0, only jobs")
	fs.BoolVar(&f.adopt, "adopt", false, "also take over cpu devices whose worker died (its connection gone for a lease TTL, its lease unrenewed for two, or stopped with sessions), restoring and replaying them; for replicas of one service")
	fs.DurationVar(&f.jobAckWait, "job-ack-wait", 10*time.Second, "a job unacknowledged this long (its worker died) goes to another worker")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", time.Second, "device lease TTL: a standby takes a device over this long after its worker stops renewing (250 ms after its worker's connection is gone, if less)")
	f.fraction = worker.DefaultConfig().MemoryFraction
	fs.Func("memory-budget", "tensor memory each device's sessions may hold together: a size (8GiB, 512MiB) or a percentage of the device's memory, the host's shared among CPU devices (default 80%); over it an op fails with resource_exhausted", func(v string) error {
		var err error
		f.budget, f.fraction, err = parseBudget(v)
		return err
	})
	f.checkpoint = 30 * time.Second
	fs.Func("checkpoint-interval", "checkpoint each device this often when it ran frames; 0: only on request and at a clean stop (default 30s)", func(v string) error {
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			return err
		case d < 0:
			return fmt.Errorf("negative interval %v", d)
		case d == 0:
			d = -1 // off
		}
		f.checkpoint = d
		return nil
	})
}

func (f *workerFlags) config(logf func(string, ...any)) (worker.Config, error) {
	cfg := worker.DefaultConfig()
	if f.id != "" {
		cfg.ID = f.id
	}
	cfg.IdleTimeout = f.idle
	cfg.NoFusion = f.noFusion
	cfg.NoPrograms = f.noPrograms
	cfg.SyncCollectives = f.syncColl
	cfg.NoReadAhead = f.noAhead
	if f.lanes != 0 {
		cfg.Lanes = f.lanes
	}
	if f.cpuThreads < 0 {
		return cfg, fmt.Errorf("-cpu-threads %d: want 0 (GOMAXPROCS) or more", f.cpuThreads)
	}
	cpu.SetThreads(f.cpuThreads) // the process's: its CPU devices share its cores
	cfg.MemoryFraction = f.fraction
	cfg.Logf = logf
	if f.leaseTTL != 0 {
		cfg.LeaseTTL = f.leaseTTL
	}
	switch {
	case f.checkpoint > 0:
		cfg.CheckpointInterval = f.checkpoint
	case f.checkpoint < 0:
		cfg.CheckpointInterval = 0
	}
	var names []string
	if f.devices != "" {
		names = strings.Split(f.devices, ",")
	} else {
		if f.cpus < 0 || f.cpus == 0 && f.jobs == "" && !f.haveGPUs() {
			return cfg, fmt.Errorf("-cpus %d: want at least 1 (or 0 with -jobs, or with -gpus where there are GPUs)", f.cpus)
		}
		for i := range f.cpus {
			names = append(names, fmt.Sprintf("cpu-%d", i))
		}
	}
	for _, n := range names {
		cfg.Devices = append(cfg.Devices, worker.Device{Name: n, Kind: "cpu", Backend: cpu.New(), Cores: cpuCores(), Budget: f.budget})
	}
	if f.adopt {
		cfg.Adopt = &worker.Adopt{Kind: "cpu", NewBackend: func() (kernels.Backend, error) { return cpu.New(), nil }}
	}
	switch f.jobs {
	case "":
	case "cpu":
		cfg.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New(), AckWait: f.jobAckWait}}
	default:
		return cfg, fmt.Errorf("-jobs %q: this worker runs cpu jobs", f.jobs)
	}
	if _, err := f.gpuCount(); err != nil {
		return cfg, err
	}
	if len(cfg.Devices) == 0 && len(cfg.Jobs) == 0 && f.wantGPUs() {
		return cfg, nil // withGPUs adds the devices and validates
	}
	return cfg, cfg.Validate()
}

// clientFlags are the flags of commands that talk to a fabric.
type clientFlags struct {
	url      string
	user     string
	password string
	tlsCA    string
	tlsCert  string
	tlsKey   string
	creds    string
}

func (f *clientFlags) register(fs *flag.FlagSet, def string) {
	fs.StringVar(&f.url, "url", def, "NATS URL of the fabric (env JETFABRIC_URL)")
	fs.StringVar(&f.user, "user", os.Getenv("JETFABRIC_USER"), "user name (env JETFABRIC_USER)")
	fs.StringVar(&f.password, "password", os.Getenv("JETFABRIC_PASSWORD"), "password (env JETFABRIC_PASSWORD)")
	fs.StringVar(&f.tlsCA, "tls-ca", os.Getenv("JETFABRIC_TLS_CA"), "PEM certificates of the authorities to trust for the broker's TLS certificate, instead of the system's (env JETFABRIC_TLS_CA)")
	fs.StringVar(&f.tlsCert, "tls-cert", os.Getenv("JETFABRIC_TLS_CERT"), "PEM client certificate, for a broker that verifies its clients (env JETFABRIC_TLS_CERT)")
	fs.StringVar(&f.tlsKey, "tls-key", os.Getenv("JETFABRIC_TLS_KEY"), "PEM private key of -tls-cert (env JETFABRIC_TLS_KEY)")
	fs.StringVar(&f.creds, "creds", os.Getenv("JETFABRIC_CREDS"), "creds file of a fabric with tenants: a tenant's, or service.creds for workers (env JETFABRIC_CREDS)")
}

// natsOptions are the credentials (a creds file, or a user and password)
// and TLS settings of the flags. A broker that requires TLS is met with
// TLS without them, trusting the system's authorities.
func (f *clientFlags) natsOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case f.creds != "":
		opts = append(opts, nats.UserCredentials(f.creds))
	case f.user != "":
		opts = append(opts, nats.UserInfo(f.user, f.password))
	}
	if f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" {
		tc, err := client.TLSConfig(f.tlsCA, f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca, -tls-cert, -tls-key: %w", err)
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

func (f *clientFlags) connect() (*client.Client, error) {
	if err := checkURL(f.url); err != nil {
		return nil, err
	}
	nopts, err := f.natsOptions()
	if err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithNATSOptions(nopts...)}
	if f.creds != "" {
		opts = append(opts, client.WithCreds(f.creds))
	}
	c, err := client.Connect(f.url, opts...)
	if err != nil {
		return nil, connectError(f.url, err)
	}
	return c, nil
}

// checkURL refuses URLs that cannot be a broker's client port, before a
// connection attempt that would only time out: http:// and https://.
func checkURL(urls string) error {
	for _, u := range strings.Split(urls, ",") {
		scheme, rest, ok := strings.Cut(strings.TrimSpace(u), "://")
		if !ok {
			continue // host:port; the NATS client adds nats://
		}
		switch strings.ToLower(scheme) {
		case "nats", "tls", "ws", "wss":
		case "http", "https":
			return fmt.Errorf("-url %s: the fabric speaks NATS, not HTTP: use nats://%s (the broker's client port, 4222 by default; 8222 is its HTTP monitoring port)", u, strings.Replace(rest, ":8222", ":4222", 1))
		default:
			return fmt.Errorf("-url %s: unknown scheme %q: want nats://host:port", u, scheme)
		}
	}
	return nil
}

// connectError says what a failed connection to urls most likely means and
// how to fix it.
func connectError(urls string, err error) error {
	var nerr net.Error
	ce := client.NewConnectError(urls, err)
	switch ce.Cause {
	case client.ErrTLSUnknownAuthority:
		return fmt.Errorf("the broker at %s requires TLS and its certificate is signed by an authority this client does not trust: pass -tls-ca with the CA certificate that signed it (env JETFABRIC_TLS_CA; jetfabric certs writes it as ca.pem): %w", urls, ce.Err)
	case client.ErrTLSHost:
		return fmt.Errorf("the TLS certificate of the broker at %s is not valid for the host in -url: use a name the certificate holds, or make one with this host (jetfabric certs --hosts): %w", urls, ce.Err)
	case client.ErrTLSExpired:
		return fmt.Errorf("the TLS certificate of the broker at %s has expired or is not valid yet: renew it (jetfabric certs --force), or check the clocks: %w", urls, ce.Err)
	case client.ErrTLSClientCert:
		return fmt.Errorf("the broker at %s requires a client certificate signed by an authority it trusts: pass -tls-cert and -tls-key (env JETFABRIC_TLS_CERT, JETFABRIC_TLS_KEY; jetfabric certs writes client.pem and client-key.pem): %w", urls, ce.Err)
	case client.ErrTLSNotOffered:
		return fmt.Errorf("the broker at %s does not offer TLS: drop tls:// and the -tls flags, or start the broker with -tls-cert and -tls-key: %w", urls, ce.Err)
	}
	switch {
	case errors.Is(err, nats.ErrNoServers):
		return fmt.Errorf("nothing listens at %s: start a broker there (jetfabric up --store DIR, or make up for containers) or point -url (env JETFABRIC_URL) at one: %w", urls, err)
	case errors.Is(err, nats.ErrAuthorization):
		return fmt.Errorf("the broker at %s refused the credentials: pass -creds with a tenant's creds file where it runs with -auth (env JETFABRIC_CREDS; jetfabric tenant add writes one), else -user and -password (env JETFABRIC_USER, JETFABRIC_PASSWORD): %w", urls, err)
	case errors.Is(err, nats.ErrTimeout), errors.As(err, &nerr) && nerr.Timeout():
		return fmt.Errorf("%s accepted the connection but did not answer as a NATS server: -url wants the broker's client port (4222 by default), not its monitoring port: %w", urls, err)
	}
	return err
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// parseBudget reads -memory-budget: a percentage (80%) or a size in bytes
// with an optional unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB).
func parseBudget(v string) (bytes int64, fraction float64, err error) {
	v = strings.TrimSpace(v)
	if p, ok := strings.CutSuffix(v, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, 0, fmt.Errorf("memory budget %q: a percentage in (0, 100]", v)
		}
		return 0, f / 100, nil
	}
	mult := int64(1)
	for _, u := range []struct {
		s string
		m int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.s); ok {
			v, mult = strings.TrimSpace(n), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f*float64(mult) > 1<<62 {
		return 0, 0, fmt.Errorf("memory budget %q: a size such as 8GiB or a percentage such as 80%%", v)
	}
	return int64(f * float64(mult)), 0, nil
}
