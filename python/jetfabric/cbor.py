"""CBOR (RFC 8949) encoding and decoding of the values jetfabric's wire uses.

Encoded: None, bool, int (64-bit range), float (always as a 64-bit float),
str, bytes/bytearray/memoryview, list/tuple and dict. Decoded: every major
type with definite lengths, floats of 16, 32 and 64 bits, and tags (their
content is returned). Maps decode to dicts, byte strings to bytes.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["dumps", "loads", "CBORError"]


class CBORError(ValueError):
    """A value that cannot be encoded, or bytes that are not valid CBOR."""


_pack_d = struct.Struct(">Bd").pack


def _head(major: int, n: int, out: bytearray) -> None:
    m = major << 5
    if n < 24:
        out.append(m | n)
    elif n < 0x100:
        out += bytes((m | 24, n))
    elif n < 0x10000:
        out += struct.pack(">BH", m | 25, n)
    elif n < 0x100000000:
        out += struct.pack(">BI", m | 26, n)
    elif n < 0x10000000000000000:
        out += struct.pack(">BQ", m | 27, n)
    else:
        raise CBORError("integer %d does not fit in 64 bits" % n)


def _enc(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is str:
        b = v.encode("utf-8")
        _head(3, len(b), out)
        out += b
    elif t is int:
        if v >= 0:
            _head(0, v, out)
        else:
            _head(1, -1 - v, out)
    elif t is float:
        out += _pack_d(0xFB, v)
    elif t is bool:
        out.append(0xF5 if v else 0xF4)
    elif t is list or t is tuple:
        _head(4, len(v), out)
        for x in v:
            _enc(x, out)
    elif t is dict:
        _head(5, len(v), out)
        for k, x in v.items():
            _enc(k, out)
            _enc(x, out)
    elif t is bytes or t is bytearray or t is memoryview:
        n = v.nbytes if t is memoryview else len(v)
        _head(2, n, out)
        out += v
    elif v is None:
        out.append(0xF6)
    elif isinstance(v, bool):
        out.append(0xF5 if v else 0xF4)
    elif isinstance(v, int):
        _enc(int(v), out)
    elif isinstance(v, float):
        _enc(float(v), out)
    elif hasattr(v, "__index__"):
        _enc(v.__index__(), out)
    else:
        raise CBORError("cannot encode %s in CBOR" % t.__name__)


def dumps(v: Any) -> bytes:
    """Encodes v as CBOR."""
    out = bytearray()
    _enc(v, out)
    return bytes(out)


def _half(h: int) -> float:
    return struct.unpack("<e", struct.pack("<H", h))[0]


class _Decoder:
    __slots__ = ("b", "i", "depth")

    def __init__(self, b: bytes):
        self.b = b
        self.i = 0
        self.depth = 0

    def _arg(self, info: int) -> int:
        b, i = self.b, self.i
        if info < 24:
            return info
        if info == 24:
            if i + 1 > len(b):
                raise CBORError("truncated")
            self.i = i + 1
            return b[i]
        size = {25: 2, 26: 4, 27: 8}.get(info)
        if size is None:
            raise CBORError("indefinite or reserved length (additional info %d)" % info)
        if i + size > len(b):
            raise CBORError("truncated")
        self.i = i + size
        return int.from_bytes(b[i : i + size], "big")

    def value(self) -> Any:
        b = self.b
        if self.i >= len(b):
            raise CBORError("truncated")
        ib = b[self.i]
        self.i += 1
        major, info = ib >> 5, ib & 31
        if major == 0:
            return self._arg(info)
        if major == 1:
            return -1 - self._arg(info)
        if major == 2 or major == 3:
            n = self._arg(info)
            s = self.i
            if s + n > len(b):
                raise CBORError("truncated string")
            self.i = s + n
            if major == 2:
                return bytes(b[s : s + n])
            return bytes(b[s : s + n]).decode("utf-8")
        if major == 4 or major == 5:
            n = self._arg(info)
            self.depth += 1
            if self.depth > 64:
                raise CBORError("nested too deep")
            if major == 4:
                v: Any = [self.value() for _ in range(n)]
            else:
                v = {}
                for _ in range(n):
                    k = self.value()
                    v[k] = self.value()
            self.depth -= 1
            return v
        if major == 6:
            self._arg(info)
            return self.value()
        # major 7
        if info == 20:
            return False
        if info == 21:
            return True
        if info == 22 or info == 23:
            return None
        i = self.i
        if info == 25:
            self.i = i + 2
            return _half(int.from_bytes(b[i : i + 2], "big"))
        if info == 26:
            self.i = i + 4
            return struct.unpack(">f", b[i : i + 4])[0]
        if info == 27:
            self.i = i + 8
            return struct.unpack(">d", b[i : i + 8])[0]
        if info < 20:
            return info
        if info == 24:
            return self._arg(24)
        raise CBORError("unsupported simple value %d" % info)


def loads(b: bytes) -> Any:
    """Decodes one CBOR value that fills b."""
    d = _Decoder(b)
    v = d.value()
    if d.i != len(b):
        raise CBORError("%d trailing bytes after the CBOR value" % (len(b) - d.i))
    return v
