package broker

// What the tests of package broker_test reach inside.
var (
	// RaftLinked: the raft timers linked in raft_linkname.go are
	// nats-server's.
	RaftLinked = raftLinked
	// CurrentRaftTimers reads nats-server's raft timers.
	CurrentRaftTimers = natsRaftTimers
	// DrawElectionWait is nats-server's own draw of a follower's wait
	// before it stands for election.
	DrawElectionWait = natsRandElectionTimeout
	// AcquireRaftTimers and ReleaseRaftTimers are what a cluster node's
	// Start and Shutdown do with the timers.
	AcquireRaftTimers = acquireRaftTimers
	ReleaseRaftTimers = releaseRaftTimers
)
