// Package objectstore keeps jetfabric's tensor blobs in the JetStream
// object store: transfers between devices, large uploads and large
// results, in the FABRIC_XFER bucket.
//
//	s, err := objectstore.New(js, subjects.Default().XferBucket())
//	if err != nil { ... }
//	info, err := s.Put(ctx, transferID, data, map[string]string{"dtype": "f32", "shape": "2,3"})
//	// elsewhere:
//	info, err = s.Wait(ctx, transferID)       // until the writer is done
//	err = s.GetInto(ctx, transferID, buf)     // len(buf) == info.Size
//
// # Format
//
// Objects are written in the object store's own format (ADR-20), exactly as
// nats.go's jetstream.ObjectStore and the nats CLI write them, so either
// reads what the other wrote. A bucket is the stream OBJ_<bucket>. An
// object's data is the payloads, in stream order, of the messages on
// $O.<bucket>.C.<nuid>, a subject new on every Put. Its meta is one
// ObjectInfo JSON message on $O.<bucket>.M.<base64url(name)>, published
// with Nats-Rollup: sub so it replaces the previous one; it holds the name,
// the caller's metadata, the size, the number of chunks, the chunk size
// and the digest "SHA-256=<base64url>", and in its headers the CRC-32 of
// the data (Jetfabric-Crc32, 8 hex digits; see Checks). Deleting publishes a meta marked
// deleted and purges the chunks, as nats.go does.
//
// # Writing
//
// Put splits the data into chunks of WithChunkSize bytes (256 KiB by
// default) and publishes them asynchronously, each with its own reply
// subject, keeping at most WithWindow chunks (64, so 16 MiB, by default)
// published and not yet acknowledged. nats.go keeps up to 4000 in flight
// whatever it is told, which can overrun a stream's ingest queue (128 MiB
// by default) and be answered 429 Too Many Requests; a bounded window
// cannot, and measured as fast as wider ones (BenchmarkWindow: 8 to 256
// chunks within noise). The SHA-256 is computed on a second goroutine
// that runs at most four chunks ahead of the publisher, so hashing and
// publishing use two cores and each chunk is still in cache when it is
// copied out.
//
// A refused chunk (429, or JetStream temporarily unavailable) stops
// sending; once nothing is in flight the writer deletes, by sequence, the
// chunks stored after the refused one, waits (doubling from 20 ms), halves
// its window after a 429, and resends from the refused chunk, so the
// subject always holds chunks 0..i in order. After an ack timeout it cannot
// know what was stored, so it purges the subject and starts over on a new
// one (and checks the count of chunks on the subject before the meta goes
// out). WithRetries bounds these restarts (8 by default); past that, or on
// a refusal that cannot succeed later (bucket full), Put fails with
// ErrRefused. The meta, with the digest, is published only when every
// chunk is acknowledged, so no reader sees a partial object; on any
// failure, cancellation included, the chunks written are purged (and a
// meta whose ack never came is undone). An object replaced by a Put of the
// same name has its chunks purged after the new meta is in. Names are
// meant to be used once (transfer ids, digests): a reader of an object
// that is replaced under it fails with ErrDigest.
//
// # Chunk size
//
// 256 KiB was measured against 128 KiB, 1 MiB and 4 MiB with the same
// bytes in flight (BenchmarkChunkSize, BenchmarkReadAhead; two cores, file
// storage, 64 and 256 MiB objects). Put ran 10 to 25% faster with 128 or
// 256 KiB chunks than with 1 MiB ones, and 4 MiB was slowest: a chunk that
// fits in a core's cache goes through the publisher's copy, the socket and
// the broker's copies without a trip to memory in between. Get varied
// within about 10% across 128 KiB to 1 MiB, 4 MiB again slowest. Between
// 128 and 256 KiB, 256 KiB sends half the messages and acks for the same
// speed. The broker's max_payload (8 MiB) bounds it; New checks the chunk
// size against the connection's max_payload and the bucket's max message
// size. Readers take each object's chunk size from its meta, so objects
// with any chunk size read.
//
// # Reading
//
// Get and GetInto read the meta with a direct get, then the chunks with
// batched direct gets ($JS.API.DIRECT.GET.<stream>, next_by_subj from the
// last chunk's sequence), which need no consumer on the broker (a small
// object is two round trips, against four for an ordered consumer's
// create, deliver and delete) and are answered by any replica. One request
// asks for WithReadAhead bytes of chunks (4 MiB by default, which also
// bounds what the broker queues for the connection) and the next is sent
// as soon as the last chunk of the previous one arrives. Small batches
// read faster than large ones (BenchmarkReadAhead: 4 MiB beat 16 and 32
// MiB by 10 to 20%): the chunks are still in cache when they are copied. The broker sends each chunk with the
// number of messages left on the subject after it; for chunk i of n that
// must be n-1-i, which catches missing, extra or stale chunks (a replica
// that has not caught up) before they are copied; the reader then starts
// over from its last good chunk, and gives up with ErrDigest after
// WithRetries. Chunks are copied straight into the destination and hashed
// by a goroutine that trails the one receiving them. At the end the size
// and the CRC-32 (or the SHA-256) are compared with the meta: ErrDigest
// when they differ.
// A link to an object in the same bucket is followed, as nats.go does.
//
// # Waiting
//
// Wait watches only the object's meta subject with an ordered consumer
// (last message per subject, then new ones) and returns at the first meta
// that is not a delete marker. It never lists the bucket. Its consumer is
// deleted when it returns.
//
// Notify subscribes to the bucket's meta subjects, with no consumer: it
// hears of each object stored under a prefix from then on, as its meta is
// published, which may be before the stream has stored it (Wait for it
// before reading). A notice lost with the connection is not made up for.
//
// # Following a writer
//
// A reader need not wait for the meta: Put with WithNUID writes the
// chunks on a subject the caller chose and announced first (in a
// key-value entry, in a reply), and Follow reads them as they are written.
// It subscribes to the chunk subject and the meta subject with a plain
// subscription, so the broker hands each chunk over as it takes it, beside
// storing it. A bucket is one stream, and one goroutine of the broker both
// stores a stream's messages and delivers them to its consumers; with a
// consumer, that goroutine was the bottleneck of a transfer (on 8 cores it
// spent a third of its time copying each delivered chunk to append a
// line end). The chunks the broker took before the subscription are read
// from the stream with batched direct gets while the rest arrive; each
// chunk's index is the last token of the inbox its ack goes to, which Put
// writes so. The meta, written after the last chunk's ack, ends the read;
// the bytes read must match its size, number of chunks and CRC-32, or
// SHA-256 where it has none: the follower computes the CRC-32 as chunks
// come and, for a meta with none, the SHA-256 of the bytes read at the
// end. An object already complete when Follow starts is read with direct
// gets, as GetInto reads it. When the live chunks do not come in order (the reader
// fell behind and some were dropped from its bounded queue, or the writer
// rewound after a refusal) or are not named by index (another writer),
// Follow reads the chunk subject again from its start with an ordered
// consumer, in stream order. Anything else (the writer started over on
// another subject, another writer of the same name won, a delete marker)
// is resolved by the meta: Follow reads the object again from it as
// GetInto does, or fails. Abort writes a delete marker carrying the writer's
// reason, so a follower learns at once that nothing will come; a writer
// that just stops is given up on after the store's timeout with nothing
// new. The writer and the reader then work at the same time, and the
// transfer costs about the slower of the two instead of their sum
// (BenchmarkPipelined). WithSHA256 spares a caller that has already
// hashed the data a second pass. WithNameFromDigest goes further for data
// named by its digest (an upload): Put writes the chunks at once, hashes
// beside the write, and takes the name from the digest as soon as it is
// known, well before the last chunk is stored, so the caller can announce
// the object while it is written; the name only has to be in the meta,
// which comes last. WithFollowAhead (32 MiB by default) bounds what a
// follower holds and has not copied: twice that in its queue of live
// chunks (more are dropped, and the follower falls back), and that much
// asked for by the consumer it falls back to. When Follow read through a
// consumer only, a larger pull window made it faster
// (BenchmarkFollowAhead, 256 MiB on 8 cores: 1,064 MB/s with 32 MiB
// against 853 with 8); the live read is at 1,140 to 1,150 MB/s with 8
// or 16 MiB and 1,065 with 32.
//
// # Parts
//
// With WithParts(n), n > 1, an object larger than WithPartThreshold (256
// MiB by default) is written as up to n parts moved in parallel, each an
// ordinary object named <name>.part<i>.<token> (the token is new on every
// Put, so a replaced object's parts are never overwritten under a reader),
// then a manifest under <name>: an ordinary object whose content is JSON
// listing the parts with their sizes and digests, and whose meta headers
// (Jetfabric-Parts, Jetfabric-Size, Jetfabric-Sha256) give the whole
// object's size and SHA-256, so Stat and Wait need one read. Get reads the
// parts in parallel, each checked against its own digest and the
// manifest's. The window and the read-ahead are shared among the parts.
// The nats CLI sees the manifest and each part as objects; concatenating
// the parts gives the data. Parts are off by default: one bucket is one
// stream with one ingest path, and Put still computes the whole object's
// SHA-256 besides each part's. Measured with 256 MiB: on two cores parts
// are slower both ways (Put about 750 against 1070 MB/s); on 16 cores Get
// gains about 20% and Put loses about 10%.
//
// # Lanes
//
// Lanes (lanes.go) move one object as pieces, each an ordinary object on
// a connection of its own, for a caller that holds a Store of the bucket on
// each of several connections: the broker reads each connection on one
// goroutine and every byte is hashed with SHA-256 by its writer, so one
// connection moves about 1 GB/s at best (4 pieces on 4 connections: 2.5 GB/s on 16 cores,
// with the bucket in memory). Unlike parts, pieces have no manifest and no
// digest of the whole: the reader is told how many there are (jetfabric's
// upload op and read answer carry it), piece i of k of an object of n
// bytes being bytes [i*n/k, (i+1)*n/k) under the name <name>.<i>, on the
// chunk subject <nuid>-<i>.
//
// # Checks
//
// Put computes the SHA-256 the format requires and, in the same pass, the
// CRC-32 (IEEE, as zlib computes it) of the data, which it writes in the
// meta's Jetfabric-Crc32 header. Readers check the data against that
// CRC-32 where the meta carries a well-formed one, and against the digest
// otherwise (objects written by nats.go, the nats CLI, or Put with
// WithSHA256, which writes no CRC-32). A CRC-32 costs about a twentieth of
// a SHA-256 on one core (30 GB/s against 1.3 to 1.9), and catches what the
// digest catches short of a writer that lies: lost, extra, stale or
// corrupted chunks, an object replaced under its reader. The digest stays
// the object's identity: the name of an object named by its content, and
// what a checkpoint's manifest records.
//
// # Concurrency
//
// A Store is safe for concurrent use. Every call works on its own inbox
// subscription and waits, before it returns, for every goroutine it
// started (the digest goroutine of Put, the copying goroutine of Get, the
// part goroutines) to end. Calls block until done or until their context ends;
// a call whose context has no deadline is bounded per step by WithTimeout
// (the JetStream context's default timeout).
package objectstore
