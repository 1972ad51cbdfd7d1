"""The JetStream object store, spoken with plain NATS (ADR-20; the format is
written out in docs/PROTOCOL.md §7): chunked writes with a bounded window of
acknowledgements, reads by batched direct gets, digests, links, deletes.

Reads and waits carry on across a lost connection that is made again
within their timeout: a batch of chunks whose answers were lost is asked
again from where it stopped, a follow's subscription is made again by the
connection (the chunks published meanwhile are read from the stream), and a
wait for a meta looks again once connected. A write whose acknowledgements
were lost with the connection starts over once connected, on a new chunk
subject, as the Go client's writes do (see ObjectStore.put).
"""

from __future__ import annotations

import base64
import hashlib
import json
import mmap
import secrets
import threading
import time
import zlib
from datetime import datetime, timezone
from typing import Callable, Dict, List, Optional, Tuple, Union

from .errors import (ConnectionClosedError, DisconnectedError, FabricError, JetStreamError, NoRespondersError,
                     ObjectStoreError, TimeoutError)
from .nats import Connection, Msg, parse_ack

__all__ = ["ObjectStore", "digest_string", "CHUNK_SIZE"]

CHUNK_SIZE = 256 << 10
WINDOW = 64
# How many times a write starts over (the Go objectstore's DefaultRetries).
RETRIES = 8
READ_AHEAD = 4 << 20


def digest_string(sha256: bytes) -> str:
    """The ADR-20 form of a SHA-256 digest: "SHA-256=" + padded base64url."""
    return "SHA-256=" + base64.urlsafe_b64encode(sha256).decode()


def parse_digest(s: str) -> bytes:
    if not s.startswith("SHA-256="):
        raise ObjectStoreError("digest %r is not SHA-256=<base64url>" % s)
    rest = s[8:]
    return base64.urlsafe_b64decode(rest + "=" * (-len(rest) % 4))


# The meta header in which jetfabric's writers put the CRC-32 of an
# object's data (8 lower-case hex digits, zlib's CRC-32); readers check it
# instead of the SHA-256 digest where it is well formed (docs/PROTOCOL.md §7).
CRC_HEADER = "Jetfabric-Crc32"

_HEX = frozenset("0123456789abcdefABCDEF")


def crc_of(meta: dict) -> Optional[int]:
    """The CRC-32 that meta's headers give, or None where they give none or
    a malformed one (the digest is then what is checked)."""
    v = ((meta.get("headers") or {}).get(CRC_HEADER) or [""])[0]
    if not isinstance(v, str) or len(v) != 8 or not _HEX.issuperset(v):
        return None
    return int(v, 16)


