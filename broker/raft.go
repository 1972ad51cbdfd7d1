package broker

import (
	"fmt"
	"strings"
	"sync"
	"time"
)

// RaftTimers are the timers of nats-server's raft, which JetStream's meta
// group and every replicated stream, bucket and consumer of a cluster run
// on. When a leader dies without handing its leadership over (a node
// killed, a power cut, a network cut), nothing stored in its groups moves
// until a follower has heard nothing from it for a random time between
// ElectionMin and ElectionMax and is elected in its place.
//
// nats-server (v2.15.2) waits 4 to 9 s, with a heartbeat every second, and
// has no option to change them: a read on the fabric stalls that long,
// and more. The broker sets them, in every cluster node, to
// DefaultRaftTimers unless told otherwise: a killed leader's groups elect
// within 1.5 to 3 s. The cost is heartbeats four times as often (a small
// message from each group's leader to each follower every 250 ms while the
// group is idle) and elections that come sooner after a leader that
// merely stood still, on a machine so loaded that none of its goroutines
// ran for 1.5 s: such an election is harmless (the new leader carries on
// where the old one stopped) but costs a short stall of its own.
//
// A leader that hears from no majority of its followers for 10 s still
// steps down after 10 s, as in nats-server: that timer is left as it is
// (shortening it would not elect a killed leader's successor any sooner,
// and would make a leader on a loaded machine step down more readily).
//
// The timers are nats-server's package variables, set through
// go:linkname (see raft_linkname.go), so they are process-wide: every
// cluster node of one process must use the same ones (Start refuses
// others while a node with different timers runs).
type RaftTimers struct {
	// Heartbeat is how often a leader with nothing else to send tells its
	// followers it is alive.
	Heartbeat time.Duration
	// ElectionMin and ElectionMax bound the random time a follower waits
	// without hearing from its leader before it stands for election. The
	// random spread keeps two followers from standing at once.
	ElectionMin time.Duration
	ElectionMax time.Duration
}

// DefaultRaftTimers are the broker's timers for a cluster: a heartbeat
// every 250 ms, elections after 1.5 to 3 s of silence (six to twelve
// heartbeats: a leader's heartbeats can be two intervals apart, and a
// loaded machine delays them further).
func DefaultRaftTimers() RaftTimers {
	return RaftTimers{Heartbeat: 250 * time.Millisecond, ElectionMin: 1500 * time.Millisecond, ElectionMax: 3 * time.Second}
}

// NATSRaftTimers are nats-server's own timers (v2.15.2): a heartbeat
// every second, elections after 4 to 9 s of silence. A cluster given
// these runs as nats-server does by default.
func NATSRaftTimers() RaftTimers {
	return RaftTimers{Heartbeat: time.Second, ElectionMin: 4 * time.Second, ElectionMax: 9 * time.Second}
}

// String writes t as ParseRaftTimers reads it: heartbeat,min,max.
func (t RaftTimers) String() string {
	return fmt.Sprintf("%v,%v,%v", t.Heartbeat, t.ElectionMin, t.ElectionMax)
}

// ParseRaftTimers reads "heartbeat,election-min,election-max", three Go
// durations ("250ms,1.5s,3s"), or "default" (DefaultRaftTimers) or
// "nats" (NATSRaftTimers), and checks them.
func ParseRaftTimers(s string) (RaftTimers, error) {
	switch s {
	case "default":
		return DefaultRaftTimers(), nil
	case "nats":
		return NATSRaftTimers(), nil
	}
	var t RaftTimers
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return t, fmt.Errorf("%w: raft timers %q: want heartbeat,election-min,election-max (like 250ms,1.5s,3s), default or nats", ErrInvalidConfig, s)
	}
	for i, d := range []*time.Duration{&t.Heartbeat, &t.ElectionMin, &t.ElectionMax} {
		v, err := time.ParseDuration(strings.TrimSpace(parts[i]))
		if err != nil {
			return t, fmt.Errorf("%w: raft timers %q: %v", ErrInvalidConfig, s, err)
		}
		*d = v
	}
	return t, t.validate()
}

// Limits of RaftTimers.
const (
	minRaftHeartbeat = 50 * time.Millisecond
	// A leader that heard from no majority of its followers for 10 s
	// steps down (nats-server's lost-quorum interval, left as it is):
	// heartbeats must come well within it.
	maxRaftHeartbeat = 2 * time.Second
	// A leader's heartbeats can be two intervals apart (it skips one
	// when it sent entries within the last): a follower must wait out
	// more than that before it stands for election.
	minElectionBeats = 3
	maxRaftElection  = time.Minute
)

func (t RaftTimers) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: raft timers %v: %s", ErrInvalidConfig, t, fmt.Sprintf(format, a...))
	}
	switch {
	case t.Heartbeat < minRaftHeartbeat || t.Heartbeat > maxRaftHeartbeat:
		return bad("heartbeat %v, want %v to %v", t.Heartbeat, minRaftHeartbeat, maxRaftHeartbeat)
	case t.ElectionMin < minElectionBeats*t.Heartbeat:
		return bad("elections after %v: want at least %d heartbeats (%v), or a leader's ordinary pauses start elections", t.ElectionMin, minElectionBeats, minElectionBeats*t.Heartbeat)
	case t.ElectionMax <= t.ElectionMin:
		return bad("the longest wait before an election (%v) must be longer than the shortest (%v): the random spread keeps followers from standing at once", t.ElectionMax, t.ElectionMin)
	case t.ElectionMax > maxRaftElection:
		return bad("elections after up to %v: want at most %v", t.ElectionMax, maxRaftElection)
	}
	return nil
}

// raftInUse counts the cluster nodes of this process whose servers run
// (from Start until their shutdown has finished) and the timers they run
// with. The timers are written only while none runs: nats-server's raft
// goroutines read them unguarded.
var raftInUse struct {
	sync.Mutex
	nodes int
}

// acquireRaftTimers sets nats-server's raft timers to t for a cluster
// node about to start, unless they are t already; it fails while another
// node of this process runs with other timers. Every successful call is
// paired with releaseRaftTimers once the node's server has shut down.
func acquireRaftTimers(t RaftTimers) error {
	if err := t.validate(); err != nil {
		return err
	}
	raftInUse.Lock()
	defer raftInUse.Unlock()
	cur := natsRaftTimers()
	if cur != t {
		if raftInUse.nodes > 0 {
			return fmt.Errorf("%w: raft timers %v: the cluster nodes running in this process use %v (the timers are nats-server's, one set per process)", ErrInvalidConfig, t, cur)
		}
		if err := setNATSRaftTimers(t); err != nil {
			return err
		}
	}
	raftInUse.nodes++
	return nil
}

// releaseRaftTimers ends an acquireRaftTimers once its node's server has
// shut down.
func releaseRaftTimers() {
	raftInUse.Lock()
	defer raftInUse.Unlock()
	raftInUse.nodes--
}
