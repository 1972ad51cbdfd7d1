"""A NATS client over one TCP socket, in the standard library.

It speaks the NATS client protocol (INFO, CONNECT, PUB, HPUB, SUB, UNSUB,
MSG, HMSG, PING, PONG, +OK, -ERR) with headers, plus what jetfabric needs of
JetStream: publishes with an acknowledgement, API requests, direct gets.

One reader thread owns the socket's input: it parses messages and hands
each to its subscription, either by calling the subscription's callback
(on the reader thread: keep callbacks short) or by queueing it for
Subscription.next. Writes go out under a lock, from any thread.
"""

from __future__ import annotations

import collections
import json
import secrets
import socket
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

    def __init__(self, conn: "Connection", sid: int, subject: str, cb: Optional[Callable[[Msg], None]]):
        self.conn = conn
        self.sid = sid
        self.subject = subject
        self.cb = cb
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


class _Waiter:
    __slots__ = ("ev", "msg")

    def __init__(self) -> None:
        self.ev = threading.Event()
        self.msg: Optional[Msg] = None


class Connection:
    """A connection to a NATS server.

    url is nats://[user:password@]host:port (or host:port); token, user and
    password may also be given. The server must support headers (NATS 2.2
    or later). max_payload is the server's limit on a message, headers
    included; publish raises MaxPayloadError rather than send a larger one
    (the server would close the connection).
    """

    def __init__(self, url: str = "nats://127.0.0.1:4222", name: str = "jetfabric-python", timeout: float = 10.0,
                 user: str = "", password: str = "", token: str = "", inbox_prefix: str = "_INBOX_fabric"):
        u = urllib.parse.urlsplit(url if "://" in url else "nats://" + url)
        if u.scheme not in ("nats", "tcp"):
            raise FabricError("unsupported URL scheme %r (want nats://host:port)" % u.scheme)
        host, port = u.hostname or "127.0.0.1", u.port or 4222
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

        line = self._read_line_blocking()
        if not line.startswith(b"INFO "):
            raise ConnectionClosedError("expected INFO from %s, got %r" % (url, bytes(line[:80])))
        self.info = json.loads(bytes(line[5:]))
        if not self.info.get("headers"):
            raise FabricError("the server does not support message headers (NATS 2.2 or later needed)")
        self.max_payload: int = int(self.info.get("max_payload", 1 << 20))
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
                   "name": name, "lang": "python", "version": "1"}
        user = user or urllib.parse.unquote(u.username or "")
        password = password or urllib.parse.unquote(u.password or "")
        if user and not password and not token:
            token, user = user, ""
        if user:
            connect["user"], connect["pass"] = user, password
        if token:
            connect["auth_token"] = token
        self._sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        while True:
            line = self._read_line_blocking()
            if line == b"PONG":
                break
            if line.startswith(b"-ERR"):
                raise ConnectionClosedError("server refused CONNECT: %s" % bytes(line[5:]).decode("utf-8", "replace"))
            if line == b"PING":
                self._sock.sendall(b"PONG\r\n")
        self._sock.settimeout(None)

        self._inbox_prefix = inbox_prefix
        self._mux_prefix = "%s.%s." % (inbox_prefix, secrets.token_hex(8))
        self._mux_lock = threading.Lock()
        self._mux: Dict[str, Union[_Waiter, Callable[[Msg], None]]] = {}
        self._mux_n = 0
        self._reader = threading.Thread(target=self._read_loop, name="jetfabric-nats-reader", daemon=True)
        self._reader.start()
        self._mux_sub = self.subscribe(self._mux_prefix + ">", cb=self._mux_deliver)

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
                        sid = int(parts[2])
                        if hmsg:
                            headers, status = parse_headers(bytes(payload[:hlen]))
                            data = memoryview(payload)[hlen:] if type(payload) is bytearray else payload[hlen:]
                        else:
                            headers, status, data = {}, "", payload
                        sub = self._subs.get(sid)
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

    def subscribe(self, subject: str, cb: Optional[Callable[[Msg], None]] = None) -> Subscription:
        """Subscribes to subject; cb, when given, runs on the reader thread."""
        with self._slock:
            sid = self._next_sid
            self._next_sid += 1
            sub = Subscription(self, sid, subject, cb)
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

