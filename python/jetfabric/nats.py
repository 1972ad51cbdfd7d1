"""A NATS client over one TCP socket, in the standard library.

It speaks the NATS client protocol (INFO, CONNECT, PUB, HPUB, SUB, UNSUB,
MSG, HMSG, PING, PONG, +OK, -ERR) with headers, plus what jetfabric needs of
JetStream: publishes with an acknowledgement, API requests, direct gets.

One reader thread owns the socket's input: it parses messages and hands
each to its subscription, either by calling the subscription's callback
(on the reader thread: keep callbacks short) or by queueing it for
Subscription.next. Writes go out under a lock, from any thread.

TLS: when the server's INFO says tls_required (or the caller asks for TLS),
the connection does the TLS handshake right after INFO and everything
after it, CONNECT included, is encrypted (or, with tls_handshake_first,
before INFO). The TLS session runs over memory BIOs (_TLSSocket), so the
reader thread and the writers never use OpenSSL's object at once.
"""

from __future__ import annotations

import _thread
import collections
import json
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Callable, Dict, Optional, Tuple, Union

from .errors import (
    ConnectionClosedError,
    FabricError,
    JetStreamError,
    MaxPayloadError,
    NoRespondersError,
    TimeoutError,
    TLSError,
)

__all__ = ["Msg", "Subscription", "Connection"]

Headers = Dict[str, str]
Data = Union[bytes, bytearray, memoryview]

_CRLF = b"\r\n"


class Msg:
    """A message received: subject, reply, headers (a dict, possibly empty),
    status (the header line's status code, e.g. "404", or "") and data."""

    __slots__ = ("subject", "reply", "headers", "status", "data")

    def __init__(self, subject: str, reply: str, headers: Headers, status: str, data: bytes):
        self.subject = subject
        self.reply = reply
        self.headers = headers
        self.status = status
        self.data = data

    def __repr__(self) -> str:
        return "Msg(%r, reply=%r, status=%r, %d bytes)" % (self.subject, self.reply, self.status, len(self.data))


def parse_headers(raw: bytes) -> Tuple[Headers, str]:
    """Splits a NATS/1.0 header block into a dict and the status code."""
    text = raw.decode("utf-8", "replace")
    lines = text.split("\r\n")
    first = lines[0]
    if not first.startswith("NATS/1.0"):
        raise FabricError("malformed header block %r" % first[:40])
    status = first[8:].strip().split(" ", 1)[0] if len(first) > 8 else ""
    headers: Headers = {}
    for ln in lines[1:]:
        k, sep, v = ln.partition(":")
        if sep:
            headers[k.strip()] = v.strip()
    return headers, status


def encode_headers(headers: Headers) -> bytes:
    return ("NATS/1.0\r\n" + "".join("%s: %s\r\n" % kv for kv in headers.items()) + "\r\n").encode()


class Subscription:
    """A subscription. Without a callback, messages queue for next()."""

    def __init__(self, conn: "Connection", sid: int, subject: str, cb: Optional[Callable[[Msg], None]],
                 sink: Optional[Callable[[str, str, int], Optional[memoryview]]] = None):
        self.conn = conn
        self.sid = sid
        self.subject = subject
        self.cb = cb
        self.sink = sink
        self._q: collections.deque = collections.deque()
        self._cv = threading.Condition(threading.Lock())

    def _deliver(self, m: Msg) -> None:
        if self.cb is not None:
            self.cb(m)
            return
        with self._cv:
            self._q.append(m)
            self._cv.notify()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def next(self, timeout: float) -> Msg:
        """The next message, waiting up to timeout seconds."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self._q:
                if self.conn._closed is not None:
                    raise self.conn._closed
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no message on %s within %.1fs" % (self.subject, timeout))
                self._cv.wait(left)
            return self._q.popleft()

    def unsubscribe(self) -> None:
        self.conn.unsubscribe(self)


class Signal:
    """A one-shot event on one bare lock: what threading.Event does for a
    single waiter, at a fraction of its cost (no Condition, no waiter list),
    on the path of every round trip."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:  # released by another setter
                pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self._set:
            return True
        if timeout is None:
            self._lock.acquire()
            return True
        if timeout > 0 and self._lock.acquire(True, timeout):
            return True
        return self._set


class _Waiter:
    __slots__ = ("ev", "msg")

    def __init__(self) -> None:
        self.ev = Signal()
        self.msg: Optional[Msg] = None


