package broker

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/subjects"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("broker: invalid config")

// User is a client credential. With any user configured, clients must
// authenticate.
type User struct {
	Name     string `json:"name"`
	Password string `json:"password"`
}

// ClusterConfig joins the broker to a JetStream cluster. A cluster needs a
// name, a route listener and the routes of every peer (the node itself may
// be listed).
type ClusterConfig struct {
	Name   string
	Host   string
	Port   int
	Routes []string // nats://host:port of every node
	// TLS, when its CertFile is set, puts the routes under mutual TLS:
	// every node presents CertFile (a certificate for server and client
	// authentication, valid for the host names in Routes) and accepts
	// only peers whose certificates CAFile's authorities signed. CAFile
	// is required; Verify is implied.
	TLS TLSConfig
	// Raft are the timers of the cluster's raft groups: how soon the
	// others elect a leader in place of one that died without handing
	// over (see RaftTimers). Zero: DefaultRaftTimers. Every node of a
	// cluster should use the same.
	Raft RaftTimers
}

// raftTimers are the timers the node runs with.
func (c ClusterConfig) raftTimers() RaftTimers {
	if c.Raft == (RaftTimers{}) {
		return DefaultRaftTimers()
	}
	return c.Raft
}

// TLSConfig is what a TLS listener presents and what it asks of the other
// side.
type TLSConfig struct {
	// CertFile and KeyFile are the listener's PEM certificate (with any
	// intermediate certificates after it) and private key. A CertFile
	// turns TLS on; KeyFile is then required.
	CertFile string
	KeyFile  string
	// CAFile holds the PEM certificates of the authorities trusted to
	// sign the other side's certificate: clients' with Verify, peers' on
	// routes.
	CAFile string
	// Verify requires every client to present a certificate that one of
	// CAFile's authorities signed (mutual TLS).
	Verify bool
}

// Enabled says whether t turns TLS on.
func (t TLSConfig) Enabled() bool { return t.CertFile != "" }

// Config is a broker's assembled configuration. Start from DefaultConfig.
type Config struct {
	// Name is the server name, required (and unique) in a cluster.
	Name string
	// Host and Port are the client listener. Port -1 picks a free port.
	Host string
	Port int
	// InProcess serves only in-process connections (no TCP listener);
	// not allowed with a cluster.
	InProcess bool
	// StoreDir is where JetStream keeps its files. Required: the broker
	// never falls back to a temporary directory.
	StoreDir string
	// HTTPHost and HTTPPort are the monitoring listener (/healthz, /varz,
	// /jsz). Port 0 disables it, -1 picks a free port.
	HTTPHost string
	HTTPPort int
	// MaxPayload is the largest message the server accepts. Op frames and
	// inline tensors must fit; larger tensors go through the object store.
	MaxPayload int32
	// Users, when set, require clients to authenticate.
	Users []User
	// TLS, when its CertFile is set, requires TLS of every client
	// connection on the client listener: the server's INFO says
	// tls_required and it closes connections that do not start the
	// handshake. In-process connections (Connect) are not affected.
	TLS TLSConfig
	// AuthDir, when set, is an auth directory made by `jetfabric tenant
	// init` (see package tenant): the broker runs in operator mode, trusting
	// its operator, with its accounts in a memory resolver; every client
	// authenticates with a creds file of the fabric's account (the service
	// user, or a tenant), the ops and jobs streams capture the
	// tenants' frames and jobs too, and each tenant of the directory gets its object bucket
	// and its record. Not with Users.
	AuthDir string
	// ConfigFile is an optional nats-server configuration file read first;
	// the fields above then override it.
	ConfigFile string
	// Cluster, when Name is set, makes this node part of a cluster.
	Cluster ClusterConfig
	// Prefix names the subjects, stream and buckets (default "fabric").
	Prefix string
	// Provision sets up the fabric's stream and buckets.
	Provision Provision
	// Logs turns on the server's own log output.
	Logs bool
	// ReadyTimeout bounds how long Start waits for JetStream.
	ReadyTimeout time.Duration
}

// Provision is the shape of the fabric's stream and buckets.
type Provision struct {
	// Replicas for the stream and buckets: 1, or 3 in a cluster.
	Replicas int
	// OpsMaxBytes bounds the ops stream; with Discard New a full stream
	// refuses new frames (back-pressure) instead of dropping old ones.
	OpsMaxBytes int64
	// OpsMaxAge drops frames older than this (0 keeps them until purged).
	OpsMaxAge time.Duration
	// OpsMaxMsgSize is the largest frame; at most MaxPayload.
	OpsMaxMsgSize int32
	// XferTTL is how long an object lives in the transfer bucket.
	XferTTL time.Duration
	// XferMaxBytes bounds the transfer bucket.
	XferMaxBytes int64
	// ResultsTTL is how long a large result lives in the results bucket
	// (its reader deletes it once read; the TTL takes those never read).
	ResultsTTL time.Duration
	// ResultsMaxBytes bounds the results bucket, which the server keeps in
	// memory: it is cut to a quarter of the server's JetStream memory, and
	// workers write a result over an eighth of it to the transfer bucket
	// instead.
	ResultsMaxBytes int64
	// Tenants makes the ops and jobs streams capture the tenants' frames
	// and jobs (fabric.t.*.ops.*.*, fabric.t.*.jobs.*) beside the
	// single-user ones. Set by the broker when it has an auth directory.
	Tenants bool
	// XferStorage is where the transfer bucket keeps its objects: file
	// (the default) survives a broker restart; memory moves large tensors
	// faster (no file writes) but loses the objects not yet read, and the
	// large uploads a replay would need, when the broker restarts. On
	// memory, XferMaxBytes is cut to half the server's JetStream memory.
	XferStorage jetstream.StorageType
}

