// Package client is the Go client of jetfabric.
//
// A Client connects to the fabric's NATS server; Devices lists the devices
// workers serve; Open starts a session on one device. Tensors are built
// lazily: every call returns a new *Tensor at once, its id minted here, and
// the op is queued. Queued ops travel in frames that are published on the
// session's op subject when a read or sync needs them, when a frame is
// full, or after a short timer, so a program pays per frame, not per op.
//
//	c, err := client.Connect("nats://127.0.0.1:4222")
//	if err != nil { ... }
//	defer c.Close()
//	s, err := c.Open(ctx, "cpu-0")
//	if err != nil { ... }
//	defer s.Close(ctx)
//	a := s.FromFloat32([]int{2, 2}, []float32{1, 2, 3, 4})
//	b := a.Matmul(a).Add(s.Full([]int{2, 2}, 1)).Relu()
//	vals, err := b.Float32s(ctx) // [8 11 16 23]
//
// A frame the stream refuses (full, over its maximum message size, or no
// stream capturing the subject) is reported as ErrPublish: by the read,
// sync or close whose frame it was, about three frame-check intervals after
// it was sent (WithFrameCheck), or else by the session's next read or sync.
//
// On a fabric with tenants, WithCreds authenticates with a creds file and
// puts the client in the tenant's namespace (its subjects, inbox prefix and
// object bucket; docs/PROTOCOL.md, Tenants); credentials refused or expired
// fail Connect with ErrCredentials, naming the file and the cause.
//
//	c, err := client.Connect("nats://127.0.0.1:4222", client.WithCreds("auth/acme.creds"))
//
// Errors from the worker (a shape mismatch, an unknown id) do not stop the
// building of ops: they surface on the session's next read or sync, as
// *codec.Error values naming the op, its position and the reason (use
// errors.As). A Session is safe for concurrent use; ops from concurrent
// goroutines are ordered as they are queued.
package client
