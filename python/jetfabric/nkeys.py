"""NATS credentials in the standard library alone: creds files, nkey seeds
and Ed25519 signatures.

A creds file (as `jetfabric tenant add` and the nats tooling write it) holds
a user JWT and the user's nkey seed. On CONNECT the client sends the JWT and
its Ed25519 signature of the server's nonce, base64url without padding. The
standard library has no Ed25519, so sign() is RFC 8032's algorithm in plain
integers: slow (a few ms a signature) but needed once a connection.
"""

import base64
import binascii
import hashlib
import json
from typing import Tuple

__all__ = ["read_creds", "parse_creds", "seed_bytes", "sign", "sign_nonce", "jwt_claims"]

# -- Ed25519 (RFC 8032, section 5.1) ------------------------------------------

_P = 2 ** 255 - 19
_L = 2 ** 252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _recover_x(y: int, sign: int) -> int:
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P != 0:
        x = x * _SQRT_M1 % _P
    if (x & 1) != sign:
        x = _P - x
    return x


_GY = 4 * pow(5, _P - 2, _P) % _P
_GX = _recover_x(_GY, 0)
_G = (_GX, _GY, 1, _GX * _GY % _P)  # extended coordinates (X, Y, Z, T)


def _add(a, b):
    A = (a[1] - a[0]) * (b[1] - b[0]) % _P
    B = (a[1] + a[0]) * (b[1] + b[0]) % _P
    C = 2 * a[3] * b[3] * _D % _P
    D = 2 * a[2] * b[2] % _P
    E, F, G, H = B - A, D - C, D + C, B + A
    return (E * F % _P, G * H % _P, F * G % _P, E * H % _P)


def _mul(s: int, pt):
    q = (0, 1, 1, 0)
    while s > 0:
        if s & 1:
            q = _add(q, pt)
        pt = _add(pt, pt)
        s >>= 1
    return q


def _encode(pt) -> bytes:
    zi = pow(pt[2], _P - 2, _P)
    x, y = pt[0] * zi % _P, pt[1] * zi % _P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def public_key(seed: bytes) -> bytes:
    """The Ed25519 public key of a 32-byte seed."""
    h = hashlib.sha512(seed).digest()
    a = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
    return _encode(_mul(a, _G))


def sign(seed: bytes, msg: bytes) -> bytes:
    """The Ed25519 signature (64 bytes) of msg with a 32-byte seed."""
    if len(seed) != 32:
        raise ValueError("an Ed25519 seed is 32 bytes, got %d" % len(seed))
    h = hashlib.sha512(seed).digest()
    a = (int.from_bytes(h[:32], "little") & ((1 << 254) - 8)) | (1 << 254)
    pub = _encode(_mul(a, _G))
    r = int.from_bytes(hashlib.sha512(h[32:] + msg).digest(), "little") % _L
    R = _encode(_mul(r, _G))
    k = int.from_bytes(hashlib.sha512(R + pub + msg).digest(), "little") % _L
    return R + ((r + k * a) % _L).to_bytes(32, "little")


# -- nkeys and creds ----------------------------------------------------------

_PREFIX_SEED = 18 << 3  # 'S'
_PREFIX_USER = 20 << 3  # 'U'


def _crc16(data: bytes) -> int:
    return binascii.crc_hqx(data, 0)


def seed_bytes(seed: str) -> bytes:
    """The 32 raw bytes of a user nkey seed ("SU..."), its checksum checked."""
    s = seed.strip()
    try:
        raw = base64.b32decode(s + "=" * (-len(s) % 8))
    except (binascii.Error, ValueError):
        raise ValueError("not an nkey seed: bad base32") from None
    if len(raw) != 36:
        raise ValueError("not an nkey seed: %d bytes decoded, want 36" % len(raw))
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if _crc16(body) != crc:
        raise ValueError("not an nkey seed: bad checksum")
    if body[0] & 0xF8 != _PREFIX_SEED:
        raise ValueError("not an nkey seed: prefix %r" % s[:1])
    kind = ((body[0] & 7) << 5) | (body[1] >> 3)
    if kind != _PREFIX_USER:
        raise ValueError("not a user nkey seed (it is for another kind of key)")
    return bytes(body[2:34])


def parse_creds(text: str) -> Tuple[str, str]:
    """The user JWT and the nkey seed of a creds file's text."""
    jwt, seed = "", ""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith("-----BEGIN") and "JWT" in ln and i + 1 < len(lines):
            jwt = jwt or lines[i + 1]
        if ln.startswith("-----BEGIN") and "SEED" in ln and i + 1 < len(lines):
            seed = seed or lines[i + 1]
    if not jwt or not seed:
        raise ValueError("not a creds file: want a NATS USER JWT and a USER NKEY SEED block")
    return jwt, seed


def read_creds(path: str) -> Tuple[str, str]:
    """The user JWT and the nkey seed of the creds file at path."""
    with open(path, encoding="utf-8") as f:
        return parse_creds(f.read())


def sign_nonce(seed: str, nonce: str) -> str:
    """The CONNECT sig of a server's nonce: base64url without padding."""
    sig = sign(seed_bytes(seed), nonce.encode())
    return base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def jwt_claims(jwt: str) -> dict:
    """The claims of a JWT (not verified: the server does that)."""
    parts = jwt.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    body = parts[1] + "=" * (-len(parts[1]) % 4)
    return json.loads(base64.urlsafe_b64decode(body))
