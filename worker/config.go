package worker

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/subjects"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("worker: invalid config")

// Limits protect a worker from what clients send.
type Limits struct {
	// Tensor bounds rank and elements of every tensor.
	Tensor kernels.Limits
	// MaxSessions is the most live sessions on one device.
	MaxSessions int
	// MaxSessionBytes bounds the tensor memory of one session.
	MaxSessionBytes int64
	// InlineBytes is the largest read result sent in the reply itself;
	// larger ones go through the object store.
	InlineBytes int
}

// DefaultLimits: rank 8, 2^30 elements, 1024 sessions a device, 16 GiB a
// session, results up to 4 MiB inline.
func DefaultLimits() Limits {
	return Limits{
		Tensor:          kernels.DefaultLimits(),
		MaxSessions:     1024,
		MaxSessionBytes: 16 << 30,
		InlineBytes:     4 << 20,
	}
}

// Device is one device the worker serves.
type Device struct {
	// Name is the logical slot, e.g. cpu-0.
	Name string
	// Kind is "cpu" or "gpu".
	Kind string
	// Backend computes for the device. The worker closes it on Stop if
	// it has a Close() error method.
	Backend kernels.Backend
	// Props are shown in the registry (model, memory, ...).
	Props map[string]string
	// Memory is the device memory in bytes, if known.
	Memory int64
	// Cores is the number of cores, if it is a CPU.
	Cores int
	// Budget bounds the tensor memory of all the device's sessions
	// together, in bytes: an op whose outputs would pass it fails with
	// resource_exhausted. 0: Config.MemoryFraction of the device's memory
	// (a GPU's Memory; the host's, shared among its CPU devices);
	// negative: no budget.
	Budget int64
	// Telemetry samples the device (NVML for a GPU); nil: none. The
	// worker publishes each sample as JSON on fabric.telemetry.<device>
	// every Config.TelemetryInterval.
	Telemetry func() (codec.Telemetry, error)
}

// Config is a worker's assembled configuration.
type Config struct {
	// ID names this worker in the registry; default host-pid.
	ID string
	// Prefix names the subjects and buckets (default "fabric").
	Prefix string
	// Devices the worker serves.
	Devices []Device
	// Jobs are the kinds of jobs the worker takes. A worker needs at
	// least one device or one kind of job.
	Jobs []Jobs
	// Adopt, if set, makes the worker take over devices of a kind whose
	// worker died (see Adopt).
	Adopt *Adopt
	// Limits on client input.
	Limits Limits
	// IdleTimeout frees a session with no frames for this long (0: never).
	IdleTimeout time.Duration
	// Heartbeat is how often the registry entry is refreshed.
	Heartbeat time.Duration
	// LeaseTTL is how long a device lease lives without renewal before a
	// standby takes the device over; the holder renews it four times a
	// TTL. It bounds the time from a worker's death to the takeover.
	LeaseTTL time.Duration
	// CheckpointInterval is how often a device's sessions are written to
	// the checkpoint bucket, if frames ran since the last one (0: only on
	// request and at a clean stop). Replay after a takeover starts there.
	CheckpointInterval time.Duration
	// MemoryFraction is the part of a device's memory its default budget
	// allows (see Device.Budget); 0: no default budget.
	MemoryFraction float64
	// Reclaim is how often memory freed by the devices (64 MiB or more
	// since the last time) is returned to the system; a device idle for
	// three of these also empties its backend's cache of freed buffers.
	Reclaim time.Duration
	// NoFusion runs every op by itself, into fresh outputs, even where the
	// backend can fuse runs of elementwise ops into one kernel, read a
	// transpose that only a matmul reads in place, or write an output over
	// an input freed after the op (for comparisons).
	NoFusion bool
	// NoPrograms runs every replay op by op, even on a backend that can
	// record a replay's device work once and run it again as one program
	// (the same bits either way; for comparisons).
	NoPrograms bool
	// NoReadAhead keeps a standby from reading the tensors of the device's
	// committed checkpoints ahead of a takeover (see warm.go): a takeover
	// then reads them all from the object store (for comparisons, or a
	// standby short of memory).
	NoReadAhead bool
	// SyncCollectives runs every collective op to its end before the
	// device's next op, as on a device whose memory the host cannot
	// address, instead of beside the device loop (for comparisons).
	SyncCollectives bool
	// TelemetryInterval is how often devices with a Telemetry source are
	// sampled and published (0: never).
	TelemetryInterval time.Duration
	// ObjectTimeout bounds each step of an object store read or write, and
	// how long a reader copying an object while it is written waits for
	// the next chunk before it decides that the writer stopped.
	ObjectTimeout time.Duration
	// Lanes is how many connections move a large upload or result as
	// pieces in parallel (see objectstore.Lanes; only from a bucket kept
	// in memory), 1 to 16; 1 moves every object on one connection. The reader chooses too: an
	// upload comes in the pieces its client wrote, and a result goes in at
	// most the pieces its read asked for.
	Lanes int
	// Tenants serves the tenants' sessions beside the single-user ones
	// (see package tenant): frames on fabric.t.<tenant>.ops.<device>.<session>,
	// answered only under the tenant's inbox, objects in the tenant's
	// bucket, quotas from the tenant records in the control bucket. The
	// worker must connect as the fabric's service user.
	Tenants bool
	// TenantIssuer is the public key of the fabric's account, with
	// Tenants: only tenant records it signed are accepted (see package
	// tenant). The issuer of the service user's JWT.
	TenantIssuer string
	// Logf receives operational messages (nil: none).
	Logf func(format string, args ...any)
}

