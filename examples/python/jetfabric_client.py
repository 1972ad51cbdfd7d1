#!/usr/bin/env python3
"""A jetfabric client in Python 3 using only the standard library.

It speaks the NATS client protocol itself over a TCP socket (INFO, CONNECT,
PUB, HPUB, SUB, MSG, HMSG, PING, PONG), publishes op frames to JetStream as
JSON and waits for each frame's stream acknowledgement, reads the device
registry from the FABRIC_CTRL key-value bucket through the JetStream API,
and checks what the fabric computes against a pure-Python reference.

    python3 jetfabric_client.py --url nats://127.0.0.1:4222 [--device cpu-0]

It lists the devices, opens a session on a live one, uploads two matrices,
multiplies them, reads the product and compares it with a Python matmul,
then sends an unknown op and checks that the error names it. It exits 0 when
every check passes and 1, with the reason on stderr, otherwise.

The wire protocol is written out in docs/PROTOCOL.md.
"""

import argparse
import base64
import calendar
import json
import secrets
import socket
import struct
import sys
import time
import urllib.parse

PROTOCOL_VERSION = 1
LIVE_SECONDS = 10.0  # a device whose last heartbeat is older is not live


class FabricError(Exception):
    """A failure talking to NATS or the fabric, or a failed check."""


# ---------------------------------------------------------------------------
# NATS client protocol


