package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/worker"
)

// claimKinds are the device kinds a worker of this binary can claim.
var claimKinds = []string{"cpu"}

// checkClaim rejects a -claim that cannot work, before anything connects.
func checkClaim(kind string, wf *workerFlags) error {
	ok := false
	for _, k := range claimKinds {
		ok = ok || kind == k
	}
	switch {
	case !ok:
		return fmt.Errorf("-claim %q: want one of %s", kind, strings.Join(claimKinds, ", "))
	case wf.devices != "":
		return fmt.Errorf("-claim and -devices exclude each other: -claim picks the device names")
	case wf.cpus < 1:
		return fmt.Errorf("-cpus %d: want at least 1 slot to claim", wf.cpus)
	}
	return nil
}

// claimDevices reserves -cpus free slots of kind and names them in
// wf.devices, so that replicas of one service each get their own devices.
func claimDevices(ctx context.Context, nc *nats.Conn, kind string, wf *workerFlags) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	names, err := worker.ClaimDevices(ctx, nc, worker.Claim{Kind: kind, Count: wf.cpus, Worker: wf.id})
	if err != nil {
		return err
	}
	wf.devices = strings.Join(names, ",")
	return nil
}
