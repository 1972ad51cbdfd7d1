// Package natsconn opens further connections like one a process already
// has: the same servers, credentials, TLS and inbox prefix, for traffic
// that should not queue behind the first connection's (transfer lanes,
// checkpoints).
package natsconn

import "github.com/nats-io/nats.go"

// Another dials a new connection with nc's options, named name, without
// nc's handlers, which are for nc.
func Another(nc *nats.Conn, name string) (*nats.Conn, error) {
	opts := nc.Opts
	opts.Name = name
	opts.ClosedCB, opts.DisconnectedCB, opts.DisconnectedErrCB, opts.ConnectedCB = nil, nil, nil, nil
	opts.ReconnectedCB, opts.DiscoveredServersCB, opts.AsyncErrorCB, opts.ReconnectErrCB = nil, nil, nil, nil
	return opts.Connect()
}