class NatsConn:
    """A minimal NATS connection: one socket, read synchronously.

    Messages for subscriptions arrive through next_msg; PINGs from the server
    are answered while reading. Not safe for use from several threads.
    """

    def __init__(self, url, name="jetfabric-python", timeout=10.0):
        u = urllib.parse.urlsplit(url if "://" in url else "nats://" + url)
        if u.scheme not in ("nats", "tcp"):
            raise FabricError("unsupported URL scheme %r (want nats://host:port)" % u.scheme)
        host, port = u.hostname or "127.0.0.1", u.port or 4222
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise FabricError("connect %s:%d: %s" % (host, port, e)) from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.next_sid = 1
        self.pending = []  # messages read while waiting for something else
        line = self._read_line(timeout)
        if not line.startswith(b"INFO "):
            raise FabricError("expected INFO from the server, got %r" % line[:80])
        self.info = json.loads(line[5:])
        if not self.info.get("headers"):
            raise FabricError("the server does not support message headers (NATS 2.2 or later needed)")
        connect = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": True,
            "protocol": 1,
            "name": name,
            "lang": "python-stdlib",
            "version": "1",
        }
        if u.username:
            connect["user"] = urllib.parse.unquote(u.username)
            connect["pass"] = urllib.parse.unquote(u.password or "")
        self._send(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
        # The server answers PONG once CONNECT is accepted, or -ERR.
        while True:
            line = self._read_line(timeout)
            if line == b"PONG":
                break
            if line.startswith(b"-ERR"):
                raise FabricError("server refused CONNECT: %s" % line[5:].decode(errors="replace"))
            if line.startswith(b"INFO ") or line == b"+OK":
                continue
            if line == b"PING":
                self._send(b"PONG\r\n")
                continue
            raise FabricError("unexpected %r during CONNECT" % line[:80])

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _send(self, data):
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise FabricError("send: %s" % e) from None

    def _fill(self, deadline):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout()
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise FabricError("the server closed the connection")
        self.buf += chunk

    def _read_line(self, timeout, deadline=None):
        if deadline is None:
            deadline = time.monotonic() + timeout
        while b"\r\n" not in self.buf:
            self._fill(deadline)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read_exact(self, n, deadline):
        while len(self.buf) < n + 2:
            self._fill(deadline)
        data, self.buf = self.buf[:n], self.buf[n + 2 :]  # payload, then CRLF
        return data

    def subscribe(self, subject):
        sid = str(self.next_sid)
        self.next_sid += 1
        self._send(("SUB %s %s\r\n" % (subject, sid)).encode())
        return sid

    def unsubscribe(self, sid):
        self._send(("UNSUB %s\r\n" % sid).encode())

    def publish(self, subject, payload, reply=None, headers=None):
        """PUB, or HPUB when headers (a list of (name, value)) are given."""
        if isinstance(payload, str):
            payload = payload.encode()
        rep = (" " + reply) if reply else ""
        if headers:
            hdr = "NATS/1.0\r\n" + "".join("%s: %s\r\n" % (k, v) for k, v in headers) + "\r\n"
            hdr = hdr.encode()
            cmd = "HPUB %s%s %d %d\r\n" % (subject, rep, len(hdr), len(hdr) + len(payload))
            self._send(cmd.encode() + hdr + payload + b"\r\n")
        else:
            cmd = "PUB %s%s %d\r\n" % (subject, rep, len(payload))
            self._send(cmd.encode() + payload + b"\r\n")

    def flush(self, timeout=5.0):
        """PING and wait for PONG: the server has processed everything sent."""
        self._send(b"PING\r\n")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_one(deadline)
            if m == "PONG":
                return
            if m is not None:
                self.pending.append(m)

    def next_msg(self, timeout, match=None):
        """The next message (subject, reply, headers, status, data) for which
        match(msg) is true; others are kept for later calls."""
        for i, m in enumerate(self.pending):
            if match is None or match(m):
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            try:
                m = self._read_one(deadline)
            except socket.timeout:
                raise FabricError("timed out after %.1fs waiting for a message" % timeout) from None
            if m is None or m == "PONG":
                continue
            if match is None or match(m):
                return m
            self.pending.append(m)

    def _read_one(self, deadline):
        """Reads one protocol line; returns a message tuple, "PONG" or None."""
        line = self._read_line(0, deadline)
        if line.startswith(b"MSG "):
            parts = line.decode().split(" ")
            subject, reply = parts[1], (parts[3] if len(parts) == 5 else None)
            data = self._read_exact(int(parts[-1]), deadline)
            return (subject, reply, {}, None, data)
        if line.startswith(b"HMSG "):
            parts = line.decode().split(" ")
            subject, reply = parts[1], (parts[3] if len(parts) == 6 else None)
            hlen, total = int(parts[-2]), int(parts[-1])
            raw = self._read_exact(total, deadline)
            headers, status = parse_headers(raw[:hlen])
            return (subject, reply, headers, status, raw[hlen:])
        if line == b"PING":
            self._send(b"PONG\r\n")
            return None
        if line == b"PONG":
            return "PONG"
        if line.startswith(b"-ERR"):
            raise FabricError("server error: %s" % line[5:].decode(errors="replace"))
        return None  # +OK, INFO updates

    def request(self, subject, payload, timeout=5.0, headers=None):
        """Publishes with a fresh inbox as reply subject and waits for the answer."""
        inbox = "_INBOX_fabric." + secrets.token_hex(8)
        sid = self.subscribe(inbox)
        try:
            self.publish(subject, payload, reply=inbox, headers=headers)
            m = self.next_msg(timeout, lambda m: m[0] == inbox)
        finally:
            self.unsubscribe(sid)
        if m[3] and m[3].startswith("503"):
            raise FabricError("no responders on %s (is JetStream enabled, and does a stream capture it?)" % subject)
        return m


def parse_headers(raw):
    """Splits a NATS/1.0 header block into ({name: value}, status or None)."""
    lines = raw.decode(errors="replace").split("\r\n")
    first = lines[0]
    if not first.startswith("NATS/1.0"):
        raise FabricError("malformed header block %r" % first[:40])
    status = first[len("NATS/1.0") :].strip() or None
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip()] = v.strip()
    return headers, status


# ---------------------------------------------------------------------------
# jetfabric