// MaxLanes is the most transfer lanes a worker opens.
const MaxLanes = 16

// DefaultLanes is a lane for every four cores, 1 to 4: on fewer cores the
// connections' goroutines compete with everything else for the CPU, and
// moving pieces in parallel was slower than one object on two cores.
func DefaultLanes() int { return min(4, max(1, runtime.NumCPU()/4)) }

// DefaultConfig has no devices; add them.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	return Config{
		ID:                 fmt.Sprintf("%s-%d", host, os.Getpid()),
		Prefix:             subjects.DefaultPrefix,
		Limits:             DefaultLimits(),
		IdleTimeout:        10 * time.Minute,
		Heartbeat:          2 * time.Second,
		LeaseTTL:           time.Second,
		CheckpointInterval: 30 * time.Second,
		TelemetryInterval:  2 * time.Second,
		ObjectTimeout:      5 * time.Second,
		Lanes:              DefaultLanes(),
		MemoryFraction:     0.8,
		Reclaim:            5 * time.Second,
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if _, err := subjects.New(c.Prefix); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if len(c.Devices) == 0 && len(c.Jobs) == 0 {
		return fmt.Errorf("%w: no devices and no jobs", ErrInvalidConfig)
	}
	if c.Tenants && c.TenantIssuer == "" {
		return fmt.Errorf("%w: tenants need the fabric account's public key, which signs their records", ErrInvalidConfig)
	}
	if c.Adopt != nil {
		if err := c.Adopt.validate(); err != nil {
			return err
		}
	}
	kinds := map[string]bool{}
	for _, j := range c.Jobs {
		if err := j.validate(); err != nil {
			return err
		}
		if kinds[j.Kind] {
			return fmt.Errorf("%w: jobs of kind %s listed twice", ErrInvalidConfig, j.Kind)
		}
		kinds[j.Kind] = true
	}
	seen := map[string]bool{}
	for _, d := range c.Devices {
		if err := subjects.ValidateDevice(d.Name); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("%w: device %s listed twice", ErrInvalidConfig, d.Name)
		}
		seen[d.Name] = true
		if d.Backend == nil {
			return fmt.Errorf("%w: device %s has no backend", ErrInvalidConfig, d.Name)
		}
	}
	switch {
	case c.Heartbeat <= 0:
		return fmt.Errorf("%w: heartbeat %v", ErrInvalidConfig, c.Heartbeat)
	case c.LeaseTTL < 100*time.Millisecond:
		return fmt.Errorf("%w: lease TTL %v is under 100ms", ErrInvalidConfig, c.LeaseTTL)
	case c.CheckpointInterval < 0:
		return fmt.Errorf("%w: checkpoint interval %v", ErrInvalidConfig, c.CheckpointInterval)
	case c.TelemetryInterval < 0:
		return fmt.Errorf("%w: telemetry interval %v", ErrInvalidConfig, c.TelemetryInterval)
	case c.IdleTimeout < 0:
		return fmt.Errorf("%w: idle timeout %v", ErrInvalidConfig, c.IdleTimeout)
	case c.MemoryFraction < 0 || c.MemoryFraction > 1:
		return fmt.Errorf("%w: memory fraction %v is not in [0, 1]", ErrInvalidConfig, c.MemoryFraction)
	case c.Reclaim <= 0:
		return fmt.Errorf("%w: reclaim interval %v", ErrInvalidConfig, c.Reclaim)
	case c.Lanes < 1 || c.Lanes > MaxLanes:
		return fmt.Errorf("%w: lanes %d, want 1 to %d", ErrInvalidConfig, c.Lanes, MaxLanes)
	case c.ObjectTimeout <= 0:
		return fmt.Errorf("%w: object timeout %v", ErrInvalidConfig, c.ObjectTimeout)
	case c.Limits.MaxSessions <= 0 || c.Limits.MaxSessionBytes <= 0 || c.Limits.InlineBytes <= 0:
		return fmt.Errorf("%w: limits must be positive: %+v", ErrInvalidConfig, c.Limits)
	}
	return nil
}
