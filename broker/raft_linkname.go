package broker

// This file reaches into nats-server's raft, which has no option for its
// timers: the package variables of server/raft.go in
// github.com/nats-io/nats-server/v2 v2.15.2 (the version go.mod pins):
//
//	var (
//		minElectionTimeout = minElectionTimeoutDefault // 4 s
//		maxElectionTimeout = maxElectionTimeoutDefault // 9 s
//		hbInterval         = hbIntervalDefault         // 1 s
//		...
//	)
//	func randElectionTimeout() time.Duration // between the two, for each wait
//
// go:linkname makes the variables below those variables (Go restricts
// such links into the standard library only). The lost-quorum timers
// next to them are left as they are (see RaftTimers).
//
// When nats-server is upgraded, check server/raft.go again:
//
//   - randElectionTimeout gone or renamed: the build fails ("relocation
//     target ... not defined"), as it does for any function linked here.
//   - a variable gone or renamed: the build does NOT fail (a linked
//     variable that does not exist is defined here instead, as zero).
//     raftLinked is then false and a cluster node refuses to start
//     (setNATSRaftTimers), and TestRaftTimers fails.
//   - the variables kept but no longer read by randElectionTimeout (or
//     read differently): setNATSRaftTimers finds the waits it draws
//     outside the timers just set, puts the old values back and fails.
//
// The variables are read by the raft goroutines of every running server
// without a lock: they are written only while no cluster node of this
// process runs (see acquireRaftTimers).

import (
	"fmt"
	"time"
	_ "unsafe" // go:linkname
)

//go:linkname natsMinElectionTimeout github.com/nats-io/nats-server/v2/server.minElectionTimeout
var natsMinElectionTimeout time.Duration

//go:linkname natsMaxElectionTimeout github.com/nats-io/nats-server/v2/server.maxElectionTimeout
var natsMaxElectionTimeout time.Duration

//go:linkname natsHBInterval github.com/nats-io/nats-server/v2/server.hbInterval
var natsHBInterval time.Duration

//go:linkname natsRandElectionTimeout github.com/nats-io/nats-server/v2/server.randElectionTimeout
func natsRandElectionTimeout() time.Duration

// raftLinked: the linked variables are nats-server's (which initialises
// them before this package: it is imported). Variables defined here
// instead would be zero.
var raftLinked = natsHBInterval > 0 && natsMinElectionTimeout > 0 && natsMaxElectionTimeout > natsMinElectionTimeout

// natsRaftTimers reads nats-server's raft timers.
func natsRaftTimers() RaftTimers {
	return RaftTimers{Heartbeat: natsHBInterval, ElectionMin: natsMinElectionTimeout, ElectionMax: natsMaxElectionTimeout}
}

// setNATSRaftTimers writes nats-server's raft timers (t is valid), and
// checks that its raft draws its election waits from them. No server
// may run meanwhile.
func setNATSRaftTimers(t RaftTimers) error {
	if !raftLinked {
		return fmt.Errorf("broker: nats-server's raft timers were not found (server/raft.go: hbInterval, minElectionTimeout, maxElectionTimeout): the nats-server module is not the version jetfabric was built for (v2.15.2); see broker/raft_linkname.go")
	}
	old := natsRaftTimers()
	natsHBInterval, natsMinElectionTimeout, natsMaxElectionTimeout = t.Heartbeat, t.ElectionMin, t.ElectionMax
	for range 16 {
		if d := natsRandElectionTimeout(); d < t.ElectionMin || d >= t.ElectionMax {
			natsHBInterval, natsMinElectionTimeout, natsMaxElectionTimeout = old.Heartbeat, old.ElectionMin, old.ElectionMax
			return fmt.Errorf("broker: nats-server's raft drew an election wait of %v after its timers were set to %v: it no longer reads them where jetfabric sets them (the nats-server module is not v2.15.2?); see broker/raft_linkname.go", d, t)
		}
	}
	return nil
}
