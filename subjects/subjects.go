// Package subjects names everything jetfabric puts on NATS: the op subjects,
// the reply and telemetry subjects, the JetStream stream, the key-value and
// object buckets, the keys inside them and the message headers.
//
// Every name is derived from one prefix (DefaultPrefix, "fabric"), so several
// fabrics can share one NATS account. Nothing else in jetfabric spells a
// subject or a bucket name by hand.
//
// Device and session tokens travel inside subjects, so they are validated
// here: a token is 1 to 64 characters from [A-Za-z0-9_-].
package subjects

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the prefix used when none is configured.
const DefaultPrefix = "fabric"

// Header names carried on op frames and replies.
const (
	// HeaderReply carries the subject on which the worker answers the
	// reads and syncs of a frame. JetStream drops a publish's reply
	// subject, so the inbox travels as a header.
	HeaderReply = "Fabric-Reply"
	// HeaderContentType selects the frame encoding: ContentTypeJSON, or
	// CBOR when absent or ContentTypeCBOR.
	HeaderContentType = "Content-Type"
	// HeaderVersion carries the protocol version of a frame (optional;
	// the frame body carries it too).
	HeaderVersion = "Fabric-Version"
	// HeaderFrame numbers a session's frames 1, 2, 3... (optional). The
	// worker runs a session's numbered frames in the order of their
	// numbers, each number once, whatever order the stream stored them in
	// (a frame published again after a leader change lands after later
	// ones). Clients also send the frame's Nats-Msg-Id, so that the stream
	// stores a frame published again once.
	HeaderFrame = "Fabric-Frame"
)

// Content types accepted in HeaderContentType.
const (
	ContentTypeCBOR = "application/cbor"
	ContentTypeJSON = "application/json"
)

// MaxTokenLen is the longest device or session token.
const MaxTokenLen = 64

// Errors returned by the validators and parsers.
var (
	ErrInvalidToken   = errors.New("subjects: invalid token")
	ErrInvalidPrefix  = errors.New("subjects: invalid prefix")
	ErrInvalidSubject = errors.New("subjects: not an op subject")
)

// Names derives every subject, stream and bucket name from one prefix.
// The zero value is not usable; use New or Default.
type Names struct {
	prefix string // e.g. "fabric"
	upper  string // e.g. "FABRIC"
	tenant string // "" for the single-user layout (see ForTenant)
}

// Default returns the names for DefaultPrefix.
func Default() Names {
	n, _ := New(DefaultPrefix)
	return n
}

// New returns the names for prefix. The prefix obeys the token rules and is
// also used, upper-cased, in stream and bucket names.
func New(prefix string) (Names, error) {
	if err := ValidateToken(prefix); err != nil {
		return Names{}, fmt.Errorf("%w %q: %v", ErrInvalidPrefix, prefix, err)
	}
	return Names{prefix: prefix, upper: strings.ToUpper(strings.ReplaceAll(prefix, "-", "_"))}, nil
}

// Prefix returns the configured prefix.
func (n Names) Prefix() string { return n.prefix }

// OpsStream is the JetStream stream capturing every op frame: FABRIC_OPS.
func (n Names) OpsStream() string { return n.upper + "_OPS" }

// CtrlBucket is the key-value bucket holding the device registry, leases
// and checkpoints: FABRIC_CTRL.
func (n Names) CtrlBucket() string { return n.upper + "_CTRL" }

// XferBucket is the object bucket holding transfers, large uploads and
// large results: FABRIC_XFER; for a tenant's names, the tenant's own
// bucket of uploads and large results, FABRIC_XFER_<tenant>.
func (n Names) XferBucket() string {
	if n.tenant != "" {
		return n.upper + "_XFER_" + n.tenant
	}
	return n.upper + "_XFER"
}

// ResultsBucket is the object bucket holding large results of the
// single-user sessions, kept in the broker's memory (a result is read
// once, and asked for again if lost): FABRIC_RESULTS. A tenant's results
// go to its own bucket (XferBucket of its names).
func (n Names) ResultsBucket() string { return n.upper + "_RESULTS" }

// Ops is the subject a client publishes a session's frames to:
// fabric.ops.<device>.<session>, or fabric.t.<tenant>.ops.<device>.<session>
// for a tenant's names. Both tokens must be valid (see ValidateToken).
func (n Names) Ops(device, session string) string {
	return n.space() + "ops." + device + "." + session
}

// space is what the subjects a client publishes start with: "fabric." or
// "fabric.t.<tenant>.".
func (n Names) space() string {
	if n.tenant != "" {
		return n.prefix + ".t." + n.tenant + "."
	}
	return n.prefix + "."
}

// OpsDevice is the filter matching every session of one device:
// fabric.ops.<device>.*.
func (n Names) OpsDevice(device string) string { return n.prefix + ".ops." + device + ".*" }

