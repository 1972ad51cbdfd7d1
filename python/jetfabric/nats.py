"""A NATS client over one TCP socket, in the standard library.

It speaks the NATS client protocol (INFO, CONNECT, PUB, HPUB, SUB, UNSUB,
MSG, HMSG, PING, PONG, +OK, -ERR) with headers, plus what jetfabric needs of
JetStream: publishes with an acknowledgement, API requests, direct gets.

One reader thread owns the socket's input: it parses messages and hands
each to its subscription, either by calling the subscription's callback
(on the reader thread: keep callbacks short) or by queueing it for
Subscription.next. Writes go out under a lock, from any thread.

A lost connection is made again by the reader thread, to the URL it was
made to or any other of those given, with backoff, for a bounded time
(Connection's reconnect_*): the subscriptions are made again on the new
connection, and what was published meanwhile is kept (up to a bound) and
sent then. Every wait has a deadline, and its error names the cause: no
connection (DisconnectedError), no responders, no answer in time.

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
import struct
import sys
import threading
import time
import urllib.parse
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import (
    ConnectionClosedError,
    DisconnectedError,
    FabricError,
    JetStreamError,
    MaxPayloadError,
    NoRespondersError,
    TimeoutError,
    TLSError,
)

__all__ = ["Msg", "Subscription", "Connection", "Server", "parse_servers", "transient", "parse_ack",
           "CONNECTED", "RECONNECTING", "CLOSED", "ACK_WAIT"]

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


CONNECTED = "connected"
RECONNECTING = "reconnecting"
CLOSED = "closed"

# Errors a server sends that leave the connection open (nats.go's list):
# every other -ERR is followed by the server closing it, and a connection
# closed so is not made again.
_BENIGN_ERRS = ("permissions violation", "stale connection", "maximum connections exceeded")


class Server:
    """One broker URL of a connection: url as given, scheme, host, port, and
    the user and password it carries."""

    __slots__ = ("url", "scheme", "host", "port", "user", "password")

    def __init__(self, url: str, scheme: str, host: str, port: int, user: str, password: str):
        self.url = url
        self.scheme = scheme
        self.host = host
        self.port = port
        self.user = user
        self.password = password

    def __repr__(self) -> str:
        return "Server(%s)" % self.redacted()

    def redacted(self) -> str:
        """The URL without its password."""
        if not self.password:
            return self.url
        return "%s://%s:***@%s:%d" % (self.scheme, self.user, self.host, self.port)


def parse_servers(url: Union[str, Sequence[str]]) -> List[Server]:
    """The brokers of url: one URL, several separated by commas, or a list
    of them; each nats://[user:password@]host:port, tls://..., or
    host:port. Anything else raises FabricError naming the entry."""
    if isinstance(url, str):
        parts: List[object] = url.split(",")
    elif isinstance(url, (list, tuple)):
        parts = list(url)
        if not parts:
            raise FabricError("no broker URL given (an empty list): want nats://host:port, or several")
    else:
        raise FabricError("broker URL %r: want a string (nats://host:port, several separated by commas) or a list of them"
                          % (url,))
    out: List[Server] = []
    for raw in parts:
        if not isinstance(raw, str):
            raise FabricError("broker URL %r in %r is not a string" % (raw, url))
        text = raw.strip()
        if not text:
            raise FabricError("empty broker URL in %r: want nats://host:port[,nats://host:port...]" % (url,))
        u = urllib.parse.urlsplit(text if "://" in text else "nats://" + text)
        if u.scheme not in ("nats", "tcp", "tls"):
            raise FabricError("broker URL %r: unsupported URL scheme %r (want nats://host:port, or tls://host:port)"
                              % (text, u.scheme))
        try:
            port = u.port
        except ValueError:
            port = 0
        if port is None:
            port = 4222
        elif port == 0:
            raise FabricError("broker URL %r: the port is not a number from 1 to 65535" % text)
        host = u.hostname or "127.0.0.1"
        if any(c.isspace() or c in "/\\?#@[]" for c in host) or u.path not in ("", "/") or u.query or u.fragment:
            raise FabricError("broker URL %r: not of the form nats://[user:password@]host:port" % text)
        out.append(Server(text, u.scheme, host, port, urllib.parse.unquote(u.username or ""),
                          urllib.parse.unquote(u.password or "")))
    return out


def _dial_error(srv: Server, e: Exception, timeout: float) -> FabricError:
    """A failure to reach srv as the error that says what it means."""
    where = "%s:%d" % (srv.host, srv.port)
    if isinstance(e, ConnectionRefusedError):
        return ConnectionClosedError("no broker at %s: connection refused (nothing listens on %s): start one (jetfabric "
                                     "up, or jetfabric broker) or check the URL" % (srv.redacted(), where))
    if isinstance(e, socket.gaierror):
        return ConnectionClosedError("no broker at %s: cannot resolve host %r: %s" % (srv.redacted(), srv.host, e))
    if isinstance(e, socket.timeout):
        return TimeoutError("no broker at %s: no answer to connecting within %.1fs" % (srv.redacted(), timeout))
    return ConnectionClosedError("no broker at %s: %s" % (srv.redacted(), e))


class _Link:
    """A socket during its handshake: reads lines with a deadline, and keeps
    what was read past them for the reader thread."""

    def __init__(self, sock: socket.socket):
        self.sock: Union[socket.socket, _TLSSocket] = sock
        self.buf = bytearray()
        self.pos = 0
        self.info: dict = {}
        self.tls_version: Optional[str] = None

    def line(self, deadline: float) -> bytearray:
        while True:
            i = self.buf.find(_CRLF, self.pos)
            if i >= 0:
                out = self.buf[self.pos : i]
                self.pos = i + 2
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionClosedError("the server closed the connection")
            self.buf += chunk

    def rest(self) -> bytearray:
        return self.buf[self.pos :]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Connection:
    """A connection to a NATS server, made again when it is lost.

    url is nats://[user:password@]host:port (or host:port), or several such
    URLs (separated by commas, or a list): the connection is made to the
    first that answers, in order, within timeout seconds in all; a URL
    that does not parse raises FabricError at once. token, user and
    password may also be given, or creds, the path of a creds file (a user
    JWT and its nkey seed: the connection signs the server's nonce). The
    server must support headers (NATS 2.2 or later). max_payload is the
    server's limit on a message, headers included; publish raises
    MaxPayloadError rather than send a larger one (the server would close
    the connection).

    Reconnecting: when the connection is lost (the broker restarts, its
    node dies), the reader thread dials the URLs again in turn, waiting
    reconnect_wait seconds between rounds, doubling to reconnect_max_wait,
    for at most reconnect_time seconds (None: for ever), and then closes
    the connection for good (calls raise ConnectionClosedError saying so).
    Meanwhile status is "reconnecting": publishes are kept, up to
    reconnect_buffer bytes, and sent once connected (past it they raise
    DisconnectedError); a request whose answer was lost with the connection
    raises DisconnectedError; subscriptions are made again on the new
    connection (messages published meanwhile are not delivered), before
    the kept publishes go out. A server that closes the connection after
    an -ERR (a message over max_payload, an authorization failure) closes
    it for good; so does close(), and reconnect=False on any loss.
    reconnects counts the connections made again. A connection whose server
    went silent is taken for lost when max_pings_out PINGs, sent every
    ping_interval seconds, have had no PONG, or when a send makes no
    progress for timeout seconds (at least 10).

    TLS: tls_ca is a PEM file of the authorities to trust (default: the
    system's), tls_cert and tls_key a client certificate for a broker that
    verifies its clients; ssl_context replaces all three. tls=None (the
    default) uses TLS when the server requires it, or when the URL is
    tls:// or a TLS argument is given; tls=True requires it; tls=False
    refuses it (a server that requires TLS is then an error).
    tls_handshake_first starts TLS before the server's INFO, for servers
    configured with handshake_first.
    """

    def __init__(self, url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222", name: str = "jetfabric-python",
                 timeout: float = 10.0, user: str = "", password: str = "", token: str = "",
                 inbox_prefix: str = "_INBOX_fabric", tls: Optional[bool] = None, tls_ca: str = "", tls_cert: str = "",
                 tls_key: str = "", ssl_context: Optional[ssl.SSLContext] = None, tls_handshake_first: bool = False,
                 creds: str = "", reconnect: bool = True, reconnect_wait: float = 0.25, reconnect_max_wait: float = 2.0,
                 reconnect_time: Optional[float] = 120.0, reconnect_buffer: int = 8 << 20,
                 ping_interval: float = 20.0, max_pings_out: int = 2):
        self.servers = parse_servers(url)
        if not timeout > 0:
            raise ValueError("timeout %r: want seconds > 0" % (timeout,))
        if not reconnect_wait > 0 or not reconnect_max_wait >= reconnect_wait:
            raise ValueError("reconnect_wait %r, reconnect_max_wait %r: want 0 < reconnect_wait <= reconnect_max_wait"
                             % (reconnect_wait, reconnect_max_wait))
        if reconnect_time is not None and not reconnect_time >= 0:
            raise ValueError("reconnect_time %r: want seconds >= 0, or None to reconnect for ever" % (reconnect_time,))
        if reconnect_buffer < 0:
            raise ValueError("reconnect_buffer %r: want bytes >= 0" % (reconnect_buffer,))
        if not ping_interval >= 0 or max_pings_out < 1:
            raise ValueError("ping_interval %r, max_pings_out %r: want seconds >= 0 (0: no pings) and at least 1"
                             % (ping_interval, max_pings_out))
        asked = (any(s.scheme == "tls" for s in self.servers) or bool(tls_ca or tls_cert or tls_key)
                 or ssl_context is not None or tls_handshake_first)
        if tls is False and asked:
            raise TLSError("tls=False contradicts the TLS arguments or the tls:// URL given")
        self._tls = tls
        self._want_tls = bool(tls) or bool(tls_ca or tls_cert or tls_key) or ssl_context is not None or tls_handshake_first
        self._ctx: Optional[ssl.SSLContext] = None
        if tls is not False:
            self._ctx = ssl_context or self._tls_context(tls_ca, tls_cert, tls_key)
        self._have_cert = bool(tls_cert) or ssl_context is not None
        self._handshake_first = tls_handshake_first
        self._name = name
        self._user, self._password, self._token, self._creds = user, password, token, creds
        self._reconnect = reconnect
        self._reconnect_wait = reconnect_wait
        self._reconnect_max_wait = reconnect_max_wait
        self.reconnect_time = reconnect_time
        self.reconnect_buffer = reconnect_buffer
        self._ping_interval = ping_interval
        self._max_pings_out = max_pings_out
        self._pings_out = 0
        self.timeout = timeout

        self._wlock = threading.Lock()  # the socket's output, the status, the kept publishes
        self._slock = threading.Lock()
        self._subs: Dict[int, Subscription] = {}
        self._next_sid = 1
        self._pongs: collections.deque = collections.deque()
        self._closed: Optional[Exception] = None
        self._stop = threading.Event()
        self._state = threading.Condition(threading.Lock())  # notified when status changes
        self.status = CONNECTED
        self.reconnects = 0
        self._kept: List[bytes] = []  # publishes made while reconnecting
        self._kept_size = 0
        self._lost_at = 0.0
        self._lost_why = ""
        self._fatal = ""  # an -ERR after which the server closes the connection
        self._listeners: List[Callable[[str], None]] = []
        self.last_error = ""

        self._inbox_prefix = inbox_prefix
        self._mux_prefix = "%s.%s." % (inbox_prefix, secrets.token_hex(8))
        self._mux_lock = threading.Lock()
        self._mux: Dict[str, Union[_Waiter, Callable[[Msg], None]]] = {}
        self._mux_n = 0

        link, srv = self._connect_first()
        self._install_link(link, srv)
        self._reader = threading.Thread(target=self._run, name="jetfabric-nats-reader", daemon=True)
        self._reader.start()
        self._mux_sub = self.subscribe(self._mux_prefix + ">", cb=self._mux_deliver)
        if ping_interval > 0:
            threading.Thread(target=self._pinger, name="jetfabric-nats-pinger", daemon=True).start()

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

    # -- dialling ----------------------------------------------------------

    def _connect_first(self) -> Tuple[_Link, Server]:
        """Dials the servers in order until one answers, within timeout in all."""
        deadline = time.monotonic() + self.timeout
        failed: List[Tuple[Server, FabricError]] = []
        for srv in self.servers:
            left = deadline - time.monotonic()
            if left <= 0:
                failed.append((srv, TimeoutError("not tried: the %.1fs to connect ran out" % self.timeout)))
                continue
            try:
                return self._dial(srv, left), srv
            except FabricError as e:
                failed.append((srv, e))
        if len(failed) == 1:
            raise failed[0][1]
        text = "no broker answered at any of %d URLs: %s" % (len(failed), "; ".join(
            "%s: %s" % (s.redacted(), e) for s, e in failed))
        kinds = set(type(e) for _, e in failed)
        cls = kinds.pop() if len(kinds) == 1 else ConnectionClosedError
        raise cls(text)

    def _dial(self, srv: Server, timeout: float) -> _Link:
        """Connects to srv and does the handshake (TLS, CONNECT, PING/PONG),
        all within timeout seconds."""
        deadline = time.monotonic() + timeout
        url = srv.redacted()
        try:
            sock = socket.create_connection((srv.host, srv.port), timeout=timeout)
        except OSError as e:
            raise _dial_error(srv, e, timeout) from None
        link = _Link(sock)
        try:
            self._handshake(link, srv, url, deadline, timeout)
        except BaseException:
            link.close()
            raise
        link.sock.settimeout(None)
        return link

    def _handshake(self, link: _Link, srv: Server, url: str, deadline: float, timeout: float) -> None:
        sock = link.sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        if sys.platform != "win32" and hasattr(socket, "SO_SNDTIMEO"):
            # A send that makes no progress for this long (a server that
            # stopped reading: paused, or its host gone) fails, and the
            # connection is made again, as the server does to a client it
            # cannot write to.
            w = max(self.timeout, _WRITE_STALL)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,  # type: ignore[union-attr]
                                struct.pack("ll", int(w), int((w % 1) * 1e6)))
            except (OSError, struct.error):
                pass
        # The socket's buffers are left to the kernel's autotuning, as
        # nats.go leaves them: on Linux a fixed SO_RCVBUF or SO_SNDBUF turns
        # autotuning off (a receive buffer may grow to tcp_rmem's maximum,
        # 32 MiB on the development VM, a fixed 4 MiB may not), and 64 MiB
        # transfers measured no faster with them fixed (BENCHMARKS.md).
        want_tls = self._want_tls or srv.scheme == "tls"
        if self._handshake_first:
            self._start_tls(link, url, srv.host)
        try:
            line = link.line(deadline)
        except socket.timeout:
            raise TimeoutError("no INFO from %s within %.1fs (a server configured with TLS handshake_first says nothing "
                               "before the client starts TLS: tls_handshake_first=True)" % (url, timeout)) from None
        except OSError as e:
            raise ConnectionClosedError("connect %s: %s" % (url, e)) from None
        if not line.startswith(b"INFO "):
            raise ConnectionClosedError("expected INFO from %s, got %r" % (url, bytes(line[:80])))
        info = json.loads(bytes(line[5:]))
        link.info = info
        if not self._handshake_first:
            required, available = info.get("tls_required", False), info.get("tls_available", False)
            if required and self._tls is False:
                raise TLSError("the broker at %s requires TLS and tls=False refused it: connect with TLS (tls_ca=... for "
                               "the CA that signed its certificate)" % url)
            if want_tls and not required and not available:
                raise TLSError("TLS was asked for but the broker at %s does not offer it: connect to nats:// without TLS "
                               "arguments, or start the broker with --tls-cert and --tls-key" % url)
            if required or want_tls:
                if link.pos != len(link.buf):
                    raise ConnectionClosedError("the server sent data after INFO before the TLS handshake")
                self._start_tls(link, url, srv.host)
                if info.get("tls_verify") and not self._have_cert:
                    # The server would refuse the connection after the handshake.
                    raise TLSError("the broker at %s verifies client certificates and none was given: give one (tls_cert=..., "
                                   "tls_key=...; jetfabric certs writes client.pem and client-key.pem)" % url)
        if not info.get("headers"):
            raise FabricError("the server does not support message headers (NATS 2.2 or later needed)")
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
                   "name": self._name, "lang": "python", "version": "1", "tls_required": link.tls_version is not None}
        user = self._user or srv.user
        password = self._password or srv.password
        token = self._token
        if user and not password and not token:
            token, user = user, ""
        if user:
            connect["user"], connect["pass"] = user, password
        if token:
            connect["auth_token"] = token
        creds = self._creds
        if creds:
            from . import nkeys
            try:
                jwt, seed = nkeys.read_creds(creds)
                connect["jwt"], connect["sig"] = jwt, nkeys.sign_nonce(seed, info.get("nonce", ""))
            except (OSError, ValueError) as e:
                raise FabricError("creds %s: %s" % (creds, e)) from None
        try:
            link.sock.settimeout(max(0.001, deadline - time.monotonic()))
            link.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            while True:
                line = link.line(deadline)
                if line == b"PONG":
                    break
                if line.startswith(b"-ERR"):
                    why = bytes(line[5:]).decode("utf-8", "replace")
                    if creds and "authorization" in why.lower():
                        raise ConnectionClosedError("server refused the credentials in %s (not signed by this fabric's account, expired or revoked): %s"
                                                    % (creds, why))
                    raise ConnectionClosedError("server refused CONNECT: %s" % why)
                if line == b"PING":
                    link.sock.sendall(b"PONG\r\n")
        except socket.timeout:
            raise TimeoutError("no answer from %s to CONNECT within %.1fs" % (url, timeout)) from None
        except (ssl.SSLError, ConnectionClosedError, OSError) as e:
            if link.tls_version is None:
                if isinstance(e, FabricError):
                    raise
                raise ConnectionClosedError("connect %s: %s" % (url, e)) from None
            # A broker that refuses the client's certificate says so once
            # the handshake is over (TLS 1.3) with an alert, or closes the
            # connection.
            if isinstance(e, ssl.SSLError):
                raise _tls_error(url, e, self._have_cert) from None
            if info.get("tls_verify") and (not isinstance(e, FabricError) or "closed the connection" in str(e)):
                raise _tls_error(url, ssl.SSLError("the broker closed the connection after the handshake (%s; CERTIFICATE_UNKNOWN)" % e),
                                 self._have_cert) from None
            if not isinstance(e, FabricError):
                raise ConnectionClosedError("connect %s: %s" % (url, e)) from None
            raise

    def _start_tls(self, link: _Link, url: str, host: str) -> None:
        try:
            link.sock = _TLSSocket(link.sock, self._ctx, host)  # type: ignore[arg-type]
        except ssl.SSLError as e:
            raise _tls_error(url, e, self._have_cert) from None
        except socket.timeout:
            raise TimeoutError("TLS handshake with %s: no answer within %.1fs" % (url, self.timeout)) from None
        except OSError as e:
            raise ConnectionClosedError("TLS handshake with %s: %s" % (url, e)) from None
        link.tls_version = link.sock.version()  # type: ignore[union-attr]

    def _install_link(self, link: _Link, srv: Server) -> None:
        """Makes link the connection's socket (the caller holds _wlock or is __init__)."""
        self._sock = link.sock
        # A plain socket sends a message's parts in one system call (its
        # header line, payload and CRLF, without joining them).
        self._vectored = isinstance(link.sock, socket.socket) and hasattr(link.sock, "sendmsg")
        self._rest = link.rest()
        self.info = link.info
        self.max_payload: int = int(link.info.get("max_payload", 1 << 20))
        self.tls_version = link.tls_version
        self.url = srv.url
        self.server = srv
        self._fatal = ""
        self._broke_why = ""  # why this side took the connection for broken

    # -- state -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether the connection is closed for good."""
        return self._closed is not None

    def buffered(self) -> int:
        """The bytes published while reconnecting, waiting for the connection."""
        return self._kept_size

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """Calls fn("disconnected"), fn("reconnected") or fn("closed") on the
        reader thread when the connection is lost, made again, or closed for
        good. Keep it short; it must not wait on the connection."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        try:
            self._listeners.remove(fn)
        except ValueError:
            pass

    def _wake_requests(self) -> None:
        """Wakes every request waiting for an answer (its answer None): the
        connection it was sent on is gone."""
        with self._mux_lock:
            waiters = list(self._mux.values())
        for w in waiters:
            if isinstance(w, _Waiter):
                w.ev.set()
            else:
                try:
                    w(None)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001
                    pass

    def _tell(self, event: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(event)
            except Exception as e:  # noqa: BLE001 - a listener's failure must not stop the reader
                self.last_error = "listener: %r" % e

    def _set_status(self, status: str) -> None:
        with self._state:
            self.status = status
            self._state.notify_all()

    def disconnected_error(self, what: str = "") -> Exception:
        """The error of a call made while the connection is down: the terminal
        error once closed, else a DisconnectedError saying since when, why,
        and where the client is reconnecting."""
        if self._closed is not None:
            return self._closed
        since = time.monotonic() - self._lost_at
        return DisconnectedError("%sno connection to the broker: lost %.1fs ago (%s); reconnecting to %s%s by itself, and "
                                 "what is published meanwhile goes out once connected: check that the broker (or a majority "
                                 "of the cluster's nodes) is up" % (
                                     what + ": " if what else "", since, self._lost_why,
                                     ", ".join(s.redacted() for s in self.servers),
                                     "" if self.reconnect_time is None else " for up to %.0fs" % self.reconnect_time))

    def wait_connected(self, timeout: float) -> None:
        """Returns once the connection is up; raises its terminal error if it
        is closed, and DisconnectedError if it is not back within timeout."""
        deadline = time.monotonic() + timeout
        with self._state:
            while self.status != CONNECTED:
                if self._closed is not None:
                    raise self._closed
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.disconnected_error()
                self._state.wait(left)

    # -- reading -----------------------------------------------------------

    def _run(self) -> None:
        """The reader thread: reads until the connection is lost, then makes
        it again (or closes it for good)."""
        while True:
            err = self._read_loop()
            if self._broke_why:
                err = ConnectionClosedError(self._broke_why)
            if self._closed is not None:
                return
            if not self._reconnect or self._fatal:
                self._fail(err)
                return
            self._lost(err)
            if not self._redial():
                return

    def _lost(self, err: Exception) -> None:
        """The connection broke: answers in flight with it are lost."""
        with self._wlock:
            if self._closed is not None:
                return  # closed meanwhile: _redial sees it
            self._lost_at = time.monotonic()
            self._lost_why = str(err)
            try:
                self._sock.close()
            except OSError:
                pass
            self._set_status(RECONNECTING)
        while self._pongs:
            self._pongs.popleft().set()
        self._wake_requests()
        self._tell("disconnected")

    def _redial(self) -> bool:
        """Dials the servers in turn, with backoff, until one answers (True)
        or reconnect_time has passed (the connection is then closed, False)."""
        start = self._lost_at
        last: Optional[Tuple[Server, Exception]] = None
        wait = self._reconnect_wait
        # The server just lost is tried last in each round.
        order = [s for s in self.servers if s is not self.server] + [self.server]
        while True:
            for srv in order:
                if self._closed is not None:
                    return False
                left = None if self.reconnect_time is None else start + self.reconnect_time - time.monotonic()
                if left is not None and left <= 0:
                    return self._give_up(last)
                try:
                    link = self._dial(srv, self.timeout if left is None else max(0.05, min(self.timeout, left)))
                except FabricError as e:
                    last = (srv, e)
                    continue
                if self._resume(link, srv):
                    return True
                last = (srv, ConnectionClosedError("lost again at once"))
            left = None if self.reconnect_time is None else start + self.reconnect_time - time.monotonic()
            if left is not None and left <= 0:
                return self._give_up(last)
            pause = wait * (0.5 + 0.5 * secrets.randbelow(1000) / 1000.0)
            if self._stop.wait(pause if left is None else min(pause, left)):
                return False
            wait = min(2 * wait, self._reconnect_max_wait)

    def _resume(self, link: _Link, srv: Server) -> bool:
        """Installs link, subscribes again and sends the kept publishes."""
        with self._wlock:
            if self._closed is not None:
                link.close()
                return False
            with self._slock:
                subs = list(self._subs.values())
            data = b"".join(("SUB %s %d\r\n" % (s.subject, s.sid)).encode() for s in subs) + b"".join(self._kept)
            try:
                link.sock.sendall(data)
            except OSError:
                link.close()
                return False
            self._install_link(link, srv)
            self._kept, self._kept_size = [], 0
            self._pings_out = 0
            self.reconnects += 1
            self._set_status(CONNECTED)
        self._tell("reconnected")
        return True

    def _give_up(self, last: Optional[Tuple[Server, Exception]]) -> bool:
        self._fail(ConnectionClosedError(
            "lost the broker (%s) and could not connect again to %s within %.1fs (reconnect_time)%s" % (
                self._lost_why, ", ".join(s.redacted() for s in self.servers), self.reconnect_time or 0.0,
                ": last error: %s: %s" % (last[0].redacted(), last[1]) if last else "")))
        return False

    def _pinger(self) -> None:
        """Sends a PING every ping_interval while connected; when
        max_pings_out of them have had no PONG, the connection is taken for
        dead (its server's host gone, a network cut: no reset ever comes)
        and made again. Runs until the connection is closed."""
        while not self._stop.wait(self._ping_interval):
            with self._wlock:
                if self.status != CONNECTED or self._closed is not None:
                    continue
                if self._pings_out >= self._max_pings_out:
                    self._broke_why = "stale connection: no PONG to %d PINGs sent %.1fs apart" % (
                        self._pings_out, self._ping_interval)
                    self._broken(OSError(self._broke_why))
                    continue
                self._pings_out += 1
                self._pongs.append(threading.Event())
                try:
                    self._sock.sendall(b"PING\r\n")
                except OSError as e:
                    self._broken(e)

    def _read_loop(self) -> Exception:
        """Reads and dispatches until the socket fails; returns why."""
        sock = self._sock
        buf = bytearray(self._rest)
        pos = 0
        self._rest = bytearray()
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
                        self._pings_out = 0
                        if self._pongs:
                            self._pongs.popleft().set()
                    elif line.startswith(b"-ERR"):
                        self.last_error = line[5:].decode("utf-8", "replace").strip().strip("'")
                        if not any(b in self.last_error.lower() for b in _BENIGN_ERRS):
                            self._fatal = self.last_error
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
            return e

    def _fail(self, e: Exception) -> None:
        """Closes the connection for good with error e: every wait ends."""
        with self._wlock:
            if self._closed is None:
                self._closed = e
            self._kept, self._kept_size = [], 0
            self._set_status(CLOSED)
        self._stop.set()
        for ev in list(self._pongs):
            ev.set()
        for sub in list(self._subs.values()):
            sub._wake()
            if sub.cb is not None and sub is not getattr(self, "_mux_sub", None):
                try:
                    sub.cb(None)  # type: ignore[arg-type]
                except Exception:
                    pass
        self._wake_requests()
        self._tell("closed")

    # -- writing -----------------------------------------------------------

    def _keep(self, data: Data) -> None:
        """Keeps data for the connection being made again (the caller holds _wlock)."""
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if not self._reconnect:
            raise self.disconnected_error()
        if self._kept_size + n > self.reconnect_buffer:
            raise self.disconnected_error("%d bytes not sent (the %d bytes kept for the reconnection are full)"
                                          % (n, self.reconnect_buffer))
        self._kept.append(bytes(data))
        self._kept_size += n

    def _broken(self, e: OSError) -> None:
        """A send failed, or the server went silent (the caller holds _wlock):
        the reader finds the socket dead and reconnects, or, without
        reconnecting, it closes."""
        self._broke_why = self._broke_why or "send: %s" % e
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, *parts: Data) -> None:
        with self._wlock:
            if self._closed is not None:
                raise self._closed
            if self.status != CONNECTED:
                self._keep(b"".join(parts))
                return
            try:
                if len(parts) > 1 and self._vectored:
                    _sendmsg_all(self._sock, parts)  # type: ignore[arg-type]
                else:
                    for p in parts:
                        self._sock.sendall(p)
            except OSError as e:
                self._broken(e)
                if not self._reconnect:
                    raise ConnectionClosedError("send: %s" % e) from None
                # Whatever part of it went out went with the old connection.
                self._keep(b"".join(parts))

    def publish(self, subject: str, data: Data = b"", reply: str = "", headers: Optional[Headers] = None) -> None:
        """Publishes data (PUB, or HPUB with headers). While the connection is
        being made again it is kept and sent once connected (see Connection)."""
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
        self._send(cmd, data, _CRLF)

    def _check_size(self, subject: str, size: int) -> None:
        if size > self.max_payload:
            raise MaxPayloadError("a message of %d bytes to %s is over the server's max_payload of %d bytes "
                                  "(the server would close the connection)" % (size, subject, self.max_payload))

    def subscribe(self, subject: str, cb: Optional[Callable[[Msg], None]] = None,
                  sink: Optional[Callable[[str, str, int], Optional[memoryview]]] = None) -> Subscription:
        """Subscribes to subject; cb, when given, runs on the reader thread.
        The subscription is made again on every new connection (messages
        published while there was none are not delivered).

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
        self._control(("SUB %s %d\r\n" % (subject, sid)).encode())
        return sub

    def _control(self, line: bytes) -> None:
        """Sends SUB or UNSUB now, or not at all while reconnecting (the new
        connection gets the subscriptions of the moment)."""
        with self._wlock:
            if self._closed is not None:
                raise self._closed
            if self.status != CONNECTED:
                return
            try:
                self._sock.sendall(line)
            except OSError as e:
                self._broken(e)
                if not self._reconnect:
                    raise ConnectionClosedError("send: %s" % e) from None

    def unsubscribe(self, sub: Subscription) -> None:
        with self._slock:
            if self._subs.pop(sub.sid, None) is None:
                return
        if self._closed is None:
            self._control(("UNSUB %d\r\n" % sub.sid).encode())

    def flush(self, timeout: Optional[float] = None) -> None:
        """Waits until the server has processed everything sent (PING, PONG)."""
        t = self.timeout if timeout is None else timeout
        ev = threading.Event()
        with self._wlock:
            if self._closed is not None:
                raise self._closed
            if self.status != CONNECTED:
                raise self.disconnected_error("flush")
            self._pongs.append(ev)
            try:
                self._sock.sendall(b"PING\r\n")
            except OSError as e:
                self._broken(e)
        if not ev.wait(t):
            raise TimeoutError("no PONG from the server within %.1fs" % t)
        if self._closed is not None:
            raise self._closed
        if self.status != CONNECTED:
            raise self.disconnected_error("flush")

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
        With cb, each message to it (or to a subject under it, reply + ".x")
        calls cb on the reader thread (until drop_reply(token)); cb is called
        with None when the connection is lost (answers in flight are lost
        with it) and when it is closed."""
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
        Raises NoRespondersError when nothing subscribes to subject,
        TimeoutError when no answer comes within timeout, DisconnectedError
        when there is no connection (at once) or it is lost meanwhile."""
        t = self.timeout if timeout is None else timeout
        if self.status != CONNECTED:
            # The answer is what the caller needs: say at once that none can come.
            raise self.disconnected_error("request on %s" % subject)
        w = _Waiter()
        with self._mux_lock:
            self._mux_n += 1
            token = "%x" % self._mux_n
            self._mux[token] = w
        try:
            self.publish(subject, data, reply=self._mux_prefix + token, headers=headers)
            answered = w.ev.wait(t)
        finally:
            with self._mux_lock:
                self._mux.pop(token, None)
        if w.msg is None:
            if self._closed is not None:
                raise self._closed
            if answered:
                raise DisconnectedError("the connection to the broker was lost while waiting for an answer on %s (%s); "
                                        "the client is reconnecting by itself" % (subject, self._lost_why))
            if self.status != CONNECTED:
                raise self.disconnected_error("no answer on %s within %.1fs" % (subject, t))
            raise TimeoutError("no answer on %s within %.1fs" % (subject, t))
        if w.msg.status == "503":
            raise NoRespondersError("no responders on %s" % subject)
        return w.msg

    def new_inbox(self) -> str:
        return "%s.%s" % (self._inbox_prefix, secrets.token_hex(12))

    # -- JetStream ---------------------------------------------------------

    def js_publish(self, subject: str, data: Data, headers: Optional[Headers] = None,
                   timeout: Optional[float] = None, retry: Optional[bool] = None) -> dict:
        """Publishes through JetStream and returns the acknowledgement
        ({"stream", "seq"}, with "duplicate" when the stream had it); a
        refusal raises JetStreamError.

        With retry (the default when headers carry a Nats-Msg-Id), a publish
        whose acknowledgement does not come (lost with the connection, or
        later than ACK_WAIT) or that the stream cannot take for now (no
        responders, a 503 of a stream without a leader) is published again,
        with the same headers, waiting from 50 ms doubling to 2 s, until
        timeout: the stream's duplicate window stores it once. The error
        then names the last cause; no stream capturing subject raises
        NoRespondersError at once."""
        total = self.timeout if timeout is None else timeout
        if retry is None:
            retry = bool(headers) and "Nats-Msg-Id" in headers  # type: ignore[operator]
        if not retry:
            try:
                m = self.request(subject, data, headers=headers, timeout=total)
            except NoRespondersError:
                raise NoRespondersError("no stream captures %s (no responders)" % subject) from None
            return parse_ack(m, subject)
        deadline = time.monotonic() + total
        wait = 0.05
        checked = False
        last: Exception = TimeoutError("no acknowledgement")
        tries = 0
        while True:
            left = deadline - time.monotonic()
            try:
                if self.status != CONNECTED:
                    self.wait_connected(max(0.0, left))
                    continue
                tries += 1
                m = self.request(subject, data, headers=headers, timeout=max(0.001, min(left, ACK_WAIT)))
                return parse_ack(m, subject)
            except NoRespondersError as e:
                if not checked:
                    checked = True
                    if not self.stream_captures(subject):
                        raise NoRespondersError("no stream captures %s (no responders)" % subject) from None
                last = e
            except JetStreamError as e:
                if not transient(e):
                    raise
                last = e
            except DisconnectedError as e:
                last = e
            except TimeoutError as e:
                last = e
            left = deadline - time.monotonic()
            if left <= 0:
                why = "publish to %s not acknowledged within %.1fs (%d tries): %s" % (subject, total, tries, last)
                if isinstance(last, JetStreamError):
                    raise JetStreamError(why, last.code, last.err_code, last.description)
                raise type(last)(why)
            if self._stop.wait(min(wait, left)):
                raise self._closed or ConnectionClosedError("connection closed")
            wait = min(2 * wait, 2.0)

    def stream_captures(self, subject: str) -> bool:
        """Whether a stream captures subject (True when JetStream cannot say,
        or may not be asked)."""
        try:
            r = self.js_api("STREAM.NAMES", {"subject": subject}, timeout=min(self.timeout, 2.0))
        except FabricError:
            return True
        return bool(r.get("streams"))

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
        with self._wlock:
            first = self._closed is None
            if first:
                self._closed = ConnectionClosedError("connection closed")
                if self.status == CONNECTED:
                    try:
                        self._sock.sendall(b"PING\r\n")
                    except OSError:
                        pass
            sock = self._sock
        self._stop.set()
        if first:
            self._fail(self._closed)  # type: ignore[arg-type]
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        if self._reader.is_alive() and threading.current_thread() is not self._reader:
            self._reader.join(2)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sendmsg_all(sock: socket.socket, parts: Sequence[Data]) -> None:
    """Sends parts in order, as sendall would each, with as few sendmsg
    calls as the socket takes (one, unless its buffer fills)."""
    bufs = [memoryview(p).cast("B") for p in parts]
    while bufs:
        n = sock.sendmsg(bufs)
        while n > 0:
            first = bufs[0].nbytes
            if n >= first:
                n -= first
                bufs.pop(0)
            else:
                bufs[0] = bufs[0][n:]
                n = 0
        while bufs and not bufs[0].nbytes:
            bufs.pop(0)


# _WRITE_STALL is the least time a send may make no progress before the
# connection is taken for broken (nats-server's own write deadline).
_WRITE_STALL = 10.0

# ACK_WAIT bounds the wait for one JetStream acknowledgement before the
# publish goes out again (js_publish with retry; a session's frames).
ACK_WAIT = 2.0

# JetStream error codes (nats-server's errors.json).
ERR_STORE_FAILED = 10077  # a full stream, over a limit
ERR_DUP_IN_PROCESS = 10158  # the first publish of this Nats-Msg-Id is not committed yet


def transient(e: Exception) -> bool:
    """Whether a failed JetStream publish says nothing about the message, or
    that the stream cannot take it for now (no answer, no responders, a
    lost connection, no leader, a duplicate not yet committed): publishing
    it again with the same Nats-Msg-Id is then safe and needed. A refusal
    (too large, a full or sealed stream) is final."""
    if isinstance(e, JetStreamError):
        return (e.code == 503 and e.err_code != ERR_STORE_FAILED) or e.err_code == ERR_DUP_IN_PROCESS
    return isinstance(e, (NoRespondersError, TimeoutError, DisconnectedError))


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
