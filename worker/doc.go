// Package worker owns devices and executes their op streams.
//
// A Worker claims one or more devices (cpu-0, gpu-0, ...), registers each in
// the FABRIC_CTRL bucket with its properties and a heartbeat, and runs one
// loop per device that consumes the device's frames from FABRIC_OPS in
// stream order, from a push consumer it re-creates after a gap (feed.go),
// running each frame on the consumer's delivery goroutine and keeping
// house on its own. Frame order is execution order.
// A device whose consumer is lost (its cluster node died) and cannot be
// re-created after a few tries is taken over again by its own worker:
// last checkpoint, then the frames after it, on a new consumer.
//
// Each session (the last token of the op subject) has its own tensor table:
// ids are minted by the client, and a session can only name its own
// tensors. A failed op marks the ids it would have produced as failed; a
// later use reports the first cause. Errors are collected per session and
// returned on the session's next read or sync. Nothing that arrives over the
// wire panics the worker: a bad frame becomes an error result and the
// worker goes on serving every other session.
//
// Reads and syncs are answered on core NATS, on the subject in the frame's
// Fabric-Reply header, in the frame's encoding. Results larger than the
// inline limit go through the FABRIC_XFER object store: the answer names
// the object and its chunk subject and goes out first, so the client
// copies the chunks while the worker writes them.
//
// Tensors move between devices through FABRIC_XFER too (transfer.go): the
// source announces the object in FABRIC_CTRL (chunk subject, dtype, shape)
// and writes it, the target allocates the tensor and copies the chunks as
// they are stored, checking the SHA-256 at the end. A target whose source
// stops mid-object follows the chunk subject that the source's replacement
// announces when it replays the expose. Large uploads are read the same
// way while the client writes them. Host tensors (the CPU backend's) are
// written from and read into in place.
//
// Collectives (all_reduce, all_gather, reduce_scatter, broadcast) move
// their pieces the same way. On a device whose tensors live in host memory
// they run beside the loop (collective.go): the op is checked, its output
// allocated and put in the session table in flight, and the loop goes on
// with the next ops while a goroutine exchanges the pieces. What reads the
// output waits for it; a read or sync waits for its session's collectives,
// a checkpoint for the device's, and a failure is reported as the op's own
// error. Config.SyncCollectives runs them in the loop instead.
//
// Each worker registers as one instance of the NATS micro service
// "jetfabric-worker" (see micro.go), its id and devices in the metadata,
// with endpoints fabric.svc.<device>.info and fabric.svc.<device>.health,
// so `nats micro list` and `nats micro info` show the fabric's workers.
//
// Sessions are freed when the client closes them or when they have been
// idle past Config.IdleTimeout: no frame, and no heartbeat from the client
// on fabric.alive.<device>.<session> (liveness.go). A frame of a session
// freed as idle is answered with session_freed. The tensors of all the
// sessions of a device share its memory budget (memory.go); an op that
// would pass it fails with resource_exhausted. On a backend that writes in
// place (the CPU's elementwise ops and optimizer steps), an output takes
// the buffer of an input of its dtype and shape that the frame or replay
// frees right after the op (donate.go), so an optimizer step updates its
// parameter and moments where they are. On a backend that records device
// work (kernels.Program: the CPU and CUDA backends), a session's replays
// of a graph run from the third on as the program recorded at the second
// (program.go): the same bits, with nothing checked or allocated op by op.
//
// Checkpoints are written beside the device loop (checkpoint.go): the loop
// takes a snapshot of references and goes on; a goroutine writes it,
// giving way before each chunk while the loop runs a frame (giveWay).
// A takeover restores lazily (restore.go): the device serves once the
// manifest is in, and its large tensors are read in the background, an op
// that needs one waiting for it. A standby reads the checkpoints'
// tensors ahead as they are written (warm.go), so that a takeover finds
// most of them in memory; of several standbys, the one holding the most
// takes the lease. Lease renewals (lease.go), registry heartbeats and
// session heartbeats run on goroutines of their own and never take the
// loop; the lease is renewed during a takeover too. While
// the process's workers hold tensors, GOGC follows their bytes (gc.go).
//
// With Config.Tenants (tenants.go) the devices also take the tenants'
// frames, fabric.t.<tenant>.ops.<device>.<session>: the session is keyed by
// tenant and token, answered only under the tenant's inbox, its objects in
// the tenant's bucket, its quotas those of the tenant's record, which the
// worker takes from the control bucket only when the fabric's account
// signed it. The quotas bound a tenant's use of every device together: a
// device counts the others' use from their registry entries, through views
// published into its own frames (quota.go).
//
// Locks: device.loop (held while a frame runs or the loop keeps house) may
// be held while taking device.mu or lease.mu (which serialises the lease's
// compare-and-set writes, over the network). device.ck.mu, device.mem.mu,
// device.aliveMu and a mover's mu are leaves, held only to read or update
// fields, as is the worker's tenants.mu (taken under device.loop). Stop ends every device loop, marks the devices stopped in
// the registry and waits for its goroutines.
package worker
