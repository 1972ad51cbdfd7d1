// Package broker runs jetfabric's embedded NATS server with JetStream and
// provisions what the fabric needs in it: the ops stream (FABRIC_OPS), the
// control key-value bucket (FABRIC_CTRL) and the transfer object bucket
// (FABRIC_XFER).
//
// A Broker is a single node or one node of a JetStream cluster. Start
// returns once JetStream itself answers (not merely once the listener is
// up) and every stream and bucket exists; Shutdown is idempotent.
//
//	cfg := broker.DefaultConfig()
//	cfg.StoreDir = "/var/lib/jetfabric"
//	b, err := broker.New(cfg)
//	if err != nil { ... }
//	if err := b.Start(ctx); err != nil { ... }
//	defer b.Shutdown(context.Background())
//	nc, err := nats.Connect(b.ClientURL())
package broker