class _Crc:
    """A CRC-32 with hashlib's update (zlib lets go of the interpreter's
    lock on large buffers)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Union[bytes, bytearray, memoryview]) -> None:
        self.value = zlib.crc32(data, self.value)


def _check_for(meta: dict) -> Union[_Crc, "hashlib._Hash"]:
    """What a reader that knows meta computes over the data: the CRC-32 where
    meta has one, else the SHA-256."""
    return _Crc() if crc_of(meta) is not None else hashlib.sha256()


def _checked(meta: dict, h: Union[_Crc, "hashlib._Hash"]) -> bool:
    """Whether h, made by _check_for(meta) and fed the data, matches meta
    (a meta with no digest and no CRC-32 matches, as before)."""
    c = crc_of(meta)
    if c is not None:
        return isinstance(h, _Crc) and h.value == c
    want = meta.get("digest", "")
    return not want or (not isinstance(h, _Crc) and parse_digest(want) == h.digest())


def _checked_live(meta: dict, crc: int, data: Union[bytearray, memoryview]) -> bool:
    """Whether data, read before its meta was known and hashed with CRC-32 as
    it came (crc), matches meta: its CRC-32, or where it has none its
    digest, computed now."""
    c = crc_of(meta)
    if c is not None:
        return c == crc
    want = meta.get("digest", "")
    return bool(want) and parse_digest(want) == hashlib.sha256(data).digest()


def buffer(size: int) -> Union[bytearray, memoryview]:
    """A zeroed buffer of size bytes to read an object into: a bytearray
    when small, else a memoryview of an anonymous mmap whose pages are
    supplied at once, without the interpreter's lock: transparent huge
    pages where the kernel gives them (MADV_HUGEPAGE, then
    MADV_POPULATE_WRITE: Linux 5.14 or later), else small pages
    (MAP_POPULATE). bytearray(n) zeroes n bytes holding the lock, and pages
    touched one at a time cost a fault each: 64 MiB took about 50 ms and 50
    to 110 ms those ways on the 2-core development VM, 29 to 31 ms in small
    pages populated, 7.5 ms in huge pages; and the socket's reads and the
    digest then run over 2 MiB pages."""
    if size < _MMAP_AT:
        return bytearray(size)
    anon = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
    huge = getattr(mmap, "MADV_HUGEPAGE", None)
    if huge is not None and hasattr(mmap.mmap, "madvise"):
        m = mmap.mmap(-1, size, flags=anon)
        try:
            m.madvise(huge)
            m.madvise(_MADV_POPULATE_WRITE)
            return memoryview(m)
        except (OSError, ValueError):
            m.close()  # an older kernel: small pages, populated at once
    try:
        return memoryview(mmap.mmap(-1, size, flags=anon | getattr(mmap, "MAP_POPULATE", 0)))
    except (OSError, ValueError):
        return memoryview(mmap.mmap(-1, size))


_MMAP_AT = 1 << 20
# Linux's MADV_POPULATE_WRITE (5.14): fault the pages in, writable, now.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Placer:
    """Places the live chunks of an object being written into out as they
    arrive (the connection's reader reads each payload straight into its
    place, see Connection.subscribe's sink) and computes their CRC-32 in
    order on a thread of its own, so that it overlaps the transfer (zlib
    lets go of the GIL on large buffers). The chunks stored before the
    subscription are read from the stream by that thread first. next is
    the index after the last chunk placed; finish returns the CRC-32 of
    chunks 0..next-1, or None when the chunks did not come in order."""

    def __init__(self, store: "ObjectStore", subject: str, size: int):
        self.store = store
        self.subject = subject
        self.out = memoryview(b"")
        self.size = size
        self._ready = threading.Event()
        self.chunk = 0
        self.first = -1
        self.next = 0
        self.bad = False
        self._spans: List[Tuple[int, int]] = []
        self._cv = threading.Condition()
        self._done = False
        self._crc: Optional[int] = None
        self._thread: Optional[threading.Thread] = None

    def sink(self, subject: str, reply: str, n: int) -> Optional[memoryview]:
        """Reader thread: where chunk of reply's index goes, or None (then taken gives up)."""
        if not self._ready.is_set():
            self._ready.wait()  # the buffer, being made (tens of ms): the socket holds what comes meanwhile
        idx = reply.rsplit(".", 1)[-1]
        if self.bad or not idx.isdigit():
            self.bad = True
            return None
        i = int(idx)
        if self.first < 0:
            if n == 0 or i * n + n > self.size:
                self.bad = True
                return None
            self.first, self.next, self.chunk = i, i, n
            self._thread = threading.Thread(target=self._hash, name="jetfabric-follow", daemon=True)
            self._thread.start()
        off = i * self.chunk
        if i != self.next or off + n > self.size or (n != self.chunk and off + n != self.size):
            self.bad = True
            return None
        self.next = i + 1
        return self.out[off : off + n]

    def taken(self, m: Optional[Msg]) -> None:
        """Reader thread: a chunk read; one not placed by sink spoils the live read."""
        if m is None:
            with self._cv:
                self.bad = True
                self._cv.notify()
            return
        if self.bad or not isinstance(m.data, memoryview) or m.data.obj is not self.out.obj:
            self.bad = True
            return
        off = (self.next - 1) * self.chunk
        with self._cv:
            self._spans.append((off, m.data.nbytes))
            self._cv.notify()

    def _hash(self) -> None:
        h = _Crc()
        try:
            if self.first > 0 and not self._backfill(h):
                self.bad = True
            k = 0
            while True:
                with self._cv:
                    while k >= len(self._spans) and not self._done and not self.bad:
                        self._cv.wait()
                    if self.bad:
                        return
                    if k >= len(self._spans):
                        break
                    off, n = self._spans[k]
                k += 1
                h.update(self.out[off : off + n])
            self._crc = h.value
        except Exception:  # noqa: BLE001 - the caller reads the object again
            self.bad = True

    def _backfill(self, h: _Crc) -> bool:
        """Reads chunks 0..first-1 from the stream into place; False when they
        do not fit (the caller then reads the whole object again)."""
        got, seq = 0, 0
        deadline = time.monotonic() + self.store.timeout
        while got < self.first:
            ms = self.store._batch(self.subject, seq, self.first - got)
            if not ms:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.0005)  # taken by the broker, not stored yet
                continue
            for m in ms:
                d = m.data
                if got >= self.first or len(d) != self.chunk:
                    return False
                off = got * self.chunk
                self.out[off : off + len(d)] = d
                h.update(d)
                got += 1
                seq = int(m.headers.get("Nats-Sequence", "0")) + 1
        return True

    def place(self, out: memoryview) -> None:
        """Gives the placer the buffer of the object's size to place into."""
        self.out = out
        self._ready.set()

    def finish(self) -> Optional[int]:
        """Waits for the hashing of what was placed: its CRC-32, or None."""
        self._ready.set()
        with self._cv:
            self._done = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()
        if self.bad or self.first < 0:
            return None
        return self._crc


