"""CBOR (RFC 8949) encoding and decoding of the values jetfabric's wire uses.

Encoded: None, bool, int (64-bit range), float (always as a 64-bit float),
str, bytes/bytearray/memoryview, list/tuple and dict. Decoded: every major
type with definite lengths, floats of 16, 32 and 64 bits, and tags (their
content is returned). Maps decode to dicts, byte strings to bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Tuple, Union

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


_str_cache: Dict[str, bytes] = {}


def _enc(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is str:
        e = _str_cache.get(v)
        if e is None:
            b = v.encode("utf-8")
            h = bytearray()
            _head(3, len(b), h)
            e = bytes(h) + b
            if len(_str_cache) < 4096 and len(e) <= 32:
                _str_cache[v] = e
        out += e
    elif t is int:
        if 0 <= v < 24:
            out.append(v)
        elif v >= 0:
            _head(0, v, out)
        else:
            _head(1, -1 - v, out)
    elif t is list or t is tuple:
        n = len(v)
        if n < 24:
            out.append(0x80 | n)
        else:
            _head(4, n, out)
        for x in v:
            _enc(x, out)
    elif t is dict:
        n = len(v)
        if n < 24:
            out.append(0xA0 | n)
        else:
            _head(5, n, out)
        for k, x in v.items():
            _enc(k, out)
            _enc(x, out)
    elif t is float:
        out += _pack_d(0xFB, v)
    elif t is bool:
        out.append(0xF5 if v else 0xF4)
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


_unpack_e = struct.Struct(">e").unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_unpack_H = struct.Struct(">H").unpack_from
_unpack_I = struct.Struct(">I").unpack_from
_unpack_Q = struct.Struct(">Q").unpack_from


def _arg(b: bytes, i: int, info: int) -> Tuple[int, int]:
    """The argument of a head whose additional info is info, read at i."""
    try:
        if info < 24:
            return info, i
        if info == 24:
            return b[i], i + 1
        if info == 25:
            return _unpack_H(b, i)[0], i + 2
        if info == 26:
            return _unpack_I(b, i)[0], i + 4
        if info == 27:
            return _unpack_Q(b, i)[0], i + 8
    except (IndexError, struct.error):
        raise CBORError("truncated") from None
    raise CBORError("indefinite or reserved length (additional info %d)" % info)


def _dec(b: bytes, i: int, depth: int) -> Tuple[Any, int]:
    try:
        ib = b[i]
    except IndexError:
        raise CBORError("truncated") from None
    i += 1
    major, info = ib >> 5, ib & 31
    if major == 3 or major == 2:
        n, i = _arg(b, i, info) if info >= 24 else (info, i)
        j = i + n
        if j > len(b):
            raise CBORError("truncated string")
        if major == 3:
            try:
                return b[i:j].decode("utf-8"), j
            except UnicodeDecodeError:
                raise CBORError("invalid UTF-8 in a text string") from None
        return b[i:j], j
    if major == 0:
        return _arg(b, i, info) if info >= 24 else (info, i)
    if major == 5 or major == 4:
        n, i = _arg(b, i, info) if info >= 24 else (info, i)
        if depth > 64:
            raise CBORError("nested too deep")
        if n > len(b) - i:
            raise CBORError("truncated")
        if major == 5:
            m = {}
            for _ in range(n):
                k, i = _dec(b, i, depth + 1)
                try:
                    m[k], i = _dec(b, i, depth + 1)
                except TypeError:
                    raise CBORError("a map key of type %s" % type(k).__name__) from None
            return m, i
        a = []
        for _ in range(n):
            v, i = _dec(b, i, depth + 1)
            a.append(v)
        return a, i
    if major == 1:
        n, i = _arg(b, i, info) if info >= 24 else (info, i)
        return -1 - n, i
    if major == 6:
        _, i = _arg(b, i, info) if info >= 24 else (info, i)
        return _dec(b, i, depth + 1)
    # major 7
    try:
        if info == 27:
            return _unpack_d(b, i)[0], i + 8
        if info == 26:
            return _unpack_f(b, i)[0], i + 4
        if info == 25:
            return _unpack_e(b, i)[0], i + 2
    except struct.error:
        raise CBORError("truncated") from None
    if info == 20:
        return False, i
    if info == 21:
        return True, i
    if info == 22 or info == 23:
        return None, i
    if info < 20:
        return info, i
    if info == 24:
        return _arg(b, i, 24)
    raise CBORError("unsupported simple value %d" % info)


def loads(b: Union[bytes, bytearray, memoryview]) -> Any:
    """Decodes one CBOR value that fills b."""
    if not isinstance(b, bytes):
        b = bytes(b)
    v, i = _dec(b, 0, 0)
    if i != len(b):
        raise CBORError("%d trailing bytes after the CBOR value" % (len(b) - i))
    return v