class Fabric:
    """The fabric's names (docs/PROTOCOL.md section 1) and JetStream calls."""

    def __init__(self, nc, prefix="fabric"):
        self.nc = nc
        self.prefix = prefix
        upper = prefix.upper().replace("-", "_")
        self.ops_stream = upper + "_OPS"
        self.ctrl_bucket = upper + "_CTRL"
        self.xfer_bucket = upper + "_XFER"

    def js_api(self, call, request):
        """Calls $JS.API.<call> with a JSON request and returns the reply,
        raising FabricError on a JetStream API error."""
        _, _, _, _, data = self.nc.request("$JS.API." + call, json.dumps(request))
        reply = json.loads(data)
        if "error" in reply:
            e = reply["error"]
            raise FabricError("JetStream %s: %s (code %s, err_code %s)" % (call, e.get("description"), e.get("code"), e.get("err_code")))
        return reply

    def devices(self):
        """Every device.* entry of the FABRIC_CTRL bucket, sorted by name.

        A key-value bucket is the stream KV_<bucket>; a key is the subject
        $KV.<bucket>.<key>. The stream info with a subjects filter lists the
        keys; a message get by last subject reads each one's latest value.
        """
        stream = "KV_" + self.ctrl_bucket
        prefix = "$KV.%s." % self.ctrl_bucket
        info = self.js_api("STREAM.INFO." + stream, {"subjects_filter": prefix + "device.>"})
        devs = []
        for subject in sorted((info.get("state") or {}).get("subjects") or {}):
            try:
                got = self.js_api("STREAM.MSG.GET." + stream, {"last_by_subj": subject})
            except FabricError as e:
                if "no message found" in str(e):
                    continue  # purged meanwhile
                raise
            msg = got["message"]
            if msg.get("hdrs"):
                headers, _ = parse_headers(base64.b64decode(msg["hdrs"]))
                if headers.get("KV-Operation") in ("DEL", "PURGE"):
                    continue  # deleted key
            devs.append(json.loads(base64.b64decode(msg.get("data") or "")))
        return devs

    def publish_frame(self, device, session, frame, reply_inbox):
        """Publishes one JSON frame through JetStream and returns its stream
        sequence. The stream's refusal (a frame too large, no stream for the
        subject, ...) becomes a FabricError."""
        subject = "%s.ops.%s.%s" % (self.prefix, device, session)
        headers = [("Content-Type", "application/json"), ("Fabric-Reply", reply_inbox)]
        _, _, _, _, data = self.nc.request(subject, json.dumps(frame, separators=(",", ":")), headers=headers)
        ack = json.loads(data)
        if "error" in ack:
            e = ack["error"]
            raise FabricError("frame to %s refused by JetStream: %s (code %s)" % (subject, e.get("description"), e.get("code")))
        if ack.get("stream") != self.ops_stream:
            raise FabricError("frame to %s stored in stream %r, expected %s" % (subject, ack.get("stream"), self.ops_stream))
        return ack["seq"]


class Session:
    """One session on one device: a random token, its own tensor ids."""

    def __init__(self, fabric, device):
        self.f = fabric
        self.device = device
        self.token = secrets.token_hex(16)  # 128 random bits: unguessable
        self.inbox = "_INBOX_%s.%s" % (fabric.prefix, self.token)
        self.sid = fabric.nc.subscribe(self.inbox)
        fabric.nc.flush()
        self.next_id = 0
        self.next_tag = 0

    def new_id(self):
        self.next_id += 1
        return self.next_id

    def new_tag(self):
        self.next_tag += 1
        return self.next_tag

    def send(self, ops):
        return self.f.publish_frame(self.device, self.token, {"v": PROTOCOL_VERSION, "ops": ops}, self.inbox)

    def result(self, tag, timeout=10.0):
        """Waits for the result with tag on the session's inbox."""

        def mine(m):
            return m[0] == self.inbox and json.loads(m[4]).get("tag", 0) in (tag, 0)

        _, _, headers, _, data = self.f.nc.next_msg(timeout, mine)
        if headers.get("Content-Type") != "application/json":
            raise FabricError("result in %r, expected application/json" % headers.get("Content-Type"))
        return json.loads(data)

    def close(self):
        tag = self.new_tag()
        self.send([{"op": "close", "tag": tag}])
        r = self.result(tag)
        self.f.nc.unsubscribe(self.sid)
        return r


def decode_tensor(t):
    """The elements of a result tensor, decoded from its little-endian bytes."""
    fmt = {"f32": "f", "f64": "d", "i32": "i", "i64": "q", "u8": "B", "bool": "?"}.get(t["dtype"])
    if fmt is None:
        raise FabricError("decode of dtype %s not implemented here" % t["dtype"])
    if "object" in t:
        raise FabricError("result travelled through the object store (%s); not handled here" % t["object"])
    data = base64.b64decode(t.get("data") or "")
    n = len(data) // struct.calcsize(fmt)
    return list(struct.unpack("<%d%s" % (n, fmt), data))


def matmul(a, b, n, k, m):
    """Row-major n x k times k x m, in Python floats."""
    return [sum(a[i * k + j] * b[j * m + c] for j in range(k)) for i in range(n) for c in range(m)]


def check(cond, what):
    if not cond:
        raise FabricError("check failed: " + what)