class _Restart(Exception):
    """A write's chunks must be written again (see ObjectStore.put): cause
    says why."""

    def __init__(self, cause: Exception):
        super().__init__(str(cause))
        self.cause = cause


def _retryable(e: JetStreamError) -> bool:
    """Whether a refused chunk or meta may be stored when published again:
    too many requests (a stream's ingest queue full), or JetStream not
    available for now (the Go objectstore's rule)."""
    return e.code == 429 or e.err_code == 10008


def _backoff(attempt: int) -> float:
    """20 ms doubled per attempt, at most a second (the Go objectstore's)."""
    return min(0.02 * (1 << min(attempt - 1, 10)), 1.0)


class _Write:
    """One object being written by ObjectStore.put: its chunk subject
    (nuid), the subjects it gave up (abandoned), the acknowledgements of
    the current attempt, and whether an object of its final name is stored
    (prev, asked by a direct get whose answer comes on the reader thread
    while the chunks go on being written)."""

    def __init__(self, store: "ObjectStore", nuid: str, final: Optional[str], size: int):
        self.store = store
        self.conn = store.conn
        self.nuid = nuid
        self.final = final
        self.size = size
        self.abandoned: List[str] = []
        self.restarts = 0
        self.cv = threading.Condition()
        # acked: acknowledgements in; err: a final refusal; lost: a reason
        # to start over; want: the count of acknowledgements the writer
        # waits for (it is woken once, when they are in, not for each one).
        self.acked = 0
        self.err: Optional[Exception] = None
        self.lost: Optional[Exception] = None
        self.want = 0
        self._gen = object()
        self.prev: Optional[bool] = None
        self.prev_reply, self.prev_token = self.conn.new_reply(self._on_prev)
        self.reply, self.token = "", ""
        self._arm()

    def _arm(self) -> None:
        """Listens for the acknowledgements of a new attempt, on a reply
        subject of its own: late ones of an attempt given up go nowhere."""
        if self.token:
            self.conn.drop_reply(self.token)
        gen = object()
        self._gen = gen
        self.reply, self.token = self.conn.new_reply(lambda m: self._on_ack(m, gen))
        self.acked, self.err, self.lost, self.want = 0, None, None, 0

    def _on_ack(self, m: Optional[Msg], gen: object) -> None:
        with self.cv:
            if gen is not self._gen:
                return
            if m is None:
                # Acknowledgements in flight were lost with the connection.
                self.lost = self.conn._closed or DisconnectedError(
                    "the connection to the broker was lost while writing %s, its acknowledgements with it"
                    % (self.final or self.nuid))
                self.cv.notify()
                return
            d = m.data
            try:
                # A stored chunk's acknowledgement, {"stream":...,"seq":N},
                # needs no decoding: 256 of them come per 64 MiB.
                if m.status or b'"seq":' not in d or b'"error"' in d:
                    parse_ack(m, self.store.chunk_subject(self.nuid))
            except NoRespondersError as e:
                self.lost = self.lost or e
            except JetStreamError as e:
                if _retryable(e):
                    self.lost = self.lost or e
                elif self.err is None:
                    self.err = e
            except Exception as e:  # noqa: BLE001 - an unreadable acknowledgement
                if self.err is None:
                    self.err = e
            self.acked += 1
            if self.acked >= self.want or self.err is not None or self.lost is not None:
                self.cv.notify()

    def _on_prev(self, m: Optional[Msg]) -> None:
        if m is None:
            return  # lost with the connection: asked again by restart
        stored = False
        if not m.status and m.data:
            try:
                pm = json.loads(bytes(m.data))
                stored = not pm.get("deleted") and pm.get("size") == self.size
            except ValueError:
                pass
        with self.cv:
            self.prev = stored
            self.cv.notify()

    def ask_prev(self) -> None:
        """Asks, without waiting, whether an object of the final name is stored."""
        try:
            self.conn.publish("$JS.API.DIRECT.GET." + self.store.stream,
                              json.dumps({"last_by_subj": self.store.meta_subject(self.final or "")}).encode(),
                              reply=self.prev_reply)
        except DisconnectedError:
            pass  # asked again once connected (restart)

    def wait_prev(self) -> bool:
        """Whether an object of the final name and this size is stored (the
        answer to ask_prev, waited for)."""
        deadline = time.monotonic() + self.store.timeout
        with self.cv:
            while self.prev is None:
                if self.lost is not None:
                    raise _Restart(self.lost)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Restart(TimeoutError("writing %s: no answer on whether it is stored within %.1fs"
                                                % (self.final, self.store.timeout)))
                self.cv.wait(left)
            return self.prev

    def wait_acks(self, upto: int, or_stored: bool = True) -> None:
        """Waits for upto acknowledgements, or (or_stored) for the news that
        the content is stored already. Raises a final refusal as it is, and
        _Restart when they were lost, are late or were refused for now."""
        deadline = time.monotonic() + self.store.timeout
        with self.cv:
            self.want = upto
            while self.acked < upto and self.err is None and self.lost is None and not (or_stored and self.prev):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Restart(TimeoutError("writing %s: no acknowledgement within %.1fs" % (
                        self.final or self.nuid, self.store.timeout)))
                self.cv.wait(left)
            if self.err is not None:
                raise self.err
            if self.lost is not None:
                raise _Restart(self.lost)

    def chunks(self, mv: memoryview, chunks: int, chunk_size: int, window: int,
               name: Union[str, Callable[[bytes], Optional[str]]], digest: List[bytes]) -> bool:
        """Publishes every chunk and waits for their acknowledgements; True
        when the content turned out to be stored already (the chunks
        written are then purged)."""
        subj = self.store.chunk_subject(self.nuid)
        for i in range(chunks):
            if i - self.acked >= window:
                # The window is full: wait until half of it is acknowledged.
                self.wait_acks(i - window // 2)
            if self.final is None and digest:
                self.final = name(digest[0])  # type: ignore[operator]
                if self.final is None:
                    self._stop(i)
                    return True
                self.ask_prev()
            if self.prev:
                self._stop(i)
                return True
            if self.lost is not None:
                raise _Restart(self.lost)
            if self.conn.status != "connected":
                # Kept by the connection, it would be sent on the new one
                # under a subject this write is about to give up.
                raise _Restart(self.conn.disconnected_error("writing %s" % (self.final or self.nuid)))
            try:
                self.conn.publish(subj, mv[i * chunk_size : (i + 1) * chunk_size], reply="%s.%d" % (self.reply, i))
            except DisconnectedError as e:
                raise _Restart(e) from None
        self.wait_acks(chunks)
        return False

    def _stop(self, sent: int) -> None:
        """Stops a write whose content is stored already: every chunk sent is
        stored before the purge."""
        try:
            self.wait_acks(sent, or_stored=False)
        except _Restart:
            pass  # purged all the same, and again at the end
        self.purge_all()

    def restart(self, r: _Restart, retries: int) -> None:
        """Starts the write over on a new chunk subject once connected (see
        ObjectStore.put), or raises when it may not."""
        cause = r.cause
        if self.conn.closed:
            raise self.conn._closed or cause  # type: ignore[misc]
        if self.restarts >= retries:
            if isinstance(cause, JetStreamError):
                raise cause
            raise type(cause)("writing %s: %s (gave up after %d restarts)" % (self.final or self.nuid, cause, retries))
        self.restarts += 1
        self.store.restarts += 1
        time.sleep(_backoff(self.restarts))
        self.conn.wait_connected(self.store.timeout)
        self.abandoned.append(self.nuid)
        self._purge(self.nuid)
        self.nuid = secrets.token_hex(16)
        self._arm()
        with self.cv:
            asked = self.prev is None and self.final is not None
        if asked:
            self.ask_prev()

    def _purge(self, nuid: str) -> None:
        try:
            self.store.purge(nuid)
        except FabricError:
            pass  # the bucket's TTL removes what is left

    def drop_abandoned(self) -> None:
        """Purges the subjects given up again: chunks kept by the connection
        while it was down may have been stored after the first purge."""
        for nuid in self.abandoned:
            self._purge(nuid)

    def purge_all(self) -> None:
        """Purges every chunk subject this write used."""
        for nuid in self.abandoned + [self.nuid]:
            self._purge(nuid)

    def close(self) -> None:
        self.conn.drop_reply(self.token)
        self.conn.drop_reply(self.prev_token)


class ObjectStore:
    """One object bucket (FABRIC_XFER by default) on a connection.
    restarts counts the writes (and metas) started over after a lost
    connection, a late acknowledgement or a refusal for now (see put)."""

    def __init__(self, conn: Connection, bucket: str, timeout: float = 30.0):
        self.conn = conn
        self.bucket = bucket
        self.stream = "OBJ_" + bucket
        self.timeout = timeout
        self.restarts = 0

    def meta_subject(self, name: str) -> str:
        return "$O.%s.M.%s" % (self.bucket, base64.urlsafe_b64encode(name.encode()).decode())

    def chunk_subject(self, nuid: str) -> str:
        return "$O.%s.C.%s" % (self.bucket, nuid)

    # -- meta ----------------------------------------------------------------

    def info(self, name: str) -> Optional[dict]:
        """The object's meta (deleted ones included), or None."""
        m = self.conn.direct_get(self.stream, {"last_by_subj": self.meta_subject(name)})
        if m is None:
            return None
        return json.loads(bytes(m.data))

    def resolve(self, name: str, meta: Optional[dict] = None) -> dict:
        """The meta of name, a link followed; ObjectStoreError when it is missing or deleted."""
        meta = meta if meta is not None else self.info(name)
        if meta is None or meta.get("deleted"):
            raise ObjectStoreError("object %r not found in bucket %s" % (name, self.bucket))
        link = (meta.get("options") or {}).get("link")
        if link:
            target = self.info(link.get("name", ""))
            if target is None or target.get("deleted"):
                raise ObjectStoreError("object %r links to %r, which is missing" % (name, link.get("name")))
            return target
        return meta

    def wait(self, name: str, timeout: Optional[float] = None) -> dict:
        """Waits for a meta of name that is not a delete marker (or is one
        carrying a Jetfabric-Error, which raises) and returns it, resolved."""
        timeout = self.timeout if timeout is None else timeout
        sub = self.conn.subscribe(self.meta_subject(name))
        try:
            deadline = time.monotonic() + timeout
            meta = self._info_or_none(name)
            recheck = 0.02
            while True:
                if meta is not None:
                    if not meta.get("deleted"):
                        return self.resolve(name, meta)
                    err = ((meta.get("headers") or {}).get("Jetfabric-Error") or [""])[0]
                    if err:
                        raise ObjectStoreError("object %r was not written: %s" % (name, err))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("object %r did not appear in bucket %s within %.1fs" % (name, self.bucket, timeout))
                try:
                    meta = json.loads(bytes(sub.next(min(left, recheck)).data))
                except TimeoutError:
                    # A meta stored between the first look and the
                    # subscription taking effect is in neither place:
                    # while nothing arrives, look again, at doubling
                    # intervals (as the Go worker's awaitKey does).
                    meta = self._info_or_none(name)
                    recheck = min(2 * recheck, 1.0)
        finally:
            sub.unsubscribe()

    def _info_or_none(self, name: str) -> Optional[dict]:
        """info(name), or None while the connection is being made again (the
        caller looks again)."""
        try:
            return self.info(name)
        except DisconnectedError:
            return None

    # -- reading -------------------------------------------------------------

    def get(self, name: str, meta: Optional[dict] = None) -> Union[bytearray, memoryview]:
        """The object's bytes, checked against the size, chunk count and CRC-32 (or digest) of its meta."""
        meta = self.resolve(name, meta)
        size = int(meta.get("size", 0))
        out = buffer(size)
        self._read_chunks(meta, out)
        return out

    def _read_chunks(self, meta: dict, out: Union[bytearray, memoryview]) -> None:
        size, chunks = int(meta.get("size", 0)), int(meta.get("chunks", 0))
        subj = self.chunk_subject(meta.get("nuid", ""))
        h = _check_for(meta)
        view = memoryview(out)
        off, got, seq = 0, 0, 0
        chunk = int((meta.get("options") or {}).get("max_chunk_size") or CHUNK_SIZE)
        deadline = time.monotonic() + self.timeout
        while got < chunks:
            batch = max(1, min(chunks - got, READ_AHEAD // max(chunk, 1)))
            q: List[Optional[Msg]] = []
            done = threading.Event()

            def on(m: Optional[Msg], q=q, done=done) -> None:
                if m is None or (m.status and not m.data):
                    q.append(m)
                    done.set()
                    return
                q.append(m)

            if self.conn.status != "connected":
                self.conn.wait_connected(max(0.0, deadline - time.monotonic()))
            reply, token = self.conn.new_reply(on)
            try:
                self.conn.publish("$JS.API.DIRECT.GET." + self.stream,
                                  json.dumps({"seq": seq, "next_by_subj": subj, "batch": batch}).encode(), reply=reply)
                if not done.wait(self.timeout):
                    if self.conn.status != "connected":
                        raise self.conn.disconnected_error("reading chunks of %s" % meta.get("name"))
                    raise TimeoutError("reading chunks of %s timed out" % meta.get("name"))
            finally:
                self.conn.drop_reply(token)
            n_before = got
            for m in q:
                if m is None:
                    break  # the connection was lost: ask again from here once it is back
                if m.status:
                    if m.status in ("204", "404") and got > n_before:
                        break
                    raise ObjectStoreError("reading chunks of %r: status %s %s" % (meta.get("name"), m.status,
                                                                                  m.headers.get("Description", "")))
                d = m.data
                n = len(d)
                if off + n > size:
                    raise ObjectStoreError("object %r has more bytes than its meta's %d" % (meta.get("name"), size))
                view[off : off + n] = d
                h.update(d)
                off += n
                got += 1
                seq = int(m.headers.get("Nats-Sequence", "0")) + 1
            if None in q:
                if self.conn.closed:
                    raise self.conn._closed or ConnectionClosedError("connection lost while reading %s" % meta.get("name"))
                self.conn.wait_connected(max(0.0, deadline - time.monotonic()))
        if off != size or got != chunks:
            raise ObjectStoreError("object %r: read %d bytes in %d chunks, meta says %d in %d" % (meta.get("name"), off, got, size, chunks))
        if not _checked(meta, h):
            what = "CRC-32" if crc_of(meta) is not None else "digest"
            raise ObjectStoreError("object %r does not match its %s" % (meta.get("name"), what))

    def follow(self, name: str, nuid: str, timeout: Optional[float] = None,
               size: Optional[int] = None) -> Tuple[Union[bytearray, memoryview], dict]:
        """Reads object name while its writer writes it on chunk subject nuid
        (docs/PROTOCOL.md §5): the chunks are taken live from a plain
        subscription, each placed by the index its writer puts last in its
        reply subject; those published before the subscription are read from
        the stream; the meta, written last, ends the read and is checked.
        Anything out of order is read again from the stream.

        With size (the object's size, when the caller knows it), each live
        chunk is read from the socket straight into its place in the result,
        and hashed there by another thread while the next ones arrive."""
        if size is None:
            return self._follow_unsized(name, nuid, timeout)
        f = _Placer(self, self.chunk_subject(nuid), size)
        sub = self.conn.subscribe(self.chunk_subject(nuid), cb=f.taken, sink=f.sink)
        try:
            # Made after subscribing, so that no chunk is missed meanwhile.
            out = buffer(size)
            f.place(memoryview(out))
            meta = self.wait(name, timeout)
        finally:
            self.conn.unsubscribe(sub)
            crc = f.finish()
        chunks = int(meta.get("chunks", 0))
        if (meta.get("nuid") != nuid or crc is None or f.next != chunks or int(meta.get("size", -1)) != size
                or not _checked_live(meta, crc, out)):
            return self.get(name, meta), meta
        return out, meta

    def _follow_unsized(self, name: str, nuid: str, timeout: Optional[float]) -> Tuple[Union[bytearray, memoryview], dict]:
        live: Dict[int, bytes] = {}
        lock = threading.Lock()
        odd = [False]

        def on_chunk(m: Optional[Msg]) -> None:
            if m is None:
                return
            idx = m.reply.rsplit(".", 1)[-1]
            with lock:
                if not idx.isdigit() or int(idx) in live:
                    odd[0] = True
                    return
                live[int(idx)] = m.data

        sub = self.conn.subscribe(self.chunk_subject(nuid), cb=on_chunk)
        try:
            meta = self.wait(name, timeout)
        finally:
            self.conn.unsubscribe(sub)
        size, chunks = int(meta.get("size", 0)), int(meta.get("chunks", 0))
        with lock:
            have = dict(live)
        if meta.get("nuid") != nuid or odd[0] or not have:
            return self.get(name, meta), meta
        first = min(have)
        if sorted(have) != list(range(first, chunks)):
            return self.get(name, meta), meta
        out = bytearray(size)
        view = memoryview(out)
        h = _Crc()
        off, seq = 0, 0
        if first > 0:  # the chunks stored before the subscription, from the stream
            got = 0
            for m in self._batch(self.chunk_subject(nuid), 0, first):
                pending = int(m.headers.get("Nats-Num-Pending", "-1"))
                if pending != chunks - 1 - got:
                    return self.get(name, meta), meta
                d = m.data
                view[off : off + len(d)] = d
                h.update(d)
                off += len(d)
                got += 1
            if got != first:
                return self.get(name, meta), meta
        for i in range(first, chunks):
            d = have[i]
            if off + len(d) > size:
                return self.get(name, meta), meta
            view[off : off + len(d)] = d
            h.update(d)
            off += len(d)
        if off != size or not _checked_live(meta, h.value, out):
            return self.get(name, meta), meta
        return out, meta

    def _batch(self, subj: str, seq: int, n: int) -> List[Msg]:
        """Up to n messages of subj from stream sequence seq, by one batched direct get."""
        q: List[Optional[Msg]] = []
        done = threading.Event()

        def on(m: Optional[Msg]) -> None:
            q.append(m)
            if m is None or (m.status and not m.data):
                done.set()

        reply, token = self.conn.new_reply(on)
        try:
            self.conn.publish("$JS.API.DIRECT.GET." + self.stream,
                              json.dumps({"seq": seq, "next_by_subj": subj, "batch": n}).encode(), reply=reply)
            if not done.wait(self.timeout):
                raise TimeoutError("direct get of %s timed out" % subj)
        finally:
            self.conn.drop_reply(token)
        out = []
        for m in q:
            if m is None:
                raise ConnectionClosedError("connection lost while reading %s" % subj)
            if m.status:
                break
            out.append(m)
        return out

    # -- writing -------------------------------------------------------------

    def put(self, name: Union[str, Callable[[bytes], Optional[str]]], data: Union[bytes, bytearray, memoryview],
            nuid: str = "", sha256: Optional[bytes] = None, headers: Optional[Dict[str, List[str]]] = None,
            chunk_size: int = CHUNK_SIZE, window: int = WINDOW, retries: int = RETRIES) -> Optional[dict]:
        """Writes data as an object on chunk subject nuid (new when empty),
        up to window chunks unacknowledged, then the meta; returns the meta.
        A failed write purges its chunks.

        name may be a function of the data's SHA-256 instead: the chunks are
        then written at once while another thread hashes, and name(digest)
        is called (on this thread) as soon as the digest is known, to name
        the object. The write then asks, without waiting, whether an object
        of that name and size is stored (not deleted); if it is, or if name
        returns None, the write stops, its chunks are purged, and put
        returns None: the same content is stored already.

        A write whose acknowledgements are lost (with the connection: the
        broker restarting, a cut), late (no acknowledgement within the
        store's timeout) or refused for now (no responders, too many
        requests, JetStream not available) starts over, as the Go client's
        objectstore does: once connected again, on a new chunk subject (what
        the old one holds is unknown: it is purged, then again at the end),
        from the first chunk, at most retries times; the meta is published
        again the same way. The result is the object a write without the
        loss makes. restarts counts the writes started over. A refusal that
        is final (a full bucket, too large) raises at once."""
        if not 0 <= retries <= 1000:
            raise ValueError("retries %r: want 0 to 1000" % (retries,))
        mv = memoryview(data).cast("B")
        size = mv.nbytes
        chunk_size = max(1, min(chunk_size, self.conn.max_payload - 1024))
        chunks = (size + chunk_size - 1) // chunk_size
        digest: List[bytes] = [sha256] if sha256 is not None else []
        crc: List[int] = []
        hasher: Optional[threading.Thread] = None
        if not digest:
            # hashlib and zlib let go of the GIL while they hash a large
            # buffer. The CRC-32 goes in the meta's headers for readers
            # (CRC_HEADER); a caller that gives the digest gets none.
            def hash_all() -> None:
                digest.append(hashlib.sha256(mv).digest())  # first: it may name the object
                crc.append(zlib.crc32(mv))
            hasher = threading.Thread(target=hash_all, name="jetfabric-sha256", daemon=True)
            hasher.start()
        w = _Write(self, nuid or secrets.token_hex(16), name if isinstance(name, str) else None, size)
        try:
            while True:
                try:
                    stored_before = w.chunks(mv, chunks, chunk_size, window, name, digest)
                    if stored_before:
                        return None
                    if hasher is not None:
                        hasher.join()
                    if w.final is None:
                        w.final = name(digest[0])  # type: ignore[operator]
                        if w.final is None:
                            w.purge_all()
                            return None
                        w.ask_prev()
                    if not isinstance(name, str) and w.wait_prev():
                        w.purge_all()
                        return None
                    break
                except _Restart as r:
                    w.restart(r, retries)
            meta: dict = {"name": w.final, "bucket": self.bucket, "nuid": w.nuid, "size": size, "mtime": _now(),
                          "chunks": chunks, "digest": digest_string(digest[0]), "options": {"max_chunk_size": chunk_size}}
            if headers or crc:
                meta["headers"] = dict(headers or {})
                if crc:
                    meta["headers"][CRC_HEADER] = ["%08x" % crc[0]]
            self._publish_meta(meta, retries)
            w.drop_abandoned()
            return meta
        except BaseException:
            w.purge_all()
            raise
        finally:
            w.close()
            if hasher is not None:
                hasher.join()

    def _publish_meta(self, meta: dict, retries: int = RETRIES) -> None:
        """Publishes meta with the rollup header and waits for the stream's
        acknowledgement; one lost with the connection, late, or refused for
        now is published again (once connected), at most retries times: a
        rollup stores the same meta once more, replacing it."""
        subject = self.meta_subject(meta["name"])
        body = json.dumps(meta).encode()
        deadline = time.monotonic() + self.timeout
        for attempt in range(retries + 1):
            try:
                if self.conn.status != "connected":
                    self.conn.wait_connected(max(0.0, deadline - time.monotonic()))
                parse_ack(self.conn.request(subject, body, headers={"Nats-Rollup": "sub"}), subject)
                return
            except (DisconnectedError, TimeoutError, NoRespondersError) as e:
                err: Exception = e
            except JetStreamError as e:
                if not _retryable(e):
                    raise
                err = e
            if attempt == retries or self.conn.closed:
                raise err
            self.restarts += 1
            time.sleep(_backoff(attempt + 1))
            deadline = time.monotonic() + self.timeout

    def abort(self, name: str, nuid: str, reason: str) -> None:
        """Marks name deleted with reason in its Jetfabric-Error header, for
        a reader following a write that will not finish."""
        self._publish_meta({"name": name, "bucket": self.bucket, "nuid": nuid, "size": 0, "mtime": _now(), "chunks": 0,
                            "deleted": True, "headers": {"Jetfabric-Error": [reason]}})

    def link(self, name: str, target: str) -> dict:
        """Writes name as a link to object target of this bucket."""
        meta = {"name": name, "bucket": self.bucket, "nuid": secrets.token_hex(16), "size": 0, "mtime": _now(),
                "chunks": 0, "options": {"link": {"bucket": self.bucket, "name": target}}}
        self._publish_meta(meta)
        return meta

    def purge(self, nuid: str, wait: bool = True) -> None:
        """Drops every chunk on the subject of nuid."""
        req = json.dumps({"filter": self.chunk_subject(nuid)}).encode()
        try:
            if wait:
                self.conn.js_api("STREAM.PURGE." + self.stream, {"filter": self.chunk_subject(nuid)})
            else:
                self.conn.publish("$JS.API.STREAM.PURGE." + self.stream, req, reply=self.conn.new_reply()[0])
        except ConnectionClosedError:
            pass

    def delete(self, name: str, meta: Optional[dict] = None, wait: bool = True) -> None:
        """Marks name deleted (a meta with deleted and the rollup header) and purges its chunks."""
        meta = meta if meta is not None else self.info(name)
        if meta is None or meta.get("deleted"):
            return
        dead = {"name": name, "bucket": self.bucket, "nuid": meta.get("nuid", ""), "size": 0, "mtime": _now(),
                "chunks": 0, "deleted": True}
        body = json.dumps(dead).encode()
        if wait:
            self._publish_meta(dead)
        else:
            self.conn.publish(self.meta_subject(name), body, reply=self.conn.new_reply()[0], headers={"Nats-Rollup": "sub"})
        if meta.get("nuid") and not (meta.get("options") or {}).get("link"):
            self.purge(meta["nuid"], wait=wait)
