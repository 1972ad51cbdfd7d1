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
}

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
// a day, transfers kept for an hour in up to 16 GiB.
func DefaultProvision() Provision {
	return Provision{
		Replicas:      1,
		OpsMaxBytes:   4 << 30,
		OpsMaxAge:     24 * time.Hour,
		OpsMaxMsgSize: 8 << 20,
		XferTTL:       time.Hour,
		XferMaxBytes:  16 << 30,
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
	if _, err := subjects.New(c.Prefix); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	for i, u := range c.Users {
		if u.Name == "" || u.Password == "" {
			return bad("user %d needs a name and a password", i)
		}
	}
	return c.Provision.validate(c.MaxPayload)
}

func (p Provision) validate(maxPayload int32) error {
	switch {
	case p.Replicas != 1 && p.Replicas != 3 && p.Replicas != 5:
		return fmt.Errorf("%w: replicas %d; want 1, 3 or 5", ErrInvalidConfig, p.Replicas)
	case p.OpsMaxMsgSize <= 0 || p.OpsMaxMsgSize > maxPayload:
		return fmt.Errorf("%w: ops max message size %d must be in (0, max payload %d]", ErrInvalidConfig, p.OpsMaxMsgSize, maxPayload)
	case p.OpsMaxBytes < 0 || p.XferMaxBytes < 0 || p.OpsMaxAge < 0 || p.XferTTL < 0:
		return fmt.Errorf("%w: negative stream limit", ErrInvalidConfig)
	case p.XferStorage != jetstream.FileStorage && p.XferStorage != jetstream.MemoryStorage:
		return fmt.Errorf("%w: transfer storage %d; want file or memory", ErrInvalidConfig, p.XferStorage)
	}
	return nil
}