// DefaultConfig is a single node on 127.0.0.1:4222 with monitoring on 8222,
// 8 MiB payloads and no auth. StoreDir must still be set.
func DefaultConfig() Config {
	return Config{
		Name:         "jetfabric",
		Host:         "127.0.0.1",
		Port:         4222,
		HTTPHost:     "127.0.0.1",
		HTTPPort:     8222,
		MaxPayload:   8 << 20,
		Prefix:       subjects.DefaultPrefix,
		ReadyTimeout: 30 * time.Second,
		Provision:    DefaultProvision(),
	}
}

// DefaultProvision: R1, a 4 GiB ops stream with frames up to 8 MiB kept for
// a day, transfers kept for an hour in up to 16 GiB, large results kept
// for 10 minutes in up to 4 GiB of memory.
func DefaultProvision() Provision {
	return Provision{
		Replicas:        1,
		OpsMaxBytes:     4 << 30,
		OpsMaxAge:       24 * time.Hour,
		OpsMaxMsgSize:   8 << 20,
		XferTTL:         time.Hour,
		XferMaxBytes:    16 << 30,
		ResultsTTL:      10 * time.Minute,
		ResultsMaxBytes: 4 << 30,
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.StoreDir == "":
		return bad("store dir is required (JetStream keeps the op log there)")
	case c.Port < -1 || c.Port > 65535:
		return bad("port %d", c.Port)
	case c.HTTPPort < -1 || c.HTTPPort > 65535:
		return bad("monitoring port %d", c.HTTPPort)
	case c.MaxPayload < 64<<10 || c.MaxPayload > 64<<20:
		return bad("max payload %d bytes; want 64 KiB to 64 MiB", c.MaxPayload)
	case c.InProcess && c.Cluster.Name != "":
		return bad("an in-process broker cannot join a cluster (routes need a listener)")
	case c.Cluster.Name != "" && c.Name == "":
		return bad("a cluster node needs a server name")
	}
	if err := c.TLS.validate("client", false); err != nil {
		return err
	}
	if c.TLS.Enabled() && c.InProcess {
		return bad("TLS needs the client listener, which an in-process broker does not have")
	}
	if err := c.Cluster.TLS.validate("route", true); err != nil {
		return err
	}
	if c.Cluster.TLS.Enabled() && c.Cluster.Name == "" {
		return bad("route TLS without a cluster name")
	}
	if c.Cluster.Raft != (RaftTimers{}) {
		if c.Cluster.Name == "" {
			return bad("raft timers without a cluster name (a single node elects nothing)")
		}
		if err := c.Cluster.Raft.validate(); err != nil {
			return err
		}
	}
	if _, err := subjects.New(c.Prefix); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if c.AuthDir != "" && len(c.Users) > 0 {
		return bad("an auth directory and users are exclusive (tenants and the service user come from the directory)")
	}
	for i, u := range c.Users {
		if u.Name == "" || u.Password == "" {
			return bad("user %d needs a name and a password", i)
		}
	}
	return c.Provision.validate(c.MaxPayload)
}

// validate checks that t's fields go together; the files themselves are
// read by New.
func (t TLSConfig) validate(what string, needCA bool) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s TLS: %s", ErrInvalidConfig, what, fmt.Sprintf(format, a...))
	}
	switch {
	case t.CertFile == "" && (t.KeyFile != "" || t.CAFile != "" || t.Verify):
		return bad("a key, CA or verify without a certificate file (the certificate turns TLS on)")
	case t.CertFile != "" && t.KeyFile == "":
		return bad("certificate %s without its key file", t.CertFile)
	case t.Verify && t.CAFile == "":
		return bad("verifying client certificates needs the CA file of the authority that signs them")
	case needCA && t.CertFile != "" && t.CAFile == "":
		return bad("routes verify their peers: a CA file is required")
	}
	return nil
}

func (p Provision) validate(maxPayload int32) error {
	switch {
	case p.Replicas != 1 && p.Replicas != 3 && p.Replicas != 5:
		return fmt.Errorf("%w: replicas %d; want 1, 3 or 5", ErrInvalidConfig, p.Replicas)
	case p.OpsMaxMsgSize <= 0 || p.OpsMaxMsgSize > maxPayload:
		return fmt.Errorf("%w: ops max message size %d must be in (0, max payload %d]", ErrInvalidConfig, p.OpsMaxMsgSize, maxPayload)
	case p.OpsMaxBytes < 0 || p.XferMaxBytes < 0 || p.OpsMaxAge < 0 || p.XferTTL < 0 || p.ResultsTTL < 0 || p.ResultsMaxBytes < 0:
		return fmt.Errorf("%w: negative stream limit", ErrInvalidConfig)
	case p.XferStorage != jetstream.FileStorage && p.XferStorage != jetstream.MemoryStorage:
		return fmt.Errorf("%w: transfer storage %d; want file or memory", ErrInvalidConfig, p.XferStorage)
	}
	return nil
}