class _TLSSocket:
    """A TLS session over a connected socket, with the few socket methods
    Connection uses (sendall, recv, recv_into, settimeout, shutdown,
    close).

    OpenSSL's objects must not be used by two threads at once, and the
    reader thread receives while other threads send: so the session runs
    over memory BIOs, the SSL object is used only under a lock held for the
    in-memory work alone, and encrypted bytes are taken from the outgoing
    BIO and sent under a second lock, in the order they were made."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, server_hostname: Optional[str]):
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._lock = threading.Lock()   # the SSL object and the BIOs
        self._wlock = threading.Lock()  # the socket's output
        while True:
            try:
                with self._lock:
                    self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not self._fill():
                    raise ConnectionClosedError("the server closed the connection during the TLS handshake") from None
        self._flush()

    def version(self) -> Optional[str]:
        return self._obj.version()

    def getpeercert(self) -> Optional[dict]:
        return self._obj.getpeercert()

    def _fill(self) -> bool:
        data = self._sock.recv(1 << 18)
        if not data:
            return False
        with self._lock:
            self._in.write(data)
        return True

    def _flush(self) -> None:
        with self._wlock:
            with self._lock:
                data = self._out.read()
            if data:
                self._sock.sendall(data)

    def sendall(self, data: Data) -> None:
        mv = memoryview(data).cast("B")
        with self._wlock:
            # Encrypt and send a piece at a time, so a large message is on
            # the wire while the rest is still being encrypted.
            for i in range(0, max(len(mv), 1), 1 << 18):
                piece = mv[i : i + (1 << 18)]
                with self._lock:
                    done = 0
                    while done < len(piece):
                        done += self._obj.write(piece[done:])
                    out = self._out.read()
                self._sock.sendall(out)

    def recv_into(self, buf: Union[bytearray, memoryview], nbytes: int = 0) -> int:
        n = nbytes or len(buf)
        while True:
            with self._lock:
                try:
                    got = self._obj.read(n, buf)
                except ssl.SSLWantReadError:
                    got = -1
                except ssl.SSLZeroReturnError:
                    got = 0
                pending = self._out.pending
            if pending and self._wlock.acquire(blocking=False):
                # The session answered something (a key update). A writer
                # holding the lock may be blocked on a full socket that
                # only this thread's reading drains: then leave the bytes
                # for the next writer, which sends whatever is pending.
                try:
                    with self._lock:
                        out = self._out.read()
                    self._sock.sendall(out)
                finally:
                    self._wlock.release()
            if got >= 0:
                return got
            if not self._fill():
                return 0

    def recv(self, n: int) -> bytes:
        buf = bytearray(n)
        got = self.recv_into(buf)
        del buf[got:]
        return bytes(buf)

    def settimeout(self, t: Optional[float]) -> None:
        self._sock.settimeout(t)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()


# OpenSSL's verify results (X509_V_ERR_*) that name a certificate's problem.
_VERIFY_UNKNOWN_CA = {2, 18, 19, 20, 21, 27}
_VERIFY_EXPIRED = {9, 10}
_VERIFY_HOST = {62, 64}


def _tls_error(url: str, e: Exception, have_cert: bool) -> TLSError:
    """A TLS failure as a TLSError that says what it most likely means."""
    if isinstance(e, ssl.SSLCertVerificationError):
        code = getattr(e, "verify_code", 0)
        if code in _VERIFY_UNKNOWN_CA:
            return TLSError("the broker at %s requires TLS and its certificate is signed by an authority this client does "
                            "not trust: give the CA certificate that signed it (tls_ca=...; jetfabric certs writes ca.pem): %s"
                            % (url, e.verify_message))
        if code in _VERIFY_HOST:
            return TLSError("the TLS certificate of the broker at %s is not valid for the host dialled: use a name the "
                            "certificate holds, or make one with this host (jetfabric certs --hosts): %s" % (url, e.verify_message))
        if code in _VERIFY_EXPIRED:
            return TLSError("the TLS certificate of the broker at %s has expired or is not valid yet: renew it, or check "
                            "the clocks: %s" % (url, e.verify_message))
        return TLSError("the TLS certificate of the broker at %s did not verify: %s" % (url, e.verify_message))
    text = str(e)
    if any(r in text.upper() for r in ("CERTIFICATE_REQUIRED", "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN")):
        return TLSError("the broker at %s requires a client certificate signed by an authority it trusts%s: give one "
                        "(tls_cert=..., tls_key=...; jetfabric certs writes client.pem and client-key.pem): %s"
                        % (url, "" if have_cert else " and none was given", text))
    return TLSError("TLS with the broker at %s failed: %s" % (url, text))


class Connection:
    """A connection to a NATS server.

    url is nats://[user:password@]host:port (or host:port); token, user and
    password may also be given, or creds, the path of a creds file (a user
    JWT and its nkey seed: the connection signs the server's nonce). The server must support headers (NATS 2.2
    or later). max_payload is the server's limit on a message, headers
    included; publish raises MaxPayloadError rather than send a larger one
    (the server would close the connection).

    TLS: tls_ca is a PEM file of the authorities to trust (default: the
    system's), tls_cert and tls_key a client certificate for a broker that
    verifies its clients; ssl_context replaces all three. tls=None (the
    default) uses TLS when the server requires it, or when the URL is
    tls:// or a TLS argument is given; tls=True requires it; tls=False
    refuses it (a server that requires TLS is then an error).
    tls_handshake_first starts TLS before the server's INFO, for servers
    configured with handshake_first.
    """

    def __init__(self, url: str = "nats://127.0.0.1:4222", name: str = "jetfabric-python", timeout: float = 10.0,
                 user: str = "", password: str = "", token: str = "", inbox_prefix: str = "_INBOX_fabric",
                 tls: Optional[bool] = None, tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 ssl_context: Optional[ssl.SSLContext] = None, tls_handshake_first: bool = False,
                 creds: str = ""):
        u = urllib.parse.urlsplit(url if "://" in url else "nats://" + url)
        if u.scheme not in ("nats", "tcp", "tls"):
            raise FabricError("unsupported URL scheme %r (want nats://host:port, or tls://host:port)" % u.scheme)
        host, port = u.hostname or "127.0.0.1", u.port or 4222
        asked = u.scheme == "tls" or bool(tls_ca or tls_cert or tls_key) or ssl_context is not None or tls_handshake_first
        if tls is False and asked:
            raise TLSError("tls=False contradicts the TLS arguments or the tls:// URL given")
        want_tls = bool(tls) or asked
        ctx: Optional[ssl.SSLContext] = None
        if tls is not False:
            ctx = ssl_context or self._tls_context(tls_ca, tls_cert, tls_key)
        self.url = url
        self.timeout = timeout
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise ConnectionClosedError("connect %s:%d: %s" % (host, port, e)) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        except OSError:
            pass
        self._wlock = threading.Lock()
        self._slock = threading.Lock()
        self._subs: Dict[int, Subscription] = {}
        self._next_sid = 1
        self._pongs: collections.deque = collections.deque()
        self._closed: Optional[Exception] = None
        self._buf = bytearray()
        self._pos = 0
        self.last_error = ""

        self.tls_version: Optional[str] = None
        if tls_handshake_first:
            self._start_tls(url, ctx, host, bool(tls_cert))  # type: ignore[arg-type]
        try:
            line = self._read_line_blocking()
        except socket.timeout:
            self._sock.close()
            raise TimeoutError("no INFO from %s within %.1fs (a server configured with TLS handshake_first says nothing "
                               "before the client starts TLS: tls_handshake_first=True)" % (url, timeout)) from None
        except OSError as e:
            self._sock.close()
            raise ConnectionClosedError("connect %s: %s" % (url, e)) from None
        if not line.startswith(b"INFO "):
            self._sock.close()
            raise ConnectionClosedError("expected INFO from %s, got %r" % (url, bytes(line[:80])))
        self.info = json.loads(bytes(line[5:]))
        if not tls_handshake_first:
            required, available = self.info.get("tls_required", False), self.info.get("tls_available", False)
            if required and tls is False:
                self._sock.close()
                raise TLSError("the broker at %s requires TLS and tls=False refused it: connect with TLS (tls_ca=... for "
                               "the CA that signed its certificate)" % url)
            if want_tls and not required and not available:
                self._sock.close()
                raise TLSError("TLS was asked for but the broker at %s does not offer it: connect to nats:// without TLS "
                               "arguments, or start the broker with --tls-cert and --tls-key" % url)
            if required or want_tls:
                if self._pos != len(self._buf):
                    raise ConnectionClosedError("the server sent data after INFO before the TLS handshake")
                self._start_tls(url, ctx, host, bool(tls_cert))  # type: ignore[arg-type]
                if self.info.get("tls_verify") and not tls_cert and ssl_context is None:
                    # The server would refuse the connection after the handshake.
                    self._sock.close()
                    raise TLSError("the broker at %s verifies client certificates and none was given: give one (tls_cert=..., "
                                   "tls_key=...; jetfabric certs writes client.pem and client-key.pem)" % url)
        if not self.info.get("headers"):
            raise FabricError("the server does not support message headers (NATS 2.2 or later needed)")
        self.max_payload: int = int(self.info.get("max_payload", 1 << 20))
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
                   "name": name, "lang": "python", "version": "1", "tls_required": self.tls_version is not None}
        user = user or urllib.parse.unquote(u.username or "")
        password = password or urllib.parse.unquote(u.password or "")
        if user and not password and not token:
            token, user = user, ""
        if user:
            connect["user"], connect["pass"] = user, password
        if token:
            connect["auth_token"] = token
        if creds:
            from . import nkeys
            try:
                jwt, seed = nkeys.read_creds(creds)
                connect["jwt"], connect["sig"] = jwt, nkeys.sign_nonce(seed, self.info.get("nonce", ""))
            except (OSError, ValueError) as e:
                self._sock.close()
                raise FabricError("creds %s: %s" % (creds, e)) from None
        try:
            self._sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            while True:
                line = self._read_line_blocking()
                if line == b"PONG":
                    break
                if line.startswith(b"-ERR"):
                    why = bytes(line[5:]).decode("utf-8", "replace")
                    if creds and "authorization" in why.lower():
                        raise ConnectionClosedError("server refused the credentials in %s (not signed by this fabric's account, expired or revoked): %s"
                                                    % (creds, why))
                    raise ConnectionClosedError("server refused CONNECT: %s" % why)
                if line == b"PING":
                    self._sock.sendall(b"PONG\r\n")
        except (ssl.SSLError, ConnectionClosedError, OSError) as e:
            if self.tls_version is None:
                raise
            # A broker that refuses the client's certificate says so once
            # the handshake is over (TLS 1.3) with an alert, or closes the
            # connection.
            self._sock.close()
            if isinstance(e, ssl.SSLError):
                raise _tls_error(url, e, bool(tls_cert)) from None
            if self.info.get("tls_verify") and (not isinstance(e, FabricError) or "closed the connection" in str(e)):
                raise _tls_error(url, ssl.SSLError("the broker closed the connection after the handshake (%s; CERTIFICATE_UNKNOWN)" % e),
                                 bool(tls_cert)) from None
            if not isinstance(e, FabricError):
                raise ConnectionClosedError("connect %s: %s" % (url, e)) from None
            raise
        self._sock.settimeout(None)

        self._inbox_prefix = inbox_prefix
        self._mux_prefix = "%s.%s." % (inbox_prefix, secrets.token_hex(8))
        self._mux_lock = threading.Lock()
        self._mux: Dict[str, Union[_Waiter, Callable[[Msg], None]]] = {}
        self._mux_n = 0
        self._reader = threading.Thread(target=self._read_loop, name="jetfabric-nats-reader", daemon=True)
        self._reader.start()
        self._mux_sub = self.subscribe(self._mux_prefix + ">", cb=self._mux_deliver)

    @staticmethod
    def _tls_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
        if bool(cert) != bool(key):
            raise TLSError("a TLS client certificate needs both tls_cert and tls_key (got %r and %r)" % (cert, key))
        try:
            ctx = ssl.create_default_context(cafile=ca or None)
        except (OSError, ssl.SSLError) as e:
            raise TLSError("tls_ca %s: %s" % (ca, e)) from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert:
            try:
                ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as e:
                raise TLSError("TLS client certificate %s with key %s: %s" % (cert, key, e)) from None
        return ctx

    def _start_tls(self, url: str, ctx: ssl.SSLContext, host: str, have_cert: bool) -> None:
        try:
            self._sock = _TLSSocket(self._sock, ctx, host)  # type: ignore[assignment]
        except ssl.SSLError as e:
            self._sock.close()
            raise _tls_error(url, e, have_cert) from None
        except OSError as e:
            self._sock.close()
            raise ConnectionClosedError("TLS handshake with %s: %s" % (url, e)) from None
        self.tls_version = self._sock.version()  # type: ignore[attr-defined]

    # -- reading -----------------------------------------------------------

    def _read_line_blocking(self) -> bytearray:
        while True:
            i = self._buf.find(_CRLF, self._pos)
            if i >= 0:
                line = self._buf[self._pos : i]
                self._pos = i + 2
                return line
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionClosedError("the server closed the connection")
            self._buf += chunk

    def _read_loop(self) -> None:
        sock = self._sock
        buf = bytearray()
        pos = 0
        if self._pos < len(self._buf):
            buf += self._buf[self._pos :]
        self._buf = bytearray()
        rbuf = bytearray(1 << 20)
        rview = memoryview(rbuf)
        try:
            while True:
                # Parse what is buffered.
                while True:
                    i = buf.find(_CRLF, pos)
                    if i < 0:
                        break
                    c = buf[pos]
                    if c == 0x4D or c == 0x48:  # MSG, HMSG
                        parts = bytes(buf[pos:i]).split()
                        hmsg = c == 0x48
                        total = int(parts[-1])
                        hlen = int(parts[-2]) if hmsg else 0
                        nargs = len(parts)
                        reply = parts[3].decode() if (nargs == 6 if hmsg else nargs == 5) else ""
                        start = i + 2
                        have = len(buf) - start
                        sid = int(parts[2])
                        sub = self._subs.get(sid)
                        dest = None
                        if sub is not None and sub.sink is not None and not hmsg:
                            try:
                                dest = sub.sink(parts[1].decode(), reply, total)
                            except Exception as e:  # a sink's failure must not stop the reader
                                self.last_error = "sink on %s: %r" % (sub.subject, e)
                            if dest is not None and dest.nbytes != total:
                                dest = None
                        if dest is not None:
                            # The payload goes straight to where the subscriber wants it.
                            take = min(have, total)
                            if take:
                                with memoryview(buf) as m:
                                    dest[:take] = m[start : start + take]
                            got = take
                            while got < total:
                                n = sock.recv_into(dest[got:])
                                if n == 0:
                                    raise ConnectionClosedError("the server closed the connection")
                                got += n
                            if take == have:
                                # The rest of the buffer went into dest; the CRLF
                                # after the payload reads as an empty line.
                                buf = bytearray()
                                pos = 0
                            else:
                                pos = start + total
                            try:
                                sub._deliver(Msg(parts[1].decode(), reply, {}, "", dest))
                            except Exception as e:
                                self.last_error = "callback on %s: %r" % (sub.subject, e)
                            continue
                        if have >= total + 2:
                            with memoryview(buf) as m:
                                payload = bytes(m[start : start + total])
                            pos = start + total + 2
                        else:
                            # Read the rest of a large payload straight into its buffer.
                            big = bytearray(total + 2)
                            with memoryview(buf) as m:
                                big[:have] = m[start:]
                            mv = memoryview(big)
                            got = have
                            while got < total + 2:
                                n = sock.recv_into(mv[got:])
                                if n == 0:
                                    raise ConnectionClosedError("the server closed the connection")
                                got += n
                            del mv
                            del big[total:]
                            payload = big
                            buf = bytearray()
                            pos = 0
                        if hmsg:
                            headers, status = parse_headers(bytes(payload[:hlen]))
                            data = memoryview(payload)[hlen:] if type(payload) is bytearray else payload[hlen:]
                        else:
                            headers, status, data = {}, "", payload
                        if sub is not None:
                            try:
                                sub._deliver(Msg(parts[1].decode(), reply, headers, status, data))
                            except Exception as e:  # a callback's failure must not stop the reader
                                self.last_error = "callback on %s: %r" % (sub.subject, e)
                        continue
                    line = bytes(buf[pos:i])
                    pos = i + 2
                    if line == b"PING":
                        self._send(b"PONG\r\n")
                    elif line == b"PONG":
                        if self._pongs:
                            self._pongs.popleft().set()
                    elif line.startswith(b"-ERR"):
                        self.last_error = line[5:].decode("utf-8", "replace").strip().strip("'")
                    # +OK and INFO updates need nothing.
                if pos > 0:
                    del buf[:pos]
                    pos = 0
                n = sock.recv_into(rview)
                if n == 0:
                    raise ConnectionClosedError("the server closed the connection" +
                                                (" (%s)" % self.last_error if self.last_error else ""))
                buf += rview[:n]
        except Exception as e:
            if not isinstance(e, FabricError):
                e = ConnectionClosedError("connection lost: %s" % e)
            if self.last_error and self.last_error not in str(e):
                e = ConnectionClosedError("%s (%s)" % (e, self.last_error))
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        if self._closed is None:
            self._closed = e
        for ev in list(self._pongs):
            ev.set()
        for sub in list(self._subs.values()):
            sub._wake()
            if sub.cb is not None and sub is not getattr(self, "_mux_sub", None):
                try:
                    sub.cb(None)  # type: ignore[arg-type]
                except Exception:
                    pass
        with self._mux_lock:
            waiters = list(self._mux.values())
        for w in waiters:
            if isinstance(w, _Waiter):
                w.ev.set()
            else:
                try:
                    w(None)  # type: ignore[arg-type]
                except Exception:
                    pass

    # -- writing -----------------------------------------------------------

    def _send(self, data: Data) -> None:
        if self._closed is not None:
            raise self._closed
        with self._wlock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                self._fail(ConnectionClosedError("send: %s" % e))
                raise self._closed  # type: ignore[misc]

    def publish(self, subject: str, data: Data = b"", reply: str = "", headers: Optional[Headers] = None) -> None:
        """Publishes data (PUB, or HPUB with headers)."""
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        rep = (" " + reply) if reply else ""
        if headers:
            hdr = encode_headers(headers)
            size = len(hdr) + n
            self._check_size(subject, size)
            cmd = ("HPUB %s%s %d %d\r\n" % (subject, rep, len(hdr), size)).encode() + hdr
        else:
            self._check_size(subject, n)
            cmd = ("PUB %s%s %d\r\n" % (subject, rep, n)).encode()
        if n <= 65536:
            self._send(b"".join((cmd, data, _CRLF)))
            return
        if self._closed is not None:
            raise self._closed
        with self._wlock:
            try:
                self._sock.sendall(cmd)
                self._sock.sendall(data)
                self._sock.sendall(_CRLF)
            except OSError as e:
                self._fail(ConnectionClosedError("send: %s" % e))
                raise self._closed  # type: ignore[misc]

    def _check_size(self, subject: str, size: int) -> None:
        if size > self.max_payload:
            raise MaxPayloadError("a message of %d bytes to %s is over the server's max_payload of %d bytes "
                                  "(the server would close the connection)" % (size, subject, self.max_payload))

    def subscribe(self, subject: str, cb: Optional[Callable[[Msg], None]] = None,
                  sink: Optional[Callable[[str, str, int], Optional[memoryview]]] = None) -> Subscription:
        """Subscribes to subject; cb, when given, runs on the reader thread.

        sink, when given, is asked on the reader thread, for each message
        without headers, sink(subject, reply, size), before its payload is
        read: a writable memoryview of exactly size bytes receives the
        payload straight from the socket (the message's data is then that
        view); None reads it as usual."""
        with self._slock:
            sid = self._next_sid
            self._next_sid += 1
            sub = Subscription(self, sid, subject, cb, sink)
            self._subs[sid] = sub
        self._send(("SUB %s %d\r\n" % (subject, sid)).encode())
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._slock:
            if self._subs.pop(sub.sid, None) is None:
                return
        if self._closed is None:
            self._send(("UNSUB %d\r\n" % sub.sid).encode())

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until the server has processed everything sent (PING, PONG)."""
        ev = threading.Event()
        with self._wlock:
            self._pongs.append(ev)
            try:
                self._sock.sendall(b"PING\r\n")
            except OSError as e:
                self._fail(ConnectionClosedError("send: %s" % e))
        if not ev.wait(self.timeout if timeout is None else timeout):
            raise TimeoutError("no PONG from the server")
        if self._closed is not None:
            raise self._closed

    # -- requests ----------------------------------------------------------

    def _mux_deliver(self, m: Msg) -> None:
        token = m.subject[len(self._mux_prefix) :].split(".", 1)[0]
        with self._mux_lock:
            w = self._mux.get(token)
            if isinstance(w, _Waiter):
                del self._mux[token]
        if w is None:
            return
        if isinstance(w, _Waiter):
            w.msg = m
            w.ev.set()
        else:
            w(m)

    def new_reply(self, cb: Optional[Callable[[Msg], None]] = None, persistent: bool = False) -> Tuple[str, str]:
        """A reply subject on the connection's response inbox and its token.
        With cb, each message to it calls cb on the reader thread (until
        drop_reply(token)); cb is called with None if the connection dies."""
        with self._mux_lock:
            self._mux_n += 1
            token = "%x" % self._mux_n
            if cb is not None:
                self._mux[token] = cb
        return self._mux_prefix + token, token

    def drop_reply(self, token: str) -> None:
        with self._mux_lock:
            self._mux.pop(token, None)

    def request(self, subject: str, data: Data = b"", headers: Optional[Headers] = None,
                timeout: Optional[float] = None) -> Msg:
        """Publishes with a reply subject and waits for the first answer.
        Raises NoRespondersError when nothing subscribes to subject."""
        w = _Waiter()
        with self._mux_lock:
            self._mux_n += 1
            token = "%x" % self._mux_n
            self._mux[token] = w
        try:
            self.publish(subject, data, reply=self._mux_prefix + token, headers=headers)
            if not w.ev.wait(self.timeout if timeout is None else timeout):
                raise TimeoutError("no answer on %s within %.1fs" % (subject, self.timeout if timeout is None else timeout))
        finally:
            with self._mux_lock:
                self._mux.pop(token, None)
        if w.msg is None:
            raise self._closed or ConnectionClosedError("connection closed")
        if w.msg.status == "503":
            raise NoRespondersError("no responders on %s" % subject)
        return w.msg

    def new_inbox(self) -> str:
        return "%s.%s" % (self._inbox_prefix, secrets.token_hex(12))

    # -- JetStream ---------------------------------------------------------

    def js_publish(self, subject: str, data: Data, headers: Optional[Headers] = None,
                   timeout: Optional[float] = None) -> dict:
        """Publishes through JetStream and returns the acknowledgement
        ({"stream", "seq"}); a refusal raises JetStreamError."""
        try:
            m = self.request(subject, data, headers=headers, timeout=timeout)
        except NoRespondersError:
            raise NoRespondersError("no stream captures %s (no responders)" % subject) from None
        return parse_ack(m, subject)

    def js_api(self, call: str, req: Optional[dict] = None, timeout: Optional[float] = None) -> dict:
        """Calls $JS.API.<call> with a JSON request; an error raises JetStreamError."""
        m = self.request("$JS.API." + call, json.dumps(req or {}).encode(), timeout=timeout)
        r = json.loads(m.data)
        if r.get("error"):
            e = r["error"]
            raise JetStreamError("JetStream %s: %s" % (call, e.get("description")), e.get("code", 0), e.get("err_code", 0),
                                 e.get("description", ""))
        return r

    def direct_get(self, stream: str, req: dict, timeout: Optional[float] = None) -> Optional[Msg]:
        """One message by a direct get ($JS.API.DIRECT.GET.<stream>), or None when there is none."""
        m = self.request("$JS.API.DIRECT.GET." + stream, json.dumps(req).encode(), timeout=timeout)
        if m.status == "404":
            return None
        if m.status and m.status != "200":
            raise JetStreamError("direct get from %s: status %s %s" % (stream, m.status, m.headers.get("Description", "")),
                                 int(m.status), 0, m.headers.get("Description", ""))
        return m

    def close(self) -> None:
        """Closes the connection; idempotent."""
        if self._closed is None:
            self._closed = ConnectionClosedError("connection closed")
            try:
                with self._wlock:
                    self._sock.sendall(b"PING\r\n")
            except OSError:
                pass
            self._fail(self._closed)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if self._reader.is_alive() and threading.current_thread() is not self._reader:
            self._reader.join(2)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_ack(m: Msg, subject: str) -> dict:
    """A JetStream publish acknowledgement, or JetStreamError."""
    if m.status == "503":
        raise NoRespondersError("no stream captures %s (no responders)" % subject)
    try:
        ack = json.loads(m.data)
    except ValueError:
        raise JetStreamError("publish to %s: answer %r is not an acknowledgement" % (subject, bytes(m.data[:80])), 0, 0, "") from None
    e = ack.get("error")
    if e:
        raise JetStreamError("publish to %s refused by JetStream: %s" % (subject, e.get("description")),
                             e.get("code", 0), e.get("err_code", 0), e.get("description", ""))
    return ack