// OpsAll matches every subject under the op prefix, well-shaped or not:
// fabric.ops.>. The ops stream captures only OpsShapes.
func (n Names) OpsAll() string { return n.prefix + ".ops.>" }

// OpsShapes are the subjects the ops stream captures: op subjects of the
// right shape only, fabric.ops.<device>.<session>, so a frame with a token
// too many or too few is never stored (a JetStream publish of it finds no
// stream). Tokens with characters the fabric forbids still match; the
// broker's sweeper answers and removes those frames (package sweep).
func (n Names) OpsShapes() []string { return []string{n.prefix + ".ops.*.*"} }

// ParseOps splits an op subject into its device and session tokens.
func (n Names) ParseOps(subject string) (device, session string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".ops.")
	if !ok {
		return "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
	}
	device, session, ok = strings.Cut(rest, ".")
	if !ok {
		return "", "", fmt.Errorf("%w: %q has no session token", ErrInvalidSubject, subject)
	}
	if err := ValidateDevice(device); err != nil {
		return "", "", err
	}
	if err := ValidateSession(session); err != nil {
		return "", "", err
	}
	return device, session, nil
}

// Telemetry is the subject a worker publishes a device's telemetry on:
// fabric.telemetry.<device>.
func (n Names) Telemetry(device string) string { return n.prefix + ".telemetry." + device }

// TelemetryAll matches every device's telemetry.
func (n Names) TelemetryAll() string { return n.prefix + ".telemetry.*" }

// Alive is the subject a client publishes its session's heartbeat on,
// over core NATS (never stored): fabric.alive.<device>.<session>. The
// worker keeps a session whose client beats from being freed as idle.
func (n Names) Alive(device, session string) string {
	return n.space() + "alive." + device + "." + session
}

// AliveDevice matches the heartbeats of a device's sessions.
func (n Names) AliveDevice(device string) string { return n.prefix + ".alive." + device + ".*" }

// ServiceName is the NATS micro service every worker registers as, one
// instance per worker: `nats micro list` shows them all.
const ServiceName = "jetfabric-worker"

// ServiceDevice is the prefix of a device's service endpoints:
// fabric.svc.<device>.
func (n Names) ServiceDevice(device string) string { return n.prefix + ".svc." + device }

// ServiceInfo is the request subject answered with a device's registry
// entry, fresh from its worker: fabric.svc.<device>.info.
func (n Names) ServiceInfo(device string) string { return n.ServiceDevice(device) + ".info" }

// ServiceHealth is the request subject answered with a device's health:
// fabric.svc.<device>.health.
func (n Names) ServiceHealth(device string) string { return n.ServiceDevice(device) + ".health" }

// WorkerLive is the subject a worker answers for as long as its connection
// to the fabric is up: fabric.live.<token>, token a random one of the
// worker process's, named in the leases it holds. A standby asks it to
// learn at once that a lease's holder is gone: with nothing subscribed,
// the server answers "no responders" instead of the holder.
func (n Names) WorkerLive(token string) string { return n.prefix + ".live." + token }

// Answerable reports whether a service of the fabric may answer a request
// onto reply: a subject that none of the fabric's streams and buckets
// captures. A requester names its reply subject freely, and the server
// does not check it against the requester's permissions: an answer onto
// $KV.FABRIC_CTRL.<key> would be a write into the control bucket in the
// service's name. So no subject beginning with $ ($KV, $O, $JS) or under
// the prefix; every client inbox passes.
func (n Names) Answerable(reply string) bool {
	return reply != "" && !strings.HasPrefix(reply, "$") && !strings.HasPrefix(reply, n.prefix+".")
}

// InboxPrefix is the prefix of client reply inboxes: _INBOX_fabric, or
// _INBOX_fabric.t.<tenant> for a tenant's names. Deployments with
// permissions grant clients subscribe rights on it.
func (n Names) InboxPrefix() string {
	if n.tenant != "" {
		return "_INBOX_" + n.prefix + ".t." + n.tenant
	}
	return "_INBOX_" + n.prefix
}

// DeviceKey is the FABRIC_CTRL key of a device's registry entry: device.<device>.
func DeviceKey(device string) string { return "device." + device }

// DeviceKeys matches every registry entry.
const DeviceKeys = "device.*"

// LeaseKey is the FABRIC_CTRL key of a device's ownership lease: lease.<device>.
func LeaseKey(device string) string { return "lease." + device }

// CheckpointKey is the FABRIC_CTRL key of a device's last checkpoint: ckpt.<device>.
func CheckpointKey(device string) string { return "ckpt." + device }

