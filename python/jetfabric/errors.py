"""The exceptions of the jetfabric package.

FabricError is the root. OpError is a failed op as the worker reports it,
carrying the wire error code (docs/PROTOCOL.md §5), the op's name and its
identity (frame sequence, index); each code has its own subclass, so
``except jetfabric.ShapeError`` catches shape mismatches only.
"""

from __future__ import annotations

import builtins
from typing import Dict, List, Optional, Type

__all__ = [
    "FabricError", "ConnectionClosedError", "TLSError", "TimeoutError", "NoRespondersError", "MaxPayloadError",
    "FabricUnavailableError", "DisconnectedError", "NoLeaderError", "NoQuorumError", "NoDeviceError",
    "JetStreamError", "ObjectStoreError", "OpError", "error_class",
    "MalformedError", "VersionError", "UnknownOpError", "ArityError", "ShapeError", "DTypeError",
    "AttrError", "UnknownIDError", "FailedIDError", "DuplicateError", "TooLargeError", "LimitError",
    "UnavailableError", "InternalError", "ResourceExhaustedError", "SessionFreedError", "UnknownGraphError",
    "InvalidGraphError",
]


class FabricError(Exception):
    """Every error this package raises."""


class ConnectionClosedError(FabricError):
    """The connection to the broker could not be made or was lost."""


class TLSError(ConnectionClosedError):
    """A TLS connection could not be made, or TLS is required and was
    refused; the message says why and which argument fixes it (tls_ca,
    tls_cert and tls_key, tls)."""


class TimeoutError(FabricError, builtins.TimeoutError):
    """An answer did not come in time."""


class NoRespondersError(FabricError):
    """Nothing subscribes to a subject (for a frame: no stream captures it)."""


class MaxPayloadError(FabricError):
    """A message is over the broker's max_payload; it was not sent."""


class FabricUnavailableError(FabricError):
    """The fabric cannot serve a call for now: no connection to a broker,
    no leader for the op stream, or a cluster without its quorum. A read,
    sync or close raises it once the fabric has not answered for the
    fail-fast time (Fabric's fail_fast); its frame goes on being published
    in the background, and the session carries on when the fabric is back.
    The subclass and the message say which cause and what to do."""


class DisconnectedError(FabricUnavailableError, ConnectionClosedError):
    """The connection to the broker is lost and the client is reconnecting
    (to the URL it was given, or any of several). Raised by a call made
    while it is down and by a request whose answer was lost with it; once
    the client gives up (the connection's reconnect_time), calls raise a
    plain ConnectionClosedError saying so."""


class NoLeaderError(FabricUnavailableError):
    """The op stream did not answer: its leader's node is down and no other
    has taken over yet (a cluster electing a leader), or JetStream is
    starting."""


class NoQuorumError(FabricUnavailableError):
    """JetStream itself has no leader, or the op stream's leader cannot
    store: a majority of the cluster's nodes is down or cut off."""


class NoDeviceError(FabricError):
    """The device is not registered or not serving: Fabric.session found no
    live registry entry for it (serving, with a recent heartbeat), or no
    worker has served a session's device for the fabric's device timeout
    while a read, sync or close waited (the Go client's ErrNoDevice)."""


class JetStreamError(FabricError):
    """JetStream refused a publish or an API request.

    code is the HTTP-like status (400, 404, 503, ...), err_code the
    JetStream error code (10054: message size exceeds maximum allowed)."""

    def __init__(self, message: str, code: int, err_code: int, description: str):
        super().__init__(message)
        self.code = code
        self.err_code = err_code
        self.description = description


class ObjectStoreError(FabricError):
    """An object is missing, was aborted by its writer, or does not match its digest."""


class OpError(FabricError):
    """An op failed on the worker.

    code is the wire error code ("shape", "dtype", ...), op the op's name
    ("" for a frame that could not be decoded), seq and index the op's
    identity (the frame's stream sequence and the op's place in it), and
    message the worker's reason. errors lists every error reported with
    this one (the first is this one)."""

    code = ""

    def __init__(self, err: dict, errors: Optional[List["OpError"]] = None):
        self.code = err.get("code", "") or type(self).code
        self.op = err.get("op", "") or ""
        self.seq = int(err.get("seq", 0) or 0)
        self.index = int(err.get("index", 0) or 0)
        self.message = err.get("message", "") or ""
        self.errors: List[OpError] = errors if errors is not None else [self]
        what = "op %s" % self.op if self.op else "frame"
        text = "%s (frame %d, op %d): %s: %s" % (what, self.seq, self.index, self.code, self.message)
        if len(self.errors) > 1:
            text += " (and %d more error%s)" % (len(self.errors) - 1, "s" if len(self.errors) > 2 else "")
        super().__init__(text)


def _code(name: str, code: str, doc: str) -> Type[OpError]:
    return type(name, (OpError,), {"code": code, "__doc__": doc})


MalformedError = _code("MalformedError", "malformed", "The frame could not be decoded.")
VersionError = _code("VersionError", "version", "Unsupported protocol version.")
UnknownOpError = _code("UnknownOpError", "unknown_op", "The op is not in the op set.")
ArityError = _code("ArityError", "arity", "Wrong number of inputs or outputs.")
ShapeError = _code("ShapeError", "shape", "Shapes do not fit, or an index is out of range.")
DTypeError = _code("DTypeError", "dtype", "A dtype the op does not accept.")
AttrError = _code("AttrError", "attr", "An attribute is missing or out of range.")
UnknownIDError = _code("UnknownIDError", "unknown_id", "An input was never created in the session, or freed.")
FailedIDError = _code("FailedIDError", "failed_id", "An input was produced by a failed op.")
DuplicateError = _code("DuplicateError", "duplicate", "An output id is already in use.")
TooLargeError = _code("TooLargeError", "too_large", "Over the rank or element limit.")
LimitError = _code("LimitError", "limit", "Over a sessions, memory or ops-per-frame limit.")
UnavailableError = _code("UnavailableError", "unavailable", "An object named by the op is missing or unreadable.")
InternalError = _code("InternalError", "internal", "The backend failed.")
ResourceExhaustedError = _code("ResourceExhaustedError", "resource_exhausted",
                               "The op's outputs would take the device past its memory budget.")
SessionFreedError = _code("SessionFreedError", "session_freed",
                          "The session was freed as idle (no frame and no heartbeat for the worker's idle timeout).")
UnknownGraphError = _code("UnknownGraphError", "unknown_graph", "A replay names a graph that is not stored.")
InvalidGraphError = _code("InvalidGraphError", "invalid_graph", "A stored graph definition does not decode or validate.")

_BY_CODE: Dict[str, Type[OpError]] = {c.code: c for c in (
    MalformedError, VersionError, UnknownOpError, ArityError, ShapeError, DTypeError, AttrError, UnknownIDError,
    FailedIDError, DuplicateError, TooLargeError, LimitError, UnavailableError, InternalError, ResourceExhaustedError,
    SessionFreedError, UnknownGraphError, InvalidGraphError)}


def error_class(code: str) -> Type[OpError]:
    """The OpError subclass of a wire error code (OpError for an unknown code)."""
    return _BY_CODE.get(code, OpError)


def op_error(errs: List[dict]) -> OpError:
    """The exception for a result's non-empty error list: the first error's
    class, carrying all of them."""
    all_errs: List[OpError] = [error_class(e.get("code", ""))(e) for e in errs]
    first = all_errs[0]
    out = error_class(first.code)(dict(code=first.code, op=first.op, seq=first.seq, index=first.index,
                                       message=first.message), all_errs)
    return out
