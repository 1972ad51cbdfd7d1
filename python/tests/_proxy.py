"""A TCP proxy between NATS clients and a real NATS server that can lose
what the server sends, for the tests of what a client does when an
acknowledgement or an answer is lost: whole messages to chosen subjects
(drop), optionally cutting the connection at that moment (as a broker
that dies with the answer in flight does), or every connection at once
(cut). Everything else passes through unchanged, and what went each way
is kept for the tests to look at."""

import re
import socket
import threading
from typing import List, Optional, Tuple, Union


class Proxy:
    """Listens on 127.0.0.1 (url) and forwards each connection to upstream
    (host, port)."""

    def __init__(self, upstream: Tuple[str, int]):
        self.upstream = upstream
        self._ls = socket.socket()
        self._ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._ls.bind(("127.0.0.1", 0))
        self._ls.listen(16)
        self.url = "nats://127.0.0.1:%d" % self._ls.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: List[Tuple[socket.socket, socket.socket]] = []
        self._frozen: List[Tuple[socket.socket, socket.socket]] = []
        # [subject prefix, messages left to drop, cut the connection after]
        self._drops: List[list] = []
        self.dropped = 0
        self.connections = 0
        self.sent = bytearray()  # client to server
        self.received = bytearray()  # server to client, as forwarded
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def drop(self, prefix: Union[str, "re.Pattern[bytes]"], count: int = 1, cut: bool = False) -> None:
        """Drops the next count messages from the server to a subject that
        starts with prefix (or that a compiled bytes pattern matches); with
        cut, closes that connection right after."""
        with self._lock:
            self._drops.append([prefix.encode() if isinstance(prefix, str) else prefix, count, cut])

    def freeze(self) -> None:
        """From now on the connections open through the proxy carry nothing
        either way, and stay open: a host gone without a word."""
        with self._lock:
            self._frozen.extend(self._pairs)

    def cut(self) -> None:
        """Closes every connection through the proxy (new ones are accepted)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        """Stops accepting and cuts every connection."""
        self._closed = True
        try:
            self._ls.close()
        except OSError:
            pass
        self.cut()

    def sent_count(self, text: str) -> int:
        with self._lock:
            return self.sent.count(text.encode())

    def received_matches(self, pattern: str) -> int:
        """How many times the regular expression pattern matches what the server sent."""
        with self._lock:
            return len(re.findall(pattern.encode(), bytes(self.received)))

    def _accept(self) -> None:
        while not self._closed:
            try:
                c, _ = self._ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                c.close()
                continue
            u.settimeout(None)
            with self._lock:
                self._pairs.append((c, u))
                self.connections += 1
            threading.Thread(target=self._up, args=(c, u), name="proxy-up", daemon=True).start()
            threading.Thread(target=self._down, args=(c, u), name="proxy-down", daemon=True).start()

    def _up(self, c: socket.socket, u: socket.socket) -> None:
        try:
            while True:
                data = c.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    if (c, u) in self._frozen:
                        continue
                    self.sent += data
                u.sendall(data)
        except OSError:
            pass
        self._end(c, u)

    def _rule(self, subject: bytes) -> Optional[list]:
        with self._lock:
            for r in self._drops:
                if r[1] > 0 and (subject.startswith(r[0]) if isinstance(r[0], bytes) else r[0].match(subject)):
                    r[1] -= 1
                    self.dropped += 1
                    return r
        return None

    def _down(self, c: socket.socket, u: socket.socket) -> None:
        buf = bytearray()
        try:
            while True:
                data = u.recv(1 << 16)
                if not data:
                    break
                with self._lock:
                    if (c, u) in self._frozen:
                        continue
                buf += data
                out = bytearray()
                cut = False
                while True:
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    line = bytes(buf[:i])
                    if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                        total = int(line.split()[-1])
                        end = i + 2 + total + 2
                        if len(buf) < end:
                            break
                        r = self._rule(line.split()[1])
                        if r is None:
                            out += buf[:end]
                        elif r[2]:
                            cut = True
                        del buf[:end]
                        if cut:
                            break
                        continue
                    out += buf[: i + 2]
                    del buf[: i + 2]
                if out:
                    with self._lock:
                        self.received += out
                    c.sendall(out)
                if cut:
                    break
        except OSError:
            pass
        self._end(c, u)

    def _end(self, c: socket.socket, u: socket.socket) -> None:
        with self._lock:
            if (c, u) in self._pairs:
                self._pairs.remove((c, u))
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