// ValidateToken reports whether s can stand as one subject token: 1 to
// MaxTokenLen characters from [A-Za-z0-9_-].
func ValidateToken(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty", ErrInvalidToken)
	}
	if len(s) > MaxTokenLen {
		return fmt.Errorf("%w: %d characters, at most %d", ErrInvalidToken, len(s), MaxTokenLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return fmt.Errorf("%w: %q has forbidden character %q at %d (allowed: A-Z a-z 0-9 _ -)", ErrInvalidToken, s, c, i)
		}
	}
	return nil
}

// ValidateDevice validates a device name such as cpu-0 or gpu-3.
func ValidateDevice(device string) error {
	if err := ValidateToken(device); err != nil {
		return fmt.Errorf("device name: %w", err)
	}
	return nil
}

// ValidateSession validates a session token.
func ValidateSession(session string) error {
	if err := ValidateToken(session); err != nil {
		return fmt.Errorf("session token: %w", err)
	}
	return nil
}

// BenchEcho is the core NATS subject of the raw request/reply responder
// that `jetfabric bench` measures the fabric against.
func (n Names) BenchEcho() string { return n.prefix + ".bench.echo" }

// BenchFloor is the subject of the stream BenchFloorStream, through which
// `jetfabric bench` measures JetStream's own round trip: a message stored
// in a stream, delivered by an ordered consumer and answered, with none of
// the fabric's code in the path.
func (n Names) BenchFloor() string { return n.prefix + ".bench.floor" }

// BenchFloorStream is the stream of BenchFloor: FABRIC_BENCH_FLOOR.
func (n Names) BenchFloorStream() string { return n.upper + "_BENCH_FLOOR" }

// CtrlStream is the stream behind the control bucket: KV_FABRIC_CTRL.
func (n Names) CtrlStream() string { return "KV_" + n.CtrlBucket() }

// CtrlSubject is the stream subject of a control bucket key:
// $KV.FABRIC_CTRL.<key>. Fenced writes name it.
func (n Names) CtrlSubject(key string) string { return "$KV." + n.CtrlBucket() + "." + key }

// CkptBucket is the object bucket holding device checkpoints: FABRIC_CKPT.
// Unlike FABRIC_XFER its objects do not expire; each is deleted when the
// next checkpoint of its device commits.
func (n Names) CkptBucket() string { return n.upper + "_CKPT" }

// GraphBucket is the key-value bucket holding captured graph definitions:
// FABRIC_GRAPHS. The key of a graph is its name (the SHA-256 of its
// encoded definition, in hex), so a definition is stored once and never
// changes; entries do not expire.
func (n Names) GraphBucket() string { return n.upper + "_GRAPHS" }

// CheckpointObject names the checkpoint of device taken at stream sequence seq.
func CheckpointObject(device string, seq uint64) string {
	return "ckpt-" + device + "-" + strconv.FormatUint(seq, 10)
}

// JobsStream is the work-queue stream of jobs: FABRIC_JOBS.
func (n Names) JobsStream() string { return n.upper + "_JOBS" }

// Jobs is the subject jobs for devices of kind are published to:
// fabric.jobs.<kind>.
func (n Names) Jobs(kind string) string { return n.space() + "jobs." + kind }

// JobsAll is the filter captured by the jobs stream: fabric.jobs.*.
func (n Names) JobsAll() string { return n.prefix + ".jobs.*" }

// JobsConsumer is the durable consumer every worker taking jobs of kind
// shares: jobs-<kind>.
func JobsConsumer(kind string) string { return "jobs-" + kind }

// JobKey is the FABRIC_CTRL key of a job's result: job.<id>.
func JobKey(id string) string { return "job." + id }

// JobOutputObject names output i of job id in the transfer bucket.
func JobOutputObject(id string, i int) string { return "job-" + id + "-" + strconv.Itoa(i) }

// TransferObject names the object holding transfer id in FABRIC_XFER.
func TransferObject(id string) string { return "xfer-" + id }

// TransferKey is the FABRIC_CTRL key announcing transfer object id.
func TransferKey(id string) string { return "xfer." + id }

// TransferReadsKey is the FABRIC_CTRL key listing the reads of transfer
// object id.
func TransferReadsKey(id string) string { return "xread." + id }

// CollectiveObject names a piece of a collective in FABRIC_XFER: the part
// rank from sends to rank to in phase phase of group (to -1: for every rank).
func CollectiveObject(group, phase string, from, to int) string {
	return "coll-" + group + "-" + phase + "-" + strconv.Itoa(from) + "-" + strconv.Itoa(to)
}

// ValidateID checks a transfer or group id: 32 lower-case hex digits.
func ValidateID(id string) error {
	if len(id) != 32 {
		return fmt.Errorf("%w: id %q: want 32 hex digits", ErrInvalidToken, id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return fmt.Errorf("%w: id %q: want 32 lower-case hex digits", ErrInvalidToken, id)
		}
	}
	return nil
}