def run(args):
    nc = NatsConn(args.url)
    try:
        f = Fabric(nc, args.prefix)
        print("connected to %s (server %s %s, max payload %d)" % (args.url, nc.info.get("server_name"), nc.info.get("version"), nc.info.get("max_payload")))

        devs = f.devices()
        now = time.time()
        live = []
        for d in devs:
            age = now - parse_time(d["beat"])
            ok = d.get("state") == "serving" and age < LIVE_SECONDS
            if ok:
                live.append(d["name"])
            print("device %-8s %-4s backend=%-5s state=%-8s sessions=%d applied=%d worker=%s beat %.1fs ago%s" % (
                d["name"], d.get("kind"), d.get("backend"), d.get("state"), d.get("sessions", 0), d.get("applied", 0),
                d.get("worker"), age, "" if ok else " (not live)"))
        device = args.device or (live[0] if live else None)
        if device is None:
            raise FabricError("no live device registered in %s: start a worker" % f.ctrl_bucket)
        if device not in live:
            raise FabricError("device %s is not live (live: %s)" % (device, ", ".join(live) or "none"))

        s = Session(f, device)
        print("session %s on %s" % (s.token, device))

        # Two matrices of small random integers, exact in f32.
        n, k, m = 3, 4, 2
        a = [float(secrets.randbelow(19) - 9) for _ in range(n * k)]
        b = [float(secrets.randbelow(19) - 9) for _ in range(k * m)]
        ia, ib, ic, tag = s.new_id(), s.new_id(), s.new_id(), s.new_tag()
        seq = s.send([
            {"op": "upload", "out": [ia], "dtype": "f32", "shape": [n, k], "values": a},
            {"op": "upload", "out": [ib], "dtype": "f32", "shape": [k, m], "values": b},
            {"op": "matmul", "out": [ic], "in": [ia, ib]},
            {"op": "read", "in": [ic], "tag": tag},
        ])
        print("frame stored at %s sequence %d" % (f.ops_stream, seq))
        r = s.result(tag)
        check(not r.get("errors"), "matmul read reported errors: %s" % r.get("errors"))
        check(r.get("seq") == seq and r.get("index") == 3, "result names op (%s, %s), sent (%d, 3)" % (r.get("seq"), r.get("index"), seq))
        t = r.get("tensor") or {}
        check(t.get("dtype") == "f32" and t.get("shape") == [n, m], "result is %s %s, want f32 [%d, %d]" % (t.get("dtype"), t.get("shape"), n, m))
        got, want = decode_tensor(t), matmul(a, b, n, k, m)
        check(got == want, "matmul bytes %s, Python computes %s" % (got, want))
        check(t.get("values") == want, "matmul values %s, Python computes %s" % (t.get("values"), want))
        print("matmul %dx%d @ %dx%d = %s: matches Python" % (n, k, k, m, got))

        # An unknown op: an error that names the op, reported on the next sync.
        bad, tag = s.new_id(), s.new_tag()
        seq = s.send([
            {"op": "frobnicate", "out": [bad], "in": [ic]},
            {"op": "sync", "tag": tag},
        ])
        r = s.result(tag)
        errs = r.get("errors") or []
        check(len(errs) == 1, "sync after a bad op returned errors %s, want one" % errs)
        e = errs[0]
        check(e.get("op") == "frobnicate" and e.get("code") == "unknown_op" and "frobnicate" in e.get("message", ""),
              "error %s does not name op frobnicate with code unknown_op" % e)
        check(e.get("seq") == seq and e.get("index", 0) == 0, "error names op (%s, %s), sent (%d, 0)" % (e.get("seq"), e.get("index"), seq))
        print("bad op rejected: %s: %s" % (e["code"], e["message"]))

        r = s.close()
        check(not r.get("errors"), "close reported errors: %s" % r.get("errors"))
        print("session closed; all checks passed")
    finally:
        nc.close()


def parse_time(s):
    """Seconds since the epoch of an RFC 3339 time in UTC, as the worker
    writes it: 2026-11-21T07:00:00.123456789Z."""
    clock, frac = s.rstrip("Z"), "0"
    if "." in clock:
        clock, frac = clock.split(".", 1)
    return calendar.timegm(time.strptime(clock, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="nats://127.0.0.1:4222", help="NATS URL, nats://[user:password@]host:port")
    p.add_argument("--device", default="", help="device to use (default: the first live one)")
    p.add_argument("--prefix", default="fabric", help="the fabric's subject prefix")
    args = p.parse_args(argv)
    try:
        run(args)
    except FabricError as e:
        print("jetfabric_client: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
