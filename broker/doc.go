// Package broker runs jetfabric's embedded NATS server with JetStream and
// provisions what the fabric needs in it: the ops and jobs streams
// (FABRIC_OPS, FABRIC_JOBS), the control and graph key-value buckets
// (FABRIC_CTRL, FABRIC_GRAPHS) and the object buckets of transfers and
// uploads (FABRIC_XFER), large results (FABRIC_RESULTS, in memory) and
// checkpoints (FABRIC_CKPT).
//
// A Broker is a single node or one node of a JetStream cluster. Start
// returns once JetStream itself answers (not merely once the listener is
// up) and every stream and bucket exists; Shutdown is idempotent.
//
// Config.TLS requires TLS of every client on the client listener (and,
// with Verify, a client certificate); ClusterConfig.TLS puts the routes
// between nodes under mutual TLS. The broker's own connections (Connect)
// then go in process.
//
//	cfg := broker.DefaultConfig()
//	cfg.StoreDir = "/var/lib/jetfabric"
//	b, err := broker.New(cfg)
//	if err != nil { ... }
//	if err := b.Start(ctx); err != nil { ... }
//	defer b.Shutdown(context.Background())
//	nc, err := nats.Connect(b.ClientURL())
//
// A cluster node sets nats-server's raft timers (ClusterConfig.Raft,
// RaftTimers; nats-server has no option for them): by default the others
// elect a new leader 1.5 to 3 s after a node dies without handing over,
// where nats-server alone waits 4 to 9 s. The timers are process-wide.
//
// With Config.AuthDir (made by `jetfabric tenant init`, see package tenant)
// the server runs in operator mode: clients authenticate with creds files,
// tenants stay in their namespaces by subject permissions, each tenant
// gets its object bucket and signed record, the broker answers the
// tenants' registry requests, and the permission violations the server
// reports are counted (Violations, WriteMetrics).
package broker
