"""CBOR (RFC 8949) encoding and decoding of the values jetfabric's wire uses.

Encoded: None, bool, int (64-bit range), float (always as a 64-bit float),
str, bytes/bytearray/memoryview, list/tuple and dict. Decoded: every major
type with definite lengths, floats of 16, 32 and 64 bits, and tags (their
content is returned). Maps decode to dicts, byte strings to bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Tuple, Union

__all__ = ["dumps", "dumps_canonical", "loads", "CBORError"]


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
            # Small integers (tensor ids, shapes) without a call.
            if type(x) is int and 0 <= x < 24:
                out.append(x)
            else:
                _enc(x, out)
    elif t is dict:
        n = len(v)
        if n < 24:
            out.append(0xA0 | n)
        else:
            _head(5, n, out)
        for k, x in v.items():
            # Keys met before (cached) and small integer values without a call.
            e = _str_cache.get(k)
            if e is None:
                _enc(k, out)
            else:
                out += e
            if type(x) is int and 0 <= x < 24:
                out.append(x)
            else:
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


def _float_canonical(v: float, out: bytearray) -> None:
    """The shortest of binary16, 32 and 64 that holds v exactly; NaN as
    0xf97e00 and the infinities as binary16 (RFC 8949 §4.2.2, as Go's
    fxamacker/cbor writes them in its core deterministic mode)."""
    if v != v:
        out += b"\xf9\x7e\x00"
        return
    try:
        h = struct.pack(">e", v)
        if struct.unpack(">e", h)[0] == v:
            out.append(0xF9)
            out += h
            return
    except OverflowError:
        pass
    try:
        f = struct.pack(">f", v)
        if struct.unpack(">f", f)[0] == v:
            out.append(0xFA)
            out += f
            return
    except OverflowError:
        pass
    out += _pack_d(0xFB, v)


def _enc_canonical(v: Any, out: bytearray) -> None:
    t = type(v)
    if t is dict:
        items = []
        for k, x in v.items():
            kb = bytearray()
            _enc_canonical(k, kb)
            items.append((bytes(kb), x))
        items.sort(key=lambda kv: kv[0])
        _head(5, len(items), out)
        for kb, x in items:
            out += kb
            _enc_canonical(x, out)
    elif t is list or t is tuple:
        _head(4, len(v), out)
        for x in v:
            _enc_canonical(x, out)
    elif t is float:
        _float_canonical(v, out)
    elif t is int:
        _enc(v, out)
    elif isinstance(v, float) and t is not bool:
        _float_canonical(float(v), out)
    else:
        _enc(v, out)


def dumps_canonical(v: Any) -> bytes:
    """Encodes v in CBOR's core deterministic encoding (RFC 8949 §4.2.1):
    map keys sorted by their encoded bytes, every length and integer in its
    shortest form, floats in the shortest of 16, 32 and 64 bits that holds
    them exactly. The same value always gives the same bytes, so a graph
    definition has one name."""
    out = bytearray()
    _enc_canonical(v, out)
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


_keys: Dict[bytes, str] = {}  # encoded short text strings (map keys) and their values


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
                # Keys are short text strings, values often small integers:
                # both are taken here without a call (a result decodes in
                # half the time).
                kb = b[i] if i < len(b) else -1
                if 0x60 <= kb < 0x78:
                    j = i + 1 + kb - 0x60
                    k = _keys.get(b[i:j])
                    if k is None:
                        if j > len(b):
                            raise CBORError("truncated string")
                        try:
                            k = b[i + 1 : j].decode("utf-8")
                        except UnicodeDecodeError:
                            raise CBORError("invalid UTF-8 in a text string") from None
                        if len(_keys) < 1024:
                            _keys[b[i:j]] = k
                    i = j
                else:
                    k, i = _dec(b, i, depth + 1)
                vb = b[i] if i < len(b) else 0xFF
                if vb < 24:
                    try:
                        m[k] = vb
                    except TypeError:
                        raise CBORError("a map key of type %s" % type(k).__name__) from None
                    i += 1
                    continue
                try:
                    m[k], i = _dec(b, i, depth + 1)
                except TypeError:
                    raise CBORError("a map key of type %s" % type(k).__name__) from None
            return m, i
        a = []
        for _ in range(n):
            vb = b[i] if i < len(b) else 0xFF
            if vb < 24:
                a.append(vb)
                i += 1
                continue
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
