"""Fabric, Session and Tensor: jetfabric's tensor API (docs/PROTOCOL.md).

A Fabric is a connection to the broker. A Session is a session on one
device: tensors live there, named by ids the session mints, so no op waits
for the worker before the next is sent. Tensors are lazy: an op on tensors
queues a wire op and returns a new Tensor at once; the queued ops go out in
one frame when something waits (a read, a sync, a close), when the frame is
full, or on flush(). Errors of ops surface at the next read or sync of the
session as OpError subclasses carrying the wire code.

A Session is meant for one thread at a time; a Fabric may be shared.

A Fabric survives a broker restart or a cluster's leader changing: its
connection is made again by itself (to the URL it was given or any of
several, see jetfabric.nats.Connection), every frame carries a Nats-Msg-Id
and its number in its session, so a frame whose acknowledgement was lost is
published again and stored once, and a read, sync or close whose answer was
lost is asked again (docs/PROTOCOL.md §3). A call that the fabric cannot
serve for fail_fast seconds raises FabricUnavailableError naming the cause
(DisconnectedError, NoLeaderError, NoQuorumError), and the session carries
on once the fabric is back.
"""

from __future__ import annotations

import calendar
import json
import math
import re
import secrets
import struct
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import cbor
from .errors import (
    ConnectionClosedError,
    DisconnectedError,
    FabricError,
    FabricUnavailableError,
    JetStreamError,
    MaxPayloadError,
    NoDeviceError,
    NoLeaderError,
    NoQuorumError,
    NoRespondersError,
    ObjectStoreError,
    TimeoutError,
    op_error,
)
from .nats import ACK_WAIT, CONNECTED, ERR_DUP_IN_PROCESS, Connection, Msg, Signal, encode_headers, parse_ack, transient
from .objectstore import ObjectStore

try:  # numpy is optional
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the machine
    _np = None

__all__ = ["Fabric", "Session", "Tensor", "Array", "Job", "JobResult", "Graph", "GraphDef", "DTYPES", "connect",
           "all_reduce", "all_gather", "reduce_scatter", "broadcast", "live"]

PROTOCOL_VERSION = 1

# dtype: (bytes per element, struct format, numpy dtype name)
DTYPES: Dict[str, Tuple[int, str, str]] = {
    "f32": (4, "f", "float32"),
    "f64": (8, "d", "float64"),
    "f16": (2, "e", "float16"),
    "bf16": (2, "H", "float32"),  # numpy has no bfloat16: read as float32
    "i32": (4, "i", "int32"),
    "i64": (8, "q", "int64"),
    "u8": (1, "B", "uint8"),
    "bool": (1, "?", "bool"),
}
FLOATS = ("f32", "f64", "f16", "bf16")
INTS = ("i32", "i64", "u8")

_NP_TO_DTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32", "int64": "i64",
                "uint8": "u8", "bool": "bool"}

Shape = Tuple[int, ...]
Scalar = Union[int, float, bool]

_BIG = 1 << 62  # an end past any axis: slice bounds clamp

# A device or session token (docs/PROTOCOL.md §1).
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError("unknown dtype %r (want one of %s)" % (dtype, ", ".join(DTYPES)))
    return dtype


# -- element bytes ----------------------------------------------------------

def _bf16_bits(f32_bits: int) -> int:
    if f32_bits & 0x7FFFFFFF > 0x7F800000:
        return (f32_bits >> 16) | 0x40
    return ((f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16) & 0xFFFF


def _sat(v: float, lo: int, hi: int) -> int:
    if v != v:
        return 0
    if v <= lo:
        return lo
    if v >= hi:
        return hi
    return int(v)


def encode_values(dtype: str, values: Sequence[Any]) -> bytes:
    """Little-endian bytes of values as dtype, converted as the worker's
    `values` are: floats to integers truncate and saturate, bool is != 0."""
    size, fmt, _ = DTYPES[_check_dtype(dtype)]
    n = len(values)
    if dtype == "bf16":
        bits = struct.unpack("<%dI" % n, struct.pack("<%df" % n, *[float(v) for v in values]))
        return struct.pack("<%dH" % n, *[_bf16_bits(b) for b in bits])
    if dtype in FLOATS:
        return struct.pack("<%d%s" % (n, fmt), *[float(v) for v in values])
    if dtype == "bool":
        return bytes(1 if v else 0 for v in values)
    lo, hi = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1), "u8": (0, 255)}[dtype]
    out = []
    for v in values:
        if isinstance(v, float):
            v = _sat(v, lo, hi)
        else:
            v = min(max(int(v), lo), hi)
        out.append(v)
    return struct.pack("<%d%s" % (n, fmt), *out)


def decode_values(dtype: str, data: Union[bytes, bytearray, memoryview]) -> List[Any]:
    """The elements of little-endian bytes of dtype, as Python numbers."""
    size, fmt, _ = DTYPES[_check_dtype(dtype)]
    n = len(data) // size
    if dtype == "bf16":
        return list(struct.unpack("<%df" % n, struct.pack("<%dI" % n, *[h << 16 for h in struct.unpack("<%dH" % n, data)])))
    if dtype == "bool":
        return [b != 0 for b in bytes(data)]
    return list(struct.unpack("<%d%s" % (n, fmt), data))


def _flatten(obj: Any) -> Tuple[List[Any], Shape]:
    """Flattens nested lists of numbers, returning the elements and the shape."""
    if not isinstance(obj, (list, tuple)):
        return [obj], ()
    if len(obj) == 0:
        return [], (0,)
    parts = [_flatten(x) for x in obj]
    shape = parts[0][1]
    for p in parts[1:]:
        if p[1] != shape:
            raise ValueError("ragged nested sequence: shapes %s and %s" % (shape, p[1]))
    flat: List[Any] = []
    for p in parts:
        flat.extend(p[0])
    return flat, (len(obj),) + shape


def _infer_dtype(values: Iterable[Any]) -> str:
    kinds = set(type(v) for v in values)
    if kinds and kinds <= {bool}:
        return "bool"
    if kinds and kinds <= {int, bool}:
        return "i64"
    return "f32"


class Array:
    """A tensor's value as read: dtype, shape and the raw little-endian bytes."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype: str, shape: Sequence[int], data: Union[bytes, bytearray, memoryview]):
        self.dtype = dtype
        self.shape: Shape = tuple(shape)
        self.data = data

    def flat(self) -> List[Any]:
        """The elements in row-major order, as Python numbers."""
        return decode_values(self.dtype, self.data)

    def tolist(self) -> Any:
        """The elements as nested lists (a number for a scalar)."""
        flat = self.flat()
        if not self.shape:
            return flat[0]

        def nest(off: int, dims: Shape) -> Any:
            if len(dims) == 1:
                return flat[off : off + dims[0]]
            step = _numel(dims[1:])
            return [nest(off + i * step, dims[1:]) for i in range(dims[0])]

        return nest(0, self.shape)

    def numpy(self) -> Any:
        """The value as a numpy array (bf16 as float32). Needs numpy."""
        if _np is None:
            raise ImportError("numpy is not installed")
        if self.dtype == "bf16":
            h = _np.frombuffer(self.data, dtype="<u2").astype(_np.uint32) << 16
            return h.view(_np.float32).reshape(self.shape)
        dt = _np.dtype(DTYPES[self.dtype][2]).newbyteorder("<")
        return _np.frombuffer(self.data, dtype=dt).reshape(self.shape).copy()

    def __repr__(self) -> str:
        return "Array(%s, %s)" % (self.dtype, list(self.shape))


# -- shapes -----------------------------------------------------------------

def _broadcast(*shapes: Optional[Shape]) -> Optional[Shape]:
    if any(s is None for s in shapes):
        return None
    r = max(len(s) for s in shapes)  # type: ignore[arg-type]
    out = []
    for i in range(r):
        d = 1
        for s in shapes:
            j = len(s) - r + i  # type: ignore[arg-type]
            if j < 0:
                continue
            e = s[j]  # type: ignore[index]
            if e == 1:
                continue
            if d != 1 and d != e:
                return None  # the worker reports the mismatch, with its code
            d = e
        out.append(d)
    return tuple(out)


def _norm_axes(axes: Optional[Sequence[int]], rank: int) -> List[int]:
    if axes is None or len(axes) == 0:
        return list(range(rank))
    return sorted(a + rank if a < 0 else a for a in axes)


def _axes_list(axis: Union[None, int, Sequence[int]]) -> Optional[List[int]]:
    if axis is None:
        return None
    if isinstance(axis, int):
        return [axis]
    return list(axis)


# -- tensors ----------------------------------------------------------------

TensorLike = Union["Tensor", Scalar]


class Tensor:
    """A tensor of a session: an id on the worker, its dtype and, when the
    client can tell, its shape (None otherwise). Every op returns a new
    Tensor at once; read(), numpy() or tolist() wait for the value."""

    __slots__ = ("s", "id", "dtype", "shape", "__weakref__")
    __array_priority__ = 1000  # numpy defers to Tensor's reflected operators

    def __init__(self, s: "Session", id: int, dtype: str, shape: Optional[Sequence[int]]):
        self.s = s
        self.id = id
        self.dtype = dtype
        self.shape: Optional[Shape] = tuple(shape) if shape is not None else None

    def __repr__(self) -> str:
        shape = list(self.shape) if self.shape is not None else "?"
        return "Tensor(id=%d, %s, %s, device=%s)" % (self.id, self.dtype, shape, self.s.device)

    @property
    def ndim(self) -> int:
        if self.shape is None:
            raise ValueError("the shape of tensor %d is not known on the client" % self.id)
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a scalar or of a tensor of unknown shape")
        return self.shape[0]

    @property
    def session(self) -> "Session":
        return self.s

    def _lift(self, other: TensorLike) -> "Tensor":
        if isinstance(other, Tensor):
            if other.s is not self.s:
                raise ValueError("tensors of different sessions: move one with to()")
            return other
        if isinstance(other, (bool, int, float)):
            return self.s.full((), other, dtype=self.dtype)
        if _np is not None and isinstance(other, (_np.ndarray, _np.generic)):
            return self.s.tensor(other)
        return NotImplemented  # type: ignore[return-value]

    # elementwise
    def _unary(self, name: str) -> "Tensor":
        return self.s.op(name, [self], dtype=self.dtype, shape=self.shape)

    def _binary(self, name: str, other: TensorLike, reverse: bool = False, dtype: Optional[str] = None) -> "Tensor":
        o = self._lift(other)
        if o is NotImplemented:
            return NotImplemented  # type: ignore[return-value]
        a, b = (o, self) if reverse else (self, o)
        return self.s.op(name, [a, b], dtype=dtype or a.dtype, shape=_broadcast(a.shape, b.shape))

    def __add__(self, o: TensorLike) -> "Tensor": return self._binary("add", o)
    def __radd__(self, o: TensorLike) -> "Tensor": return self._binary("add", o, True)
    def __sub__(self, o: TensorLike) -> "Tensor": return self._binary("sub", o)
    def __rsub__(self, o: TensorLike) -> "Tensor": return self._binary("sub", o, True)
    def __mul__(self, o: TensorLike) -> "Tensor": return self._binary("mul", o)
    def __rmul__(self, o: TensorLike) -> "Tensor": return self._binary("mul", o, True)
    def __truediv__(self, o: TensorLike) -> "Tensor": return self._binary("div", o)
    def __rtruediv__(self, o: TensorLike) -> "Tensor": return self._binary("div", o, True)
    def __mod__(self, o: TensorLike) -> "Tensor": return self._binary("mod", o)
    def __rmod__(self, o: TensorLike) -> "Tensor": return self._binary("mod", o, True)
    def __pow__(self, o: TensorLike) -> "Tensor": return self._binary("pow", o)
    def __rpow__(self, o: TensorLike) -> "Tensor": return self._binary("pow", o, True)
    def __and__(self, o: TensorLike) -> "Tensor": return self._binary("and", o)
    def __rand__(self, o: TensorLike) -> "Tensor": return self._binary("and", o, True)
    def __or__(self, o: TensorLike) -> "Tensor": return self._binary("or", o)
    def __ror__(self, o: TensorLike) -> "Tensor": return self._binary("or", o, True)
    def __xor__(self, o: TensorLike) -> "Tensor": return self._binary("xor", o)
    def __rxor__(self, o: TensorLike) -> "Tensor": return self._binary("xor", o, True)
    def __neg__(self) -> "Tensor": return self._unary("neg")
    def __pos__(self) -> "Tensor": return self
    def __abs__(self) -> "Tensor": return self._unary("abs")
    def __invert__(self) -> "Tensor": return self._unary("not")

    def __matmul__(self, o: "Tensor") -> "Tensor": return self.matmul(o)
    def __rmatmul__(self, o: "Tensor") -> "Tensor": return self._lift(o).matmul(self)

    def __eq__(self, o: TensorLike) -> "Tensor": return self._binary("eq", o, dtype="bool")  # type: ignore[override]
    def __ne__(self, o: TensorLike) -> "Tensor": return self._binary("ne", o, dtype="bool")  # type: ignore[override]
    def __lt__(self, o: TensorLike) -> "Tensor": return self._binary("lt", o, dtype="bool")
    def __le__(self, o: TensorLike) -> "Tensor": return self._binary("le", o, dtype="bool")
    def __gt__(self, o: TensorLike) -> "Tensor": return self._binary("gt", o, dtype="bool")
    def __ge__(self, o: TensorLike) -> "Tensor": return self._binary("ge", o, dtype="bool")
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a lazy Tensor is not known on the client: read it with item()")

    def exp(self) -> "Tensor": return self._unary("exp")
    def log(self) -> "Tensor": return self._unary("log")
    def sqrt(self) -> "Tensor": return self._unary("sqrt")
    def rsqrt(self) -> "Tensor": return self._unary("rsqrt")
    def tanh(self) -> "Tensor": return self._unary("tanh")
    def relu(self) -> "Tensor": return self._unary("relu")
    def abs(self) -> "Tensor": return self._unary("abs")
    def sign(self) -> "Tensor": return self._unary("sign")
    def expm1(self) -> "Tensor": return self._unary("expm1")
    def log1p(self) -> "Tensor": return self._unary("log1p")
    def reciprocal(self) -> "Tensor": return self._unary("reciprocal")
    def sin(self) -> "Tensor": return self._unary("sin")
    def cos(self) -> "Tensor": return self._unary("cos")
    def sigmoid(self) -> "Tensor": return self._unary("sigmoid")
    def gelu(self, approximate: str = "none") -> "Tensor":
        return self._unary("gelu_tanh" if approximate == "tanh" else "gelu")
    def silu(self) -> "Tensor": return self._unary("silu")
    def erf(self) -> "Tensor": return self._unary("erf")
    def floor(self) -> "Tensor": return self._unary("floor")
    def ceil(self) -> "Tensor": return self._unary("ceil")
    def round(self) -> "Tensor": return self._unary("round")
    def logical_not(self) -> "Tensor": return self._unary("not")
    def isnan(self) -> "Tensor": return self.s.op("isnan", [self], dtype="bool", shape=self.shape)

    def maximum(self, o: TensorLike) -> "Tensor": return self._binary("maximum", o)
    def minimum(self, o: TensorLike) -> "Tensor": return self._binary("minimum", o)
    def pow(self, o: TensorLike) -> "Tensor": return self._binary("pow", o)

    def clamp(self, lo: TensorLike, hi: TensorLike) -> "Tensor":
        a, b = self._lift(lo), self._lift(hi)
        return self.s.op("clamp", [self, a, b], dtype=self.dtype, shape=_broadcast(self.shape, a.shape, b.shape))

    def where(self, a: TensorLike, b: TensorLike) -> "Tensor":
        """self (a bool tensor) chooses a where true, else b."""
        ta = a if isinstance(a, Tensor) else None
        tb = b if isinstance(b, Tensor) else None
        like = ta if ta is not None else tb
        if like is None:
            raise TypeError("where needs at least one tensor among a and b")
        ta, tb = like._lift(a), like._lift(b)
        return self.s.op("where", [self, ta, tb], dtype=ta.dtype, shape=_broadcast(self.shape, ta.shape, tb.shape))

    def cast(self, dtype: str) -> "Tensor":
        """Converted to dtype (floats to integers truncate and saturate; integers wrap)."""
        return self.s.op("cast", [self], dtype=_check_dtype(dtype), shape=self.shape, attrs={"dtype": dtype})

    astype = cast

    # reductions
    def _reduce(self, name: str, axis: Union[None, int, Sequence[int]], keepdims: bool, dtype: Optional[str] = None,
                **attrs: Any) -> "Tensor":
        axes = _axes_list(axis)
        shape: Optional[Shape] = None
        if self.shape is not None:
            red = set(_norm_axes(axes, len(self.shape)))
            shape = tuple((1 if i in red else d) for i, d in enumerate(self.shape) if keepdims or i not in red)
        a: Dict[str, Any] = dict(attrs)
        if axes:
            a["axes"] = axes
        if keepdims:
            a["keepdims"] = True
        return self.s.op(name, [self], dtype=dtype or self.dtype, shape=shape, attrs=a)

    def sum(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("sum", axis, keepdims)

    def mean(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("mean", axis, keepdims)

    def max(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("max", axis, keepdims)

    def min(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("min", axis, keepdims)

    def prod(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("prod", axis, keepdims)

    def argmax(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("argmax", axis, keepdims, dtype="i64")

    def argmin(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("argmin", axis, keepdims, dtype="i64")

    def logsumexp(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False) -> "Tensor":
        return self._reduce("logsumexp", axis, keepdims)

    def var(self, axis: Union[None, int, Sequence[int]] = None, keepdims: bool = False, correction: int = 0) -> "Tensor":
        attrs = {"correction": correction} if correction else {}
        return self._reduce("var", axis, keepdims, **attrs)

    def softmax(self, axis: int = -1) -> "Tensor":
        return self.s.op("softmax", [self], dtype=self.dtype, shape=self.shape, attrs={"axis": axis} if axis else {})

    def log_softmax(self, axis: int = -1) -> "Tensor":
        return self.s.op("log_softmax", [self], dtype=self.dtype, shape=self.shape, attrs={"axis": axis} if axis else {})

    # linear algebra and movement
    def matmul(self, o: "Tensor") -> "Tensor":
        o = self._lift(o)
        shape: Optional[Shape] = None
        if self.shape is not None and o.shape is not None and self.shape and o.shape:
            a = self.shape if len(self.shape) > 1 else (1,) + self.shape
            b = o.shape if len(o.shape) > 1 else o.shape + (1,)
            batch = _broadcast(a[:-2], b[:-2])
            if a[-1] == b[-2] and batch is not None:  # else the worker reports the mismatch
                shape = tuple(batch) + ((a[-2],) if len(self.shape) > 1 else ()) + ((b[-1],) if len(o.shape) > 1 else ())
        return self.s.op("matmul", [self, o], dtype=self.dtype, shape=shape)

    def reshape(self, *shape: Union[int, Sequence[int]]) -> "Tensor":
        dims = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)  # type: ignore[arg-type]
        out: Optional[List[int]] = list(dims)
        if -1 in dims:
            if self.shape is not None:
                known = _numel([d for d in dims if d != -1])
                out[dims.index(-1)] = _numel(self.shape) // known if known else 0  # type: ignore[index]
            else:
                out = None
        return self.s.op("reshape", [self], dtype=self.dtype, shape=out, attrs={"shape": dims})

    def view(self, *shape: Union[int, Sequence[int]]) -> "Tensor":
        return self.reshape(*shape)

    def flatten(self) -> "Tensor":
        return self.reshape(-1)

    def permute(self, *perm: Union[int, Sequence[int]]) -> "Tensor":
        p = list(perm[0]) if len(perm) == 1 and not isinstance(perm[0], int) else list(perm)  # type: ignore[arg-type]
        shape = tuple(self.shape[i] for i in p) if self.shape is not None else None
        return self.s.op("permute", [self], dtype=self.dtype, shape=shape, attrs={"perm": p})

    def transpose(self, a: int = -2, b: int = -1) -> "Tensor":
        r = self.ndim
        p = list(range(r))
        a, b = a % r, b % r
        p[a], p[b] = p[b], p[a]
        return self.permute(p)

    @property
    def T(self) -> "Tensor":
        return self.permute(list(reversed(range(self.ndim))))

    def expand(self, *shape: Union[int, Sequence[int]]) -> "Tensor":
        dims = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)  # type: ignore[arg-type]
        return self.s.op("expand", [self], dtype=self.dtype, shape=dims, attrs={"shape": dims})

    def flip(self, axis: Union[None, int, Sequence[int]] = None) -> "Tensor":
        axes = _axes_list(axis)
        return self.s.op("flip", [self], dtype=self.dtype, shape=self.shape, attrs={"axes": axes} if axes else {})

    def squeeze(self, axis: Union[None, int, Sequence[int]] = None) -> "Tensor":
        axes = _axes_list(axis)
        shape: Optional[Shape] = None
        if self.shape is not None:
            r = len(self.shape)
            drop = set(_norm_axes(axes, r)) if axes else {i for i, d in enumerate(self.shape) if d == 1}
            shape = tuple(d for i, d in enumerate(self.shape) if i not in drop)
        return self.s.op("squeeze", [self], dtype=self.dtype, shape=shape, attrs={"axes": axes} if axes else {})

    def unsqueeze(self, axis: Union[int, Sequence[int]]) -> "Tensor":
        axes = _axes_list(axis) or []
        shape: Optional[Shape] = None
        if self.shape is not None:
            r = len(self.shape) + len(axes)
            pos = set(a + r if a < 0 else a for a in axes)
            it = iter(self.shape)
            shape = tuple(1 if i in pos else next(it) for i in range(r))
        return self.s.op("unsqueeze", [self], dtype=self.dtype, shape=shape, attrs={"axes": axes})

    def pad(self, pads: Sequence[int], value: float = 0.0) -> "Tensor":
        """pads: before and after for each axis in turn ([b0, a0, b1, a1, ...])."""
        shape: Optional[Shape] = None
        if self.shape is not None:
            p = list(pads) + [0] * (2 * len(self.shape) - len(pads))
            shape = tuple(d + p[2 * i] + p[2 * i + 1] for i, d in enumerate(self.shape))
        attrs: Dict[str, Any] = {"pads": list(pads)}
        if value:
            attrs["value"] = float(value)
        return self.s.op("pad", [self], dtype=self.dtype, shape=shape, attrs=attrs)

    def split(self, sizes: Sequence[int], axis: int = 0) -> List["Tensor"]:
        shapes: List[Optional[Shape]] = [None] * len(sizes)
        if self.shape is not None:
            a = axis % len(self.shape)
            shapes = [self.shape[:a] + (n,) + self.shape[a + 1 :] for n in sizes]
        outs = self.s.op_n("split", [self], [(self.dtype, sh) for sh in shapes], attrs={"sizes": list(sizes), "axis": axis})
        return outs

    def gather(self, index: "Tensor", axis: int = 0) -> "Tensor":
        return self.s.op("gather", [self, index], dtype=self.dtype, shape=index.shape, attrs={"axis": axis})

    def index_select(self, index: "Tensor", axis: int = 0) -> "Tensor":
        shape: Optional[Shape] = None
        if self.shape is not None and index.shape is not None:
            a = axis % len(self.shape)
            shape = self.shape[:a] + index.shape + self.shape[a + 1 :]
        return self.s.op("index_select", [self, index], dtype=self.dtype, shape=shape, attrs={"axis": axis})

    def scatter_add(self, index: "Tensor", src: "Tensor", axis: int = 0) -> "Tensor":
        return self.s.op("scatter_add", [self, index, src], dtype=self.dtype, shape=self.shape, attrs={"axis": axis})

    def one_hot(self, depth: int, dtype: str = "f32") -> "Tensor":
        shape = self.shape + (depth,) if self.shape is not None else None
        return self.s.op("one_hot", [self], dtype=dtype, shape=shape, attrs={"depth": depth, "dtype": dtype})

    def tril(self, k: int = 0) -> "Tensor":
        return self.s.op("tril", [self], dtype=self.dtype, shape=self.shape, attrs={"k": k} if k else {})

    def triu(self, k: int = 0) -> "Tensor":
        return self.s.op("triu", [self], dtype=self.dtype, shape=self.shape, attrs={"k": k} if k else {})

    # networks (NCHW; docs/PROTOCOL.md: convolution, pooling and loss ops)
    def conv2d(self, weight: "Tensor", bias: Optional["Tensor"] = None, stride: Sequence[int] = (1, 1),
               padding: Sequence[int] = (0, 0), dilation: Sequence[int] = (1, 1), groups: int = 1) -> "Tensor":
        """2-D convolution of x [N, C, H, W] with weight [O, C/groups, KH, KW] (and bias [O])."""
        ins = [self, weight] + ([bias] if bias is not None else [])
        shape: Optional[Shape] = None
        if self.shape is not None and weight.shape is not None and len(self.shape) == 4 and len(weight.shape) == 4:
            n, _, h, w = self.shape
            o, _, kh, kw = weight.shape
            oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
            ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
            shape = (n, o, oh, ow)
        return self.s.op("conv2d", ins, dtype=self.dtype, shape=shape,
                         attrs=_window_attrs(stride, padding, dilation, groups, None, (1, 1)))

    def max_pool2d(self, kernel: Sequence[int], stride: Optional[Sequence[int]] = None,
                   padding: Sequence[int] = (0, 0), dilation: Sequence[int] = (1, 1)) -> "Tensor":
        """Max pooling over kernel [kh, kw] windows (stride defaults to kernel)."""
        return self._pool("max_pool2d", kernel, stride, padding, dilation)

    def avg_pool2d(self, kernel: Sequence[int], stride: Optional[Sequence[int]] = None,
                   padding: Sequence[int] = (0, 0)) -> "Tensor":
        """Average pooling; the divisor is kh*kw, padding counted as zeros."""
        return self._pool("avg_pool2d", kernel, stride, padding, (1, 1))

    def _pool(self, name: str, kernel: Sequence[int], stride: Optional[Sequence[int]], padding: Sequence[int],
              dilation: Sequence[int]) -> "Tensor":
        st = tuple(stride) if stride is not None else tuple(kernel)
        shape: Optional[Shape] = None
        if self.shape is not None and len(self.shape) == 4:
            n, c, h, w = self.shape
            oh = (h + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // st[0] + 1
            ow = (w + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // st[1] + 1
            shape = (n, c, oh, ow)
        attrs = _window_attrs((1, 1), padding, dilation, 1, kernel, (1, 1))
        if stride is not None:
            attrs["stride"] = list(stride)
        return self.s.op(name, [self], dtype=self.dtype, shape=shape, attrs=attrs)

    def cross_entropy(self, target: "Tensor", reduce: str = "mean") -> "Tensor":
        """Cross entropy of logits [N, C] against class indices target [N] (i32 or i64):
        a scalar for reduce "mean" or "sum", [N] for "none"."""
        shape: Optional[Shape] = ()
        if reduce == "none":
            shape = self.shape[:1] if self.shape is not None else None
        attrs = {"reduce": reduce} if reduce != "mean" else {}
        return self.s.op("cross_entropy", [self, target], dtype=self.dtype, shape=shape, attrs=attrs)

    def layer_norm(self, weight: Optional["Tensor"] = None, bias: Optional["Tensor"] = None,
                   axis: Union[int, Sequence[int]] = -1, eps: float = 1e-5) -> "Tensor":
        """(x - mean) / sqrt(var + eps) * weight + bias over the trailing axes."""
        return self._norm("layer_norm", weight, bias, axis, eps)

    def rms_norm(self, weight: Optional["Tensor"] = None, bias: Optional["Tensor"] = None,
                 axis: Union[int, Sequence[int]] = -1, eps: float = 1e-5) -> "Tensor":
        """x / sqrt(mean(x^2) + eps) * weight + bias over the trailing axes."""
        return self._norm("rms_norm", weight, bias, axis, eps)

    def _norm(self, name: str, weight: Optional["Tensor"], bias: Optional["Tensor"],
              axis: Union[int, Sequence[int]], eps: float) -> "Tensor":
        if bias is not None and weight is None:
            raise ValueError("%s: a bias needs a weight" % name)
        ins = [self] + [t for t in (weight, bias) if t is not None]
        attrs: Dict[str, Any] = {"axes": _axes_list(axis)}
        if eps != 1e-5:
            attrs["eps"] = float(eps)
        return self.s.op(name, ins, dtype=self.dtype, shape=self.shape, attrs=attrs)

    def __getitem__(self, key: Any) -> "Tensor":
        return _index(self, key)

    # values
    def read(self, timeout: Optional[float] = None) -> Array:
        """Waits for the tensor's value (raises the session's pending errors)."""
        return self.s._read(self, timeout)

    def numpy(self) -> Any:
        """The value as a numpy array. Needs numpy."""
        return self.read().numpy()

    def tolist(self) -> Any:
        """The value as nested lists of Python numbers."""
        return self.read().tolist()

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number."""
        flat = self.read().flat()
        if len(flat) != 1:
            raise ValueError("item() of a tensor of %d elements" % len(flat))
        return flat[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        a = self.numpy()
        return a.astype(dtype) if dtype is not None else a

    def free(self) -> None:
        """Releases the tensor on the worker (queued like any op)."""
        self.s._queue({"op": "free", "in": [self.id]})

    # transfers
    def to(self, dst: "Session", timeout: float = 60.0) -> "Tensor":
        """A copy of the tensor in session dst (another device), moved worker
        to worker through the object store; the client never sees the data."""
        tid = secrets.token_hex(16)
        self.expose(tid)
        return dst.import_(tid, self.dtype, self.shape, timeout)

    def expose(self, transfer: str, reads: int = 1) -> None:
        """Offers the tensor under transfer id transfer (32 hex digits, never
        reused) for reads imports; the frame goes out at once, since others wait on it."""
        op: Dict[str, Any] = {"op": "expose", "in": [self.id], "transfer": transfer}
        if reads != 1:
            op["reads"] = reads
        self.s._queue(op)
        self.s.flush()


def _window_attrs(stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
                  kernel: Optional[Sequence[int]], default_stride: Sequence[int]) -> Dict[str, Any]:
    """The window attributes that differ from their defaults."""
    a: Dict[str, Any] = {}
    if tuple(stride) != tuple(default_stride):
        a["stride"] = list(stride)
    if tuple(padding) != (0, 0):
        a["padding"] = list(padding)
    if tuple(dilation) != (1, 1):
        a["dilation"] = list(dilation)
    if groups != 1:
        a["groups"] = groups
    if kernel is not None:
        a["kernel"] = list(kernel)
    return a


def _index(t: Tensor, key: Any) -> Tensor:
    if not isinstance(key, tuple):
        key = (key,)
    n_consume = sum(1 for k in key if k is not None and k is not Ellipsis)
    if any(k is Ellipsis for k in key):
        if sum(1 for k in key if k is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis")
        i = key.index(Ellipsis)
        key = key[:i] + (slice(None),) * (t.ndim - n_consume) + key[i + 1 :]
    if t.shape is not None and n_consume > len(t.shape):
        raise IndexError("too many indices for a tensor of rank %d" % len(t.shape))
    starts: List[int] = []
    ends: List[int] = []
    steps: List[int] = []
    drop: List[int] = []        # input axes indexed by an integer
    selects: List[Tuple[int, Tensor]] = []
    news: List[int] = []        # output positions of None
    axis, out_pos = 0, 0
    for k in key:
        if k is None:
            news.append(out_pos)
            out_pos += 1
            continue
        if isinstance(k, Tensor):
            selects.append((axis, k))
            starts.append(0), ends.append(_BIG), steps.append(1)
            axis += 1
            out_pos += 1
            continue
        if isinstance(k, slice):
            st = 1 if k.step is None else int(k.step)
            if st == 0:
                raise ValueError("slice step cannot be zero")
            if st > 0:
                starts.append(0 if k.start is None else int(k.start))
                ends.append(_BIG if k.stop is None else int(k.stop))
            else:
                starts.append(-1 if k.start is None else int(k.start))
                ends.append(-_BIG if k.stop is None else int(k.stop))
            steps.append(st)
            axis += 1
            out_pos += 1
            continue
        if hasattr(k, "__index__"):
            i = k.__index__()
            if t.shape is not None:
                n = t.shape[axis]
                if not -n <= i < n:
                    raise IndexError("index %d is out of bounds for axis %d with size %d" % (i, axis, n))
            starts.append(i)
            ends.append(i + 1 if i != -1 else _BIG)
            steps.append(1)
            drop.append(axis)
            axis += 1
            continue
        raise TypeError("unsupported index %r" % (k,))
    out = t
    # Trim trailing whole-axis slices: absent axes are taken whole.
    while starts and starts[-1] == 0 and ends[-1] == _BIG and steps[-1] == 1:
        starts.pop(), ends.pop(), steps.pop()
    if starts:
        shape: Optional[Shape] = None
        if t.shape is not None:
            shape = tuple(len(range(d)[slice(starts[i], ends[i], steps[i])]) if i < len(starts) else d
                          for i, d in enumerate(t.shape))
        out = t.s.op("slice", [t], dtype=t.dtype, shape=shape,
                     attrs={"starts": starts, "ends": ends, "steps": steps})
    for ax, idx in selects:
        out = out.index_select(idx, ax)
    if drop:
        out = out.squeeze(drop)
    if news:
        out = out.unsqueeze(news)
    return out


# -- sessions ---------------------------------------------------------------

class _Wait:
    __slots__ = ("ev", "result")

    def __init__(self) -> None:
        self.ev = Signal()
        self.result: Optional[dict] = None


class Session:
    """A session on one device. Use it as a context manager to close it."""

    def __init__(self, fabric: "Fabric", device: str, token: Optional[str] = None, record: bool = False):
        self.f = fabric
        self.device = device
        self.token = token or secrets.token_hex(16)  # 128 random bits: unguessable
        self.record = record
        self.graph: Optional["Graph"] = None  # the graph a recording session builds
        self._ops: List[dict] = []
        self._bytes = 0
        self._next_id = 0
        self._next_tag = 0
        self._lock = threading.Lock()
        self._waits: Dict[int, _Wait] = {}
        # Frames the stream refused, not yet reported: the next read or
        # sync raises the first (see _refused).
        self._refusals: List[Exception] = []
        # The connection closed for good with frames unacknowledged: every
        # later wait raises it.
        self._failure: Optional[Exception] = None
        self._frame = 0  # frames published, numbered from 1 in Fabric-Frame
        self._untagged: List[dict] = []
        # Frames published asking for the stream's acknowledgement and not
        # yet acknowledged, by number (see flush).
        self._pending: Dict[int, _Frame] = {}
        self._stream_known = False
        self.redelivered = 0  # frames published again (an acknowledgement lost, late, or a failure)
        self.reasked = 0  # reads, syncs and closes asked again (an answer lost)
        self._cv = threading.Condition(self._lock)
        self.closed = False
        self.subject = "%s.ops.%s.%s" % (fabric.space, device, self.token)
        if record:
            return
        self.inbox = "%s.%s" % (fabric.inbox_prefix, self.token)
        self._sub = fabric.conn.subscribe(self.inbox, cb=self._on_result)
        self._ack_reply, self._ack_token = fabric.conn.new_reply(self._on_ack)

    def __repr__(self) -> str:
        return "Session(%s on %s)" % (self.token, self.device)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            try:
                self.close()
            except FabricError:
                if exc[0] is None:
                    raise

    # -- ids and queueing ----------------------------------------------------

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _queue(self, op: dict, size: int = 48) -> None:
        if self.closed:
            raise FabricError("session %s is closed" % self.token)
        self._ops.append(op)
        self._bytes += size
        if not self.record and (len(self._ops) >= self.f.max_ops or self._bytes >= self.f.max_frame):
            self.flush()

    def op(self, name: str, inputs: Sequence[Tensor], dtype: str, shape: Optional[Sequence[int]] = None,
           attrs: Optional[Dict[str, Any]] = None) -> Tensor:
        """Queues op name on inputs with wire attributes attrs and returns its
        output. dtype and shape are what the client records of the output."""
        for t in inputs:
            if t.s is not self:
                raise ValueError("input tensor %d belongs to another session" % t.id)
        out = Tensor(self, self._id(), dtype, shape)
        o: Dict[str, Any] = {"op": name, "out": [out.id]}
        if inputs:
            o["in"] = [t.id for t in inputs]
        if attrs:
            o.update(attrs)
        self._queue(o)
        return out

    def op_n(self, name: str, inputs: Sequence[Tensor], outs: Sequence[Tuple[str, Optional[Shape]]],
             attrs: Optional[Dict[str, Any]] = None) -> List[Tensor]:
        """Like op for ops with several outputs (split)."""
        ts = [Tensor(self, self._id(), dt, sh) for dt, sh in outs]
        o: Dict[str, Any] = {"op": name, "out": [t.id for t in ts], "in": [t.id for t in inputs]}
        if attrs:
            o.update(attrs)
        self._queue(o)
        return ts

    # -- creation ------------------------------------------------------------

    def upload(self, data: Union[bytes, bytearray, memoryview], dtype: str, shape: Sequence[int]) -> Tensor:
        """A tensor of dtype and shape from its little-endian bytes. Bytes
        over the inline limit go through the object store (docs §7)."""
        _check_dtype(dtype)
        mv = memoryview(data).cast("B")
        want = _numel(shape) * DTYPES[dtype][0]
        if mv.nbytes != want:
            raise ValueError("%d bytes for %s %s, want %d" % (mv.nbytes, dtype, list(shape), want))
        if self.graph is not None:
            raise ValueError("a graph cannot hold upload: make the tensor an input (Graph.input) and bind it at replay")
        t = Tensor(self, self._id(), dtype, shape)
        op: Dict[str, Any] = {"op": "upload", "out": [t.id], "dtype": dtype}
        if shape:
            op["shape"] = list(shape)
        if mv.nbytes <= self.f.inline_upload:
            op["data"] = bytes(mv)
            if self._bytes + mv.nbytes > self.f.max_frame and self._ops and not self.record:
                self.flush()
            self._queue(op, 64 + mv.nbytes)
            return t
        self.f._upload_object(self, op, mv)
        return t

    def tensor(self, obj: Any, dtype: Optional[str] = None) -> Tensor:
        """A tensor from a numpy array, a nested list or a number. Lists of
        ints default to i64, of floats to f32, of bools to bool; numpy
        arrays keep their dtype (float32, float64, float16, int32, int64,
        uint8, bool) unless dtype is given."""
        if isinstance(obj, Tensor):
            return obj if obj.s is self else obj.to(self)
        if _np is not None and isinstance(obj, (_np.ndarray, _np.generic)):
            a = _np.asarray(obj)
            if dtype is None:
                dtype = _NP_TO_DTYPE.get(a.dtype.name)
                if dtype is None:
                    raise TypeError("numpy dtype %s has no jetfabric dtype: pass dtype=" % a.dtype)
            if dtype == "bf16":
                f = _np.ascontiguousarray(a, dtype="<f4").view("<u4")
                b = ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype("<u2")
                nan = (f & 0x7FFFFFFF) > 0x7F800000
                b[nan] = ((f[nan] >> 16) | 0x40).astype("<u2")
                return self.upload(b.tobytes(), "bf16", a.shape)
            a = _np.ascontiguousarray(a, dtype=_np.dtype(DTYPES[dtype][2]).newbyteorder("<"))
            return self.upload(memoryview(a).cast("B"), dtype, a.shape)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            raise TypeError("use upload(data, dtype, shape) for bytes")
        flat, shape = _flatten(obj)
        dtype = _check_dtype(dtype or _infer_dtype(flat))
        return self.upload(encode_values(dtype, flat), dtype, shape)

    def _create(self, name: str, shape: Optional[Sequence[int]], dtype: str, attrs: Dict[str, Any],
                out_shape: Optional[Sequence[int]] = None) -> Tensor:
        _check_dtype(dtype)
        a = dict(attrs)
        if shape:
            a["shape"] = list(shape)
        if dtype != "f32":
            a["dtype"] = dtype
        return self.op(name, [], dtype=dtype, shape=out_shape if out_shape is not None else tuple(shape or ()), attrs=a)

    def full(self, shape: Sequence[int], value: Scalar, dtype: str = "f32") -> Tensor:
        return self._create("full", shape, dtype, {"value": float(value)} if value else {})

    def zeros(self, shape: Sequence[int], dtype: str = "f32") -> Tensor:
        return self._create("zeros", shape, dtype, {})

    def ones(self, shape: Sequence[int], dtype: str = "f32") -> Tensor:
        return self._create("ones", shape, dtype, {})

    def arange(self, start: float, stop: Optional[float] = None, step: float = 1.0, dtype: str = "f32") -> Tensor:
        if stop is None:
            start, stop = 0.0, start
        n = max(0, math.ceil((stop - start) / step)) if step else 0
        a = {k: float(v) for k, v in (("start", start), ("stop", stop), ("step", step)) if v}
        return self._create("arange", None, dtype, a, out_shape=(n,))

    def linspace(self, start: float, stop: float, num: int, dtype: str = "f32") -> Tensor:
        a: Dict[str, Any] = {k: float(v) for k, v in (("start", start), ("stop", stop)) if v}
        a["num"] = num
        return self._create("linspace", None, dtype, a, out_shape=(num,))

    def eye(self, n: int, m: int = 0, k: int = 0, dtype: str = "f32") -> Tensor:
        a: Dict[str, Any] = {"n": n}
        if m:
            a["m"] = m
        if k:
            a["k"] = k
        return self._create("eye", None, dtype, a, out_shape=(n, m or n))

    def uniform(self, shape: Sequence[int], low: float = 0.0, high: float = 1.0, dtype: str = "f32") -> Tensor:
        a = {k: float(v) for k, v in (("low", low), ("high", high)) if v}
        return self._create("uniform", shape, dtype, a)

    def normal(self, shape: Sequence[int], mean: float = 0.0, std: float = 1.0, dtype: str = "f32") -> Tensor:
        a = {k: float(v) for k, v in (("mean", mean), ("std", std)) if v}
        return self._create("normal", shape, dtype, a)

    def bernoulli(self, shape: Sequence[int], p: float, dtype: str = "f32") -> Tensor:
        return self._create("bernoulli", shape, dtype, {"p": float(p)} if p else {})

    def concat(self, ts: Sequence[Tensor], axis: int = 0) -> Tensor:
        shape: Optional[Shape] = None
        if all(t.shape is not None for t in ts) and ts:
            s0 = ts[0].shape
            a = axis % len(s0)  # type: ignore[arg-type]
            shape = s0[:a] + (sum(t.shape[a] for t in ts),) + s0[a + 1 :]  # type: ignore[index,operator]
        return self.op("concat", ts, dtype=ts[0].dtype, shape=shape, attrs={"axis": axis} if axis else {})

    def stack(self, ts: Sequence[Tensor], axis: int = 0) -> Tensor:
        shape: Optional[Shape] = None
        if ts and ts[0].shape is not None:
            s0 = ts[0].shape
            a = axis % (len(s0) + 1)
            shape = s0[:a] + (len(ts),) + s0[a:]
        return self.op("stack", ts, dtype=ts[0].dtype, shape=shape, attrs={"axis": axis} if axis else {})

    def where(self, cond: Tensor, a: TensorLike, b: TensorLike) -> Tensor:
        """a where cond is true, else b (wire inputs [cond, a, b])."""
        return cond.where(a, b)

    def import_(self, transfer: str, dtype: Optional[str] = None, shape: Optional[Sequence[int]] = None,
                timeout: float = 60.0) -> Tensor:
        """The tensor another session exposed under transfer id transfer."""
        t = Tensor(self, self._id(), dtype or "f32", shape)
        op: Dict[str, Any] = {"op": "import", "out": [t.id], "transfer": transfer, "timeout_ms": int(timeout * 1000)}
        if dtype:
            op["dtype"] = dtype
        if shape:
            op["shape"] = list(shape)
        self._queue(op)
        return t

    def seed(self, seed: int) -> None:
        """Sets the session's random seed for the ops that follow."""
        self._queue({"op": "seed", "seed": seed})

    def checkpoint(self) -> None:
        """Asks the worker to checkpoint the device after this frame."""
        self._queue({"op": "checkpoint"})

    def replay(self, g: "GraphDef", inputs: Sequence[Tensor] = (), scalars: Sequence[float] = ()) -> List[Tensor]:
        """Queues one op that runs graph g (from Graph.define or
        Fabric.load_graph) with its placeholders bound to inputs and its
        scalar placeholders to scalars, and returns its outputs. It reserves
        the ids the graph's ops would get if they were sent one by one here,
        so random ops draw the same bits. The counts and the session of the
        inputs are checked here (ValueError); the worker checks their dtypes
        and shapes, and a replay with a wrong binding runs nothing: its
        outputs fail with an OpError whose op is "replay". The outputs carry
        the dtypes and shapes the graph's builder recorded; those of a graph
        from load_graph are learned at their first read."""
        if not isinstance(g, GraphDef):
            raise TypeError("replay takes a GraphDef (Graph.define, Fabric.load_graph), not %s" % type(g).__name__)
        if self.closed:
            raise FabricError("session %s is closed" % self.token)
        inputs, scalars = list(inputs), list(scalars)
        if len(inputs) != len(g.inputs):
            raise ValueError("replay: graph %s takes %d inputs, %d given" % (g.name[:12], len(g.inputs), len(inputs)))
        if len(scalars) != g.scalars:
            raise ValueError("replay: graph %s takes %d scalars, %d given" % (g.name[:12], g.scalars, len(scalars)))
        for j, t in enumerate(inputs):
            if not isinstance(t, Tensor) or t.s is not self:
                raise ValueError("replay: input %d of graph %s is not a tensor of this session" % (j, g.name[:12]))
        n_in = len(g.inputs)
        base = self._next_id + 1
        self._next_id += g.internal
        outs = []
        for j, local in enumerate(g.outputs):
            dtype, shape = g.output_metas[j] if j < len(g.output_metas) else ("f32", None)
            outs.append(Tensor(self, base + local - n_in - 1, dtype, shape))
        op: Dict[str, Any] = {"op": "replay", "graph": g.name, "base": base, "out": [t.id for t in outs]}
        if inputs:
            op["in"] = [t.id for t in inputs]
        if scalars:
            op["scalars"] = [float(x) for x in scalars]
        self._queue(op)
        return outs

    # -- frames and answers ----------------------------------------------------

    def flush(self, waited: bool = False) -> Optional["_Frame"]:
        """Publishes the queued ops as one frame, and returns it (None when
        nothing was queued).

        Every frame carries its number in the session (Fabric-Frame) and a
        Nats-Msg-Id made of the session's subject and that number, so that
        the stream stores a frame published twice once, and the worker runs
        the session's frames in the order of their numbers. A frame nothing
        waits on goes through JetStream, up to publish_window of them
        unacknowledged: one whose acknowledgement does not come within
        ACK_WAIT (lost with the connection, say), or comes as a failure that
        says nothing about the frame (no responders, no stream leader), is
        published again, with its id, by the fabric's redelivery thread until
        the stream stores it; a refusal is raised by the session's next read
        or sync (once), and an empty frame of the same number takes its place
        so that the worker runs the frames after it (see _refused). With
        waited (the frame of a read, sync or close) it is a plain publish,
        the worker's answer proving it stored, and _call checks the stream
        when the answer is late (docs/PROTOCOL.md §3). While the connection
        is being made again, frames are kept by it and go out once
        connected."""
        if self.record or not self._ops:
            return None
        ops, self._ops, self._bytes = self._ops, [], 0
        frame = cbor.dumps({"v": PROTOCOL_VERSION, "ops": ops})
        n = self._frame + 1
        headers = {"Fabric-Reply": self.inbox, "Fabric-Frame": str(n), "Nats-Msg-Id": "%s-%d" % (self.subject, n)}
        size = len(frame) + len(encode_headers(headers))
        if size > self.f.conn.max_payload:
            # The number is not used: the session's frames stay contiguous.
            raise MaxPayloadError("frame of %d bytes on %s is over the broker's max_payload of %d bytes (upload large "
                                  "tensors, which go through the object store, or lower max_frame)"
                                  % (size, self.subject, self.f.conn.max_payload))
        fr = _Frame(n, frame, headers)
        if waited:
            self._frame = n
            try:
                self.f.conn.publish(self.subject, frame, headers=headers)
            except DisconnectedError as e:
                self._redeliver(fr, e)  # kept here until the connection is back
            return fr
        with self._cv:
            deadline = time.monotonic() + self.f.timeout
            while len(self._pending) >= self.f.publish_window and self._failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._window_error()
                self._cv.wait(left)
            fr.since = time.monotonic()
            fr.due = fr.since + ACK_WAIT
            self._pending[n] = fr
        self._frame = n
        self.f._track(self)
        try:
            self.f.conn.publish(self.subject, frame, reply="%s.%d" % (self._ack_reply, n), headers=headers)
        except DisconnectedError as e:
            self._redeliver(fr, e)
        except BaseException:
            with self._cv:
                self._pending.pop(n, None)
                self._cv.notify_all()
            raise
        return fr

    def _window_error(self) -> Exception:
        """Why the publish window stayed full (the caller holds _cv)."""
        last = min(self._pending.values(), key=lambda fr: fr.since).err if self._pending else None
        if self.f.conn.status != CONNECTED:
            return self.f.conn.disconnected_error("%d frames of session %s wait for the stream's acknowledgement"
                                                  % (len(self._pending), self.token))
        return TimeoutError("%d frames of session %s have no JetStream acknowledgement after %.1fs%s" % (
            len(self._pending), self.token, self.f.timeout, " (last failure: %s)" % last if last else ""))

    def _redeliver(self, fr: "_Frame", err: Exception) -> None:
        """Takes frame fr, whose publish failed with err without the stream
        refusing it, to be published again after a backoff (50 ms doubling to
        2 s)."""
        now = time.monotonic()
        with self._cv:
            if fr.err is None:
                fr.wait = _REDELIVER_WAIT
            else:
                fr.wait = min(2 * fr.wait, _REDELIVER_MAX)
            if not fr.since:
                fr.since = now
            fr.err = err
            fr.due = now + fr.wait
            self._pending[fr.n] = fr
            self._cv.notify_all()  # (_settle does not wait for it)
        self.f._track(self)

    def _due(self, now: float) -> List["_Frame"]:
        """The frames to publish again now, in the order of their numbers;
        each is then awaited for ACK_WAIT before it is due again."""
        with self._cv:
            due = [fr for fr in self._pending.values() if fr.due <= now]
            for fr in due:
                fr.due = now + ACK_WAIT
        due.sort(key=lambda fr: fr.n)
        return due

    def _next_due(self) -> Optional[float]:
        with self._cv:
            return min((fr.due for fr in self._pending.values()), default=None)

    def _republish(self, fr: "_Frame") -> None:
        """Publishes fr again, with its Nats-Msg-Id (the redelivery thread)."""
        if isinstance(fr.err, NoRespondersError) and not self.f.tenant and not self._captured():
            self._refused(fr, NoRespondersError("no stream captures %s (no responders)" % self.subject))
            return
        try:
            self.f.conn.publish(self.subject, fr.data, reply="%s.%d" % (self._ack_reply, fr.n), headers=fr.headers)
            self.redelivered += 1
        except DisconnectedError as e:
            self._redeliver(fr, e)
        except FabricError:
            pass  # closed for good: nothing to publish on

    def _captured(self) -> bool:
        """Whether a stream captures the session's subject (asked once found)."""
        if not self._stream_known:
            self._stream_known = self.f.conn.stream_captures(self.subject)
        return self._stream_known

    def _refused(self, fr: "_Frame", err: Exception) -> None:
        """The stream refuses frame fr (final: over its max message size, full,
        sealed, or no stream captures the subject). The session's next read or
        sync raises err, once, as the Go client's does (docs/PROTOCOL.md §3);
        the reads and syncs after it carry on. An empty frame of fr's number
        (Nats-Msg-Id <subject>-<n>-r) is published in its place until the
        stream stores it, so that the worker, which runs a session's frames in
        the order of their numbers, does not hold the later frames waiting
        for fr; the ops that used what fr would have made fail with
        unknown_id."""
        with self._cv:
            self._pending.pop(fr.n, None)
            if not fr.replacement:
                self._refusals.append(err)
            self._cv.notify_all()
        if not isinstance(err, NoRespondersError):  # (no stream would store a replacement either)
            self._replace(fr.n)

    def _replace(self, n: int) -> None:
        """Publishes an empty frame numbered n in place of a refused frame,
        again (backoff from 50 ms to 2 s) until the stream stores it."""
        headers = {"Fabric-Reply": self.inbox, "Fabric-Frame": str(n), "Nats-Msg-Id": "%s-%d-r" % (self.subject, n)}
        fr = _Frame(n, cbor.dumps({"v": PROTOCOL_VERSION, "ops": []}), headers)
        fr.replacement = True
        self._redeliver(fr, JetStreamError("in place of refused frame %d" % n, 0, 0, ""))
        self.f._wake_redeliver()

    def _take_refusals(self) -> Optional[Exception]:
        """The refusals not yet reported, as one exception (None when there is
        none): the first, naming how many more there were."""
        with self._cv:
            errs, self._refusals = self._refusals, []
        if not errs:
            return None
        first = errs[0]
        if len(errs) > 1:
            first.args = ("%s (and %d more frames refused)" % (first, len(errs) - 1),) + tuple(first.args[1:])
        return first

    def _settle(self, upto: int) -> None:
        """Waits, at most _SETTLE_WAIT, until the stream has answered every
        frame numbered up to upto that asked for an acknowledgement, so that
        a refusal of a frame sent before a call's own is raised by that call.
        It seldom waits: those answers come before the worker's answer to a
        later frame."""
        deadline = time.monotonic() + _SETTLE_WAIT
        with self._cv:
            while any(n <= upto and not fr.err for n, fr in self._pending.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cv.wait(left)

    def _on_ack(self, m: Optional[Msg]) -> None:
        """The stream's answer to frame n, on <ack reply>.<n> (reader thread);
        None when the connection was lost with the answers in flight."""
        if m is None:
            if self.f.conn.closed:
                self._closed_for_good(self.f.conn._closed or ConnectionClosedError("connection closed"))
                return
            now = time.monotonic()
            with self._cv:
                for fr in self._pending.values():
                    fr.due = min(fr.due, now)  # published again once connected
            self.f._wake_redeliver()
            return
        try:
            n = int(m.subject.rsplit(".", 1)[1])
        except (IndexError, ValueError):
            return
        err: Optional[Exception] = None
        try:
            parse_ack(m, self.subject)
        except FabricError as e:
            err = e
        with self._cv:
            fr = self._pending.get(n)
            if fr is None:
                return  # answered already: a frame published twice
            if err is None:
                del self._pending[n]
                self._cv.notify_all()
                return
        if transient(err) or fr.replacement:
            # (An empty frame in place of a refused one is published until stored.)
            self._redeliver(fr, err)
            self.f._wake_redeliver()
            return
        self._refused(fr, err)

    def _closed_for_good(self, err: Exception) -> None:
        """The connection is closed for good with frames unacknowledged:
        every wait of the session ends and raises err."""
        with self._cv:
            if self._failure is None:
                self._failure = err
            self._cv.notify_all()
            waits = list(self._waits.values())
        for w in waits:
            w.ev.set()

    def _on_result(self, m: Optional[Msg]) -> None:
        if m is None:
            with self._lock:
                waits = list(self._waits.values())
            for w in waits:
                w.ev.set()
            return
        try:
            r = json.loads(bytes(m.data)) if m.headers.get("Content-Type") == "application/json" else cbor.loads(bytes(m.data))
        except Exception:  # noqa: BLE001 - not an answer of ours
            return
        tag = r.get("tag", 0) or 0
        with self._lock:
            if tag == 0:
                # The answer to a frame that could not be run: it fails every wait.
                self._untagged.extend(r.get("errors") or [])
                waits = list(self._waits.values())
                for w in waits:
                    w.result = r
            else:
                w = self._waits.get(tag)
                if w is None:
                    return  # an answer no longer waited for (replayed after a takeover, or asked twice)
                if w.result is not None and w.result.get("tag"):
                    return  # the first answer wins (an op asked twice is answered twice)
                w.result = r
                waits = [w]
        for w in waits:
            w.ev.set()

    def _call(self, op: dict, timeout: Optional[float]) -> dict:
        """Sends op (a read, sync or close) with a fresh tag in a frame of its
        own and waits for the answer, within timeout (read_timeout).

        When no answer has come after frame_check, the frame is published
        again asking for the stream's acknowledgement (its Nats-Msg-Id: stored
        once): a refusal fails the call; once stored, the call checks at
        doubling intervals up to a second apart that the stream still has a
        leader and the device a live worker, and asks again (op, same tag, in
        a frame of its own: the first answer wins) when the connection was
        made again since the op went out, or when the device's registry entry
        says its worker has applied the frame's stream sequence and no answer
        came (lost on the worker's side). When the fabric does not answer for
        fail_fast seconds the call raises FabricUnavailableError naming the
        cause (DisconnectedError, NoLeaderError, NoQuorumError), and when no
        worker serves the device for device_timeout, NoDeviceError; the frame
        then goes on being published in the background, so that the session
        carries on when the fabric is back."""
        if self.record:
            if self.graph is not None:
                raise FabricError("a graph cannot %s: name its outputs in Graph.define" % op.get("op"))
            raise FabricError("a job cannot read or sync: name its outputs when submitting")
        if self._failure is not None:
            raise self._failure
        self._next_tag += 1
        tag = op["tag"] = self._next_tag
        name = op.get("op", "")
        w = _Wait()
        with self._lock:
            self._waits[tag] = w
        try:
            self._queue(op)
            fr = self.flush(waited=True)
            total = self.f.read_timeout if timeout is None else timeout
            deadline = time.monotonic() + total
            wait = self.f.frame_check
            stored, seq = False, 0
            trouble: Optional[float] = None  # since when the fabric has not answered
            down: List[Optional[float]] = [None]  # since when the device has had no live worker
            lost = self.f.conn.reconnects  # what can lose an answer: the connection made again
            while True:
                now = time.monotonic()
                step = deadline - now if wait <= 0 else min(deadline - now, wait)
                if w.ev.wait(max(0.0, step)):
                    break
                if time.monotonic() >= deadline:
                    if not stored and fr is not None:
                        self._redeliver(fr, TimeoutError("not yet confirmed stored"))
                    why = ""
                    if self.f.conn.status != CONNECTED:
                        why = ": %s" % self.f.conn.disconnected_error()
                    raise TimeoutError("%s on %s: no answer within %.1fs%s" % (name, self.device, total, why))
                if wait <= 0 or fr is None:
                    continue
                probed = time.monotonic()
                try:
                    stored, seq = self._confirm(fr, stored, seq)
                    applied = self._applied(down)
                except _Refused as e:
                    if w.ev.is_set():
                        break
                    if not e.no_stream:
                        self._replace(fr.n)
                    earlier = self._take_refusals()
                    raise FabricError("%s on %s: frame %d of session %s was not stored by stream %s: %s%s" % (
                        name, self.device, fr.n, self.token, self.f.ops_stream, e,
                        "; and before it: %s" % earlier if earlier else "")) from None
                except FabricUnavailableError as e:
                    if w.ev.is_set():
                        break
                    if trouble is None:
                        trouble = probed
                    if time.monotonic() - trouble >= self.f.fail_fast:
                        if not stored:
                            self._redeliver(fr, e)
                        raise type(e)("%s on %s: %s" % (name, self.device, e)) from None
                except NoDeviceError as e:
                    if w.ev.is_set():
                        break
                    if not stored:
                        self._redeliver(fr, e)
                    raise NoDeviceError("%s on %s: %s" % (name, self.device, e)) from None
                else:
                    trouble = None
                    now_lost = self.f.conn.reconnects
                    if now_lost != lost or (seq > 0 and applied >= seq):
                        if w.ev.is_set():
                            break
                        # The answer was lost: ask again, in a frame of its own.
                        lost = now_lost
                        self.reasked += 1
                        fr = self._again(op)
                        stored, seq = False, 0
                wait = min(2 * wait, _MAX_FRAME_CHECK)
        finally:
            with self._lock:
                self._waits.pop(tag, None)
        if w.result is None:
            if self._failure is not None:
                raise self._failure
            raise self.f.conn._closed or ConnectionClosedError("connection closed")
        errs = w.result.get("errors") or []
        if w.result.get("tag", 0) == 0:
            with self._lock:
                errs, self._untagged = self._untagged or errs, []
        # A frame sent before this one and refused by the stream is reported
        # here, once (the worker's errors ride along as its cause).
        if fr is not None:
            self._settle(fr.n - 1)
        refused = self._take_refusals()
        if refused is not None:
            if errs:
                raise refused from op_error(errs)
            raise refused
        if errs:
            raise op_error(errs)
        return w.result

    def _again(self, op: dict) -> Optional["_Frame"]:
        """Publishes op (which keeps its tag) once more, in a frame of its own."""
        self.flush()
        self._queue(op)
        return self.flush(waited=True)

    def _confirm(self, fr: "_Frame", stored: bool, seq: int) -> Tuple[bool, int]:
        """Publishes frame fr again asking for the stream's acknowledgement,
        until the stream has said it stores it (returning True and its
        stream sequence); after that, asks the stream's leader for an answer
        that stores nothing (a publish expecting another stream). Raises
        _Refused when the stream refuses the frame, FabricUnavailableError
        when the fabric does not answer."""
        conn = self.f.conn
        if conn.status != CONNECTED:
            raise conn.disconnected_error()
        if not stored:
            try:
                ack = parse_ack(conn.request(self.subject, fr.data, headers=fr.headers, timeout=_PROBE_TIMEOUT), self.subject)
            except NoRespondersError as e:
                if not self.f.tenant and not conn.stream_captures(self.subject):
                    raise _Refused("no stream captures %s" % self.subject, no_stream=True) from None
                raise self.f._diagnose(e) from None
            except JetStreamError as e:
                if not transient(e):
                    raise _Refused(str(e)) from None
                raise self.f._diagnose(e) from None
            except (TimeoutError, DisconnectedError) as e:
                raise self.f._diagnose(e) from None
            # A frame stored already is acknowledged as a duplicate, with
            # the sequence it was stored at.
            with self._cv:
                self._pending.pop(fr.n, None)
                self._cv.notify_all()
            return True, int(ack.get("seq", 0) or 0)
        try:
            parse_ack(conn.request(self.subject, b"", headers={"Nats-Expected-Stream": "-"}, timeout=_PROBE_TIMEOUT),
                      self.subject)
        except JetStreamError as e:
            if transient(e):
                raise self.f._diagnose(e) from None
        except (NoRespondersError, TimeoutError, DisconnectedError) as e:
            raise self.f._diagnose(e) from None
        return stored, seq

    def _applied(self, down: List[Optional[float]]) -> int:
        """The last stream sequence the device's worker applied, while it has
        a live worker (else 0); NoDeviceError once it has shown none since
        down[0] for longer than the fabric's device_timeout. A registry that
        cannot be read says nothing."""
        try:
            d = self.f._device_entry(self.device, _PROBE_TIMEOUT)
        except FabricError:
            return 0
        if d is not None and live(d):
            down[0] = None
            try:
                return int(d.get("applied", 0) or 0)
            except (TypeError, ValueError):
                return 0
        if self.f.device_timeout <= 0:
            return 0
        now = time.monotonic()
        if down[0] is None:
            down[0] = now
            return 0
        gone = now - down[0]
        if gone > self.f.device_timeout:
            state = "not registered"
            if d is not None:
                try:
                    state = "%s, last heartbeat %.1fs ago" % (d.get("state", "?"), time.time() - _parse_time(d.get("beat", "")))
                except ValueError:
                    state = str(d.get("state", "?"))
            raise NoDeviceError("no worker has served %s for %.1fs (%s); start a worker for it (its frames are answered "
                                "no_device and removed after the fabric's grace period)" % (self.device, gone, state))
        return 0

    def sync(self, timeout: Optional[float] = None) -> None:
        """Waits until every op sent ran; raises the errors not yet reported."""
        self._call({"op": "sync"}, timeout)

    def _read(self, t: Tensor, timeout: Optional[float]) -> Array:
        if t.s is not self:
            raise ValueError("tensor of another session")
        r = self._call({"op": "read", "in": [t.id]}, timeout)
        td = r.get("tensor") or {}
        dtype, shape = td.get("dtype", t.dtype), tuple(td.get("shape") or ())
        if td.get("object"):
            data = self.f._fetch_result(td, timeout)
        else:
            data = td.get("data") or b""
        t.dtype, t.shape = dtype, shape
        return Array(dtype, shape, data)

    def close(self, timeout: Optional[float] = None) -> None:
        """Frees every tensor of the session and forgets it; raises errors not yet reported."""
        if self.closed:
            return
        answered = False
        try:
            if not self.record:
                self._call({"op": "close"}, timeout)
                answered = True
        finally:
            self.closed = True
            if not self.record:
                self.f.conn.unsubscribe(self._sub)
                with self._cv:
                    if answered:
                        # The worker ran every frame before the close: the
                        # stream has them all.
                        self._pending.clear()
                    drained = not self._pending
                if drained:
                    self.f.conn.drop_reply(self._ack_token)
                self.f._forget(self)

    def _drained(self) -> None:
        """The redelivery thread's news that a closed session's frames are all stored."""
        if self.closed:
            self.f.conn.drop_reply(self._ack_token)


# The redelivery of a frame: waits from _REDELIVER_WAIT doubling to
# _REDELIVER_MAX between publishes that failed.
_REDELIVER_WAIT = 0.05
_REDELIVER_MAX = 2.0
# A call's checks are at most _MAX_FRAME_CHECK apart, each of its requests
# bounded by _PROBE_TIMEOUT: a call fails at most fail_fast + 1 s + 1.5 s
# after the fabric stopped answering it.
_MAX_FRAME_CHECK = 1.0
_PROBE_TIMEOUT = 0.75
# A call waits at most _SETTLE_WAIT for the stream's answers to the frames
# sent before its own (see Session._settle).
_SETTLE_WAIT = 1.0


class _Frame:
    """A frame of a session: its number, bytes and headers, and, while the
    stream has not said it stores it, when to publish it again (due), the
    backoff (wait), since when it waits (since) and the last failure (err);
    replacement marks an empty frame published in place of a refused one."""

    __slots__ = ("n", "data", "headers", "due", "wait", "since", "err", "replacement")

    def __init__(self, n: int, data: bytes, headers: Dict[str, str]):
        self.n = n
        self.data = data
        self.headers = headers
        self.due = 0.0
        self.wait = _REDELIVER_WAIT
        self.since = 0.0
        self.err: Optional[Exception] = None
        self.replacement = False


class _Refused(Exception):
    """A stream's refusal of a frame (inside _call); no_stream when no stream
    captures the session's subject."""

    def __init__(self, why: str, no_stream: bool = False):
        super().__init__(why)
        self.no_stream = no_stream


# -- jobs -------------------------------------------------------------------

class Job(Session):
    """A session that records ops instead of sending them: a stateless op
    program any worker of a device kind can run (Fabric.submit). Uploads
    over the inline limit are written to the object store at once and named
    by reference."""

    def __init__(self, fabric: "Fabric"):
        super().__init__(fabric, "job", token="job", record=True)


class JobResult:
    """A finished job: outputs (their dtype, shape and object) and errors."""

    def __init__(self, fabric: "Fabric", r: dict):
        self.f = fabric
        self.raw = r
        self.id: str = r.get("id", "")
        self.worker: str = r.get("worker", "")
        self.attempt: int = r.get("attempt", 0)
        self.outputs: List[dict] = r.get("outputs") or []
        self.errors: List[dict] = r.get("errors") or []

    def check(self) -> None:
        """Raises the job's errors, if it failed."""
        if self.errors:
            raise op_error(self.errors)

    def output(self, i: int) -> Array:
        """The value of output i."""
        self.check()
        o = self.outputs[i]
        data = self.f.objects.get(o["object"])
        return Array(o["dtype"], o.get("shape") or (), data)


# -- graphs -----------------------------------------------------------------

# Ops a graph cannot hold: they talk to the client or to other devices, or
# change the session rather than make tensors (docs/PROTOCOL.md §11).
_HOST_OPS = ("upload", "read", "sync", "seed", "close", "checkpoint", "expose", "import",
             "all_reduce", "all_gather", "reduce_scatter", "broadcast", "replay")

# The attributes a scalar placeholder may set.
_BIND_ATTRS = ("value", "low", "high", "mean", "std", "eps", "p", "lr", "t")


class GraphDef:
    """A captured graph as stored: name (the SHA-256 of the canonical CBOR
    definition, hex), definition (the decoded map), data (its bytes),
    inputs (each placeholder's dtype and shape), scalars (how many scalar
    placeholders), outputs (local ids) and internal (the ids a replay
    reserves: one for every tensor the graph makes)."""

    def __init__(self, definition: dict, data: bytes, output_metas: Optional[List[Tuple[str, Optional[Shape]]]] = None):
        import hashlib
        self.definition = definition
        self.data = data
        self.name = hashlib.sha256(data).hexdigest()
        self.inputs: List[Tuple[str, Shape]] = [(p.get("dtype", ""), tuple(p.get("shape") or ()))
                                                for p in definition.get("inputs") or []]
        self.scalars: int = int(definition.get("scalars", 0) or 0)
        self.outputs: List[int] = list(definition.get("outputs") or [])
        self.internal = sum(len(op.get("out") or []) for op in definition.get("ops") or [])
        self.output_metas = output_metas or []

    def __repr__(self) -> str:
        return "GraphDef(%s, %d ops, %d inputs, %d outputs)" % (self.name[:12], len(self.definition.get("ops") or []),
                                                               len(self.inputs), len(self.outputs))


class Graph:
    """Records a program for replay (docs/PROTOCOL.md §11): ops built on
    its session are kept, never sent. Its tensors start at placeholders
    (input), its float attributes may take scalar placeholders (scalar and
    bind); define stores it and returns the GraphDef that Session.replay
    runs. A replay runs the ops exactly as the session would run them sent
    one by one at that point, with the same ids, so random ops draw the
    same bits; the tensors the graph makes and does not output are freed
    on the worker once the graph is done with them.

    >>> g = fab.graph()
    >>> x = g.input("f32", [2, 3])
    >>> lr = g.scalar(0.1)
    >>> step = g.session.full([2, 3], 0.1)
    >>> g.bind(step, "value", lr)
    >>> d = g.define(x - step)
    >>> (y,) = s.replay(d, [s.tensor([[1.0] * 3] * 2)], [0.5])
    """

    def __init__(self, fabric: "Fabric"):
        self.f = fabric
        self.s = Session(fabric, "graph", token="graph", record=True)
        self.s.graph = self
        self._inputs: List[int] = []
        self._metas: List[dict] = []
        self._scalars: List[float] = []
        self._names: List[str] = []
        self._binds: List[dict] = []

    @property
    def session(self) -> Session:
        """The recording session: build the graph's ops on it and on its tensors."""
        return self.s

    def input(self, dtype: str, shape: Sequence[int]) -> Tensor:
        """A tensor placeholder of dtype and shape; a replay binds a session
        tensor of exactly that dtype and shape to it."""
        _check_dtype(dtype)
        shape = [int(d) for d in shape]
        t = Tensor(self.s, self.s._id(), dtype, shape)
        self._inputs.append(t.id)
        self._metas.append({"dtype": dtype, "shape": shape})
        return t

    def scalar(self, value: float, name: str = "") -> int:
        """A scalar placeholder, numbered from 0; value is the one the graph
        is validated with, each replay gives its own. A name given before
        returns that placeholder again, so parts of a program share it."""
        if name and name in self._names:
            return self._names.index(name)
        self._scalars.append(float(value))
        self._names.append(name)
        return len(self._scalars) - 1

    def bind(self, t: Tensor, attr: str, scalar: int) -> None:
        """Makes attribute attr of the op that made t take scalar placeholder
        scalar at each replay (attr: value, low, high, mean, std, eps, p, lr, t)."""
        if not 0 <= scalar < len(self._scalars):
            raise ValueError("bind: scalar %d of %d" % (scalar, len(self._scalars)))
        if attr not in _BIND_ATTRS:
            raise ValueError("bind: attribute %r cannot take a scalar (one of %s)" % (attr, ", ".join(_BIND_ATTRS)))
        if not isinstance(t, Tensor) or t.s is not self.s:
            raise ValueError("bind takes a tensor of the graph")
        for k in range(len(self.s._ops) - 1, -1, -1):
            if t.id in (self.s._ops[k].get("out") or ()):
                self._binds.append({"op": k, "attr": attr, "scalar": scalar})
                return
        raise ValueError("bind: tensor %d is a placeholder, not made by an op of the graph" % t.id)

    def build(self, *outputs: Tensor) -> GraphDef:
        """The definition of the graph with outputs, not stored. Ids are
        renumbered to the canonical spelling (placeholders 1..n, then the
        tensors made in order) and the map is encoded canonically, so the
        same program always has the same name."""
        local: Dict[int, int] = {tid: j + 1 for j, tid in enumerate(self._inputs)}
        nxt = len(self._inputs) + 1
        ops = []
        for k, op in enumerate(self.s._ops):
            name = op.get("op", "")
            if name in _HOST_OPS:
                raise ValueError("a graph cannot hold %s (op %d)" % (name, k))
            o = dict(op)
            ins = []
            for tid in op.get("in") or ():
                if tid not in local:
                    raise ValueError("op %d (%s) of the graph reads tensor %d, made outside the graph" % (k, name, tid))
                ins.append(local[tid])
            outs = []
            for tid in op.get("out") or ():
                local[tid] = nxt
                outs.append(nxt)
                nxt += 1
            o.pop("in", None)
            o.pop("out", None)
            if ins:
                o["in"] = ins
            if outs:
                o["out"] = outs
            ops.append(o)
        out_ids, metas = [], []
        for j, t in enumerate(outputs):
            if not isinstance(t, Tensor) or t.s is not self.s or t.id not in local:
                raise ValueError("output %d is not a tensor of the graph" % j)
            out_ids.append(local[t.id])
            metas.append((t.dtype, t.shape))
        d: Dict[str, Any] = {"v": PROTOCOL_VERSION, "ops": ops}
        if self._metas:
            d["inputs"] = [dict(m) for m in self._metas]
        if self._scalars:
            d["scalars"] = len(self._scalars)
        if out_ids:
            d["outputs"] = out_ids
        if self._binds:
            d["binds"] = [dict(b) for b in self._binds]
        data = cbor.dumps_canonical(d)
        if len(data) > _MAX_GRAPH_BYTES:
            raise ValueError("graph definition of %d bytes, at most %d" % (len(data), _MAX_GRAPH_BYTES))
        return GraphDef(d, data, metas)

    def define(self, *outputs: Tensor) -> GraphDef:
        """Builds the graph with outputs and stores it where every worker
        finds it (Fabric.store_graph); storing a graph stored before changes nothing."""
        g = self.build(*outputs)
        self.f.store_graph(g)
        return g


_MAX_GRAPH_BYTES = 1 << 20


# -- the fabric -------------------------------------------------------------

def _parse_time(s: str) -> float:
    clock, frac = s.rstrip("Z"), "0"
    if "+" in clock:
        clock = clock.split("+", 1)[0]
    if "." in clock:
        clock, frac = clock.split(".", 1)
    return calendar.timegm(time.strptime(clock, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac)


def live(device: dict, now: Optional[float] = None, within: float = 10.0) -> bool:
    """Whether a registry entry is of a live device: serving, recent heartbeat."""
    now = time.time() if now is None else now
    try:
        return device.get("state") == "serving" and now - _parse_time(device.get("beat", "")) < within
    except ValueError:
        return False


class Fabric:
    """A connection to a jetfabric broker.

    url is one broker URL, several separated by commas, or a list of them
    (the nodes of a cluster): the connection is made to the first that
    answers and, when lost, made again to any of them (the connection's
    options, reconnect_time, reconnect_wait, reconnect_max_wait,
    reconnect_buffer, ping_interval, TLS, go to jetfabric.nats.Connection).
    timeout bounds requests and connecting; read_timeout a read, sync or
    close; fail_fast how long such a call goes on while the fabric does not
    answer (no connection, no stream leader, no quorum) before it raises
    FabricUnavailableError naming the cause; device_timeout how long it
    waits for a device no worker serves before NoDeviceError (0: no limit
    but read_timeout); frame_check when it first checks on a late answer.

    >>> fab = Fabric("nats://127.0.0.1:4222")
    >>> with fab.session() as s:
    ...     x = s.tensor([[1.0, 2.0], [3.0, 4.0]])
    ...     print((x @ x).tolist())
    """

    def __init__(self, url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222", prefix: str = "fabric", timeout: float = 10.0,
                 read_timeout: float = 60.0, max_ops: int = 4096, max_frame: int = 1 << 20,
                 inline_upload: int = 1 << 20, publish_window: int = 256, frame_check: float = 0.2,
                 creds: str = "", tenant: str = "", heartbeat: float = 30.0, fail_fast: float = 2.75,
                 device_timeout: float = 30.0, **conn_opts: Any):
        self.prefix = prefix
        upper = prefix.upper().replace("-", "_")
        self.ops_stream = upper + "_OPS"
        self.ctrl_bucket = upper + "_CTRL"
        self.xfer_bucket = upper + "_XFER"
        self.graph_bucket = upper + "_GRAPHS"
        if heartbeat < 0:
            raise ValueError("heartbeat %r: want seconds between beats, or 0 for none" % heartbeat)
        if not 0.1 <= fail_fast <= 3600:
            raise ValueError("fail_fast %r: want seconds in [0.1, 3600]" % (fail_fast,))
        if device_timeout < 0:
            raise ValueError("device_timeout %r: want seconds >= 0 (0: wait for the call's timeout alone)" % (device_timeout,))
        if publish_window < 1:
            raise ValueError("publish_window %r: want at least 1 frame" % (publish_window,))
        self.fail_fast = fail_fast
        self.device_timeout = device_timeout
        self.heartbeat = heartbeat
        self.inbox_prefix = "_INBOX_" + prefix
        self.space = prefix
        if creds and not tenant:
            from . import nkeys
            try:
                claims = nkeys.jwt_claims(nkeys.read_creds(creds)[0])
            except (OSError, ValueError) as e:
                raise FabricError("creds %s: %s" % (creds, e)) from None
            perms = (claims.get("nats") or {}).get("pub") or {}
            if perms.get("allow"):  # the service user has no permissions
                tenant = claims.get("name", "")
        # A tenant's frames, replies and objects (docs/PROTOCOL.md, Tenants).
        self.tenant = tenant
        if tenant:
            self.space = "%s.t.%s" % (prefix, tenant)
            self.inbox_prefix = "_INBOX_%s.t.%s" % (prefix, tenant)
            self.xfer_bucket = "%s_XFER_%s" % (upper, tenant)
        if creds:
            conn_opts["creds"] = creds
        self.timeout = timeout
        self.read_timeout = read_timeout
        self.conn = Connection(url, timeout=timeout, inbox_prefix=self.inbox_prefix, **conn_opts)
        self.max_ops = max_ops
        self.max_frame = min(max_frame, self.conn.max_payload - 4096)
        self.inline_upload = min(inline_upload, self.max_frame - 1024)
        self.publish_window = publish_window
        self.frame_check = frame_check
        self.objects = ObjectStore(self.conn, self.xfer_bucket, timeout=max(timeout, 30.0))
        self._buckets: Dict[str, ObjectStore] = {}
        self._sessions: List[Session] = []
        self._default: Optional[Session] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beater: Optional[threading.Thread] = None
        # The redelivery thread publishes again the frames whose
        # acknowledgement has not come (see Session.flush): it runs from
        # the first frame that needs it until close.
        self._redelivering: Dict[int, Session] = {}
        self._wake = threading.Event()
        self._redeliverer: Optional[threading.Thread] = None
        self.conn.add_listener(self._on_conn)

    def __enter__(self) -> "Fabric":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes every open session, then the connection."""
        for s in list(self._sessions):
            try:
                s.close(timeout=5)
            except FabricError:
                pass
        self._stop.set()
        self._wake.set()
        self.conn.close()  # first: a beat blocked in a send fails at once
        for t in (self._beater, self._redeliverer):
            if t is not None and t is not threading.current_thread():
                t.join(5)

    def _on_conn(self, event: str) -> None:
        """The connection's news (reader thread): once made again, the frames
        whose acknowledgement was lost go out at once."""
        if event == "reconnected":
            self._wake_redeliver()

    def _wake_redeliver(self) -> None:
        self._wake.set()

    def _track(self, s: Session) -> None:
        """Hands session s's unacknowledged frames to the redelivery thread."""
        with self._lock:
            self._redelivering[id(s)] = s
            if self._redeliverer is None and not self._stop.is_set():
                self._redeliverer = threading.Thread(target=self._redelivery, name="jetfabric-redeliver", daemon=True)
                self._redeliverer.start()

    def _redelivery(self) -> None:
        """Publishes again, while connected, every frame that is due: its
        acknowledgement late (ACK_WAIT), lost with the connection, or a
        failure that says nothing about it (after a backoff). Frames of one
        session go out in the order of their numbers. Runs until close."""
        while not self._stop.is_set():
            self._wake.clear()
            now = time.monotonic()
            nxt = now + 1.0
            with self._lock:
                sessions = list(self._redelivering.values())
            if self.conn.status == CONNECTED:
                for s in sessions:
                    for fr in s._due(now):
                        s._republish(fr)
            for s in sessions:
                due = s._next_due()
                if due is None:
                    with self._lock:
                        if s._next_due() is None:
                            self._redelivering.pop(id(s), None)
                            s._drained()
                else:
                    nxt = min(nxt, due)
            self._wake.wait(max(0.0, nxt - time.monotonic()))

    def undelivered(self) -> Tuple[int, float, Optional[Exception]]:
        """How many frames wait for the stream's acknowledgement (published,
        not yet acknowledged), how long the oldest has waited (seconds), and
        the last failure among them."""
        with self._lock:
            sessions = list(self._redelivering.values())
        n, oldest, last = 0, 0.0, None
        now = time.monotonic()
        for s in sessions:
            with s._cv:
                for fr in s._pending.values():
                    n += 1
                    if now - fr.since > oldest:
                        oldest, last = now - fr.since, fr.err
        return n, oldest, last

    def _diagnose(self, err: Exception) -> FabricUnavailableError:
        """Words err, a JetStream request that failed for want of an answer,
        by what the fabric can still say: the connection, then JetStream's
        meta leader, which answers the stream-by-subject lookup."""
        conn = self.conn
        if conn.status != CONNECTED:
            return conn.disconnected_error()  # type: ignore[return-value]
        at = conn.info.get("server_name") or conn.url
        if isinstance(err, JetStreamError) and err.err_code == ERR_DUP_IN_PROCESS:
            return NoQuorumError("stream %s has a leader that cannot store (%s): a majority of the nodes holding it are "
                                 "down or cut off from it: bring them back; calls carry on once they are" % (self.ops_stream, err))
        if self.tenant:
            # A tenant may not ask JetStream about the fabric's streams.
            return NoLeaderError("stream %s did not answer (%s)" % (self.ops_stream, err))
        try:
            conn.js_api("STREAM.NAMES", {"subject": "%s.ops.x.x" % self.prefix}, timeout=_PROBE_TIMEOUT / 2)
        except JetStreamError as merr:
            if merr.code != 503:
                return NoLeaderError("stream %s did not answer (%s)" % (self.ops_stream, err))
            meta: Exception = merr
        except FabricError as merr:
            if conn.status != CONNECTED:
                return conn.disconnected_error()  # type: ignore[return-value]
            meta = merr
        else:
            return NoLeaderError("stream %s did not answer (%s); its leader is down and the others are electing one, or "
                                 "a majority of the nodes holding it are down: bring them back; calls carry on once it has "
                                 "a leader" % (self.ops_stream, err))
        return NoQuorumError("JetStream has no meta leader (the stream: %s; JetStream: %s): a majority of the cluster's "
                             "nodes are down or cut off from the node this client is on (%s): bring them back; calls "
                             "carry on once they are" % (err, meta, at))

    def _beat(self) -> None:
        """Tells the workers, every heartbeat seconds, that the open sessions
        are alive (docs/PROTOCOL.md §1), so that a session waiting on its
        client is not freed as idle: an empty core NATS message on
        <prefix>.alive.<device>.<session> each. Runs from the first session
        until close; a lost beat is made up by the next."""
        while not self._stop.wait(self.heartbeat):
            with self._lock:
                subjects = ["%s.alive.%s.%s" % (self.prefix, s.device, s.token) for s in self._sessions if not s.closed]
            for subj in subjects:
                try:
                    self.conn.publish(subj, b"")
                except DisconnectedError:
                    break  # reconnecting, its buffer full: the next beat makes up for it
                except FabricError:
                    return  # the connection is gone for good: nothing to keep alive

    def _forget(self, s: Session) -> None:
        with self._lock:
            if s in self._sessions:
                self._sessions.remove(s)
            if self._default is s:
                self._default = None

    # -- devices -------------------------------------------------------------

    def devices(self) -> List[dict]:
        """Every device's registry entry (docs §8), sorted by name. A tenant
        asks the broker's registry service (docs §14)."""
        if self.tenant:
            m = self.conn.request("%s.svc.registry" % self.prefix, b"")
            if m.headers.get("Nats-Service-Error"):
                raise FabricError("device registry: %s" % m.headers.get("Nats-Service-Error"))
            return sorted(json.loads(bytes(m.data)), key=lambda d: d.get("name", ""))
        stream = "KV_" + self.ctrl_bucket
        prefix = "$KV.%s.device." % self.ctrl_bucket
        info = self.conn.js_api("STREAM.INFO." + stream, {"subjects_filter": prefix + ">"})
        out = []
        for subject in sorted((info.get("state") or {}).get("subjects") or {}):
            try:
                got = self.conn.js_api("STREAM.MSG.GET." + stream, {"last_by_subj": subject})
            except JetStreamError as e:
                if e.code == 404:
                    continue
                raise
            msg = got["message"]
            import base64
            if msg.get("hdrs"):
                from .nats import parse_headers
                h, _ = parse_headers(base64.b64decode(msg["hdrs"]))
                if h.get("KV-Operation") in ("DEL", "PURGE"):
                    continue
            raw = base64.b64decode(msg.get("data") or "")
            if raw:
                out.append(json.loads(raw))
        out.sort(key=lambda d: d.get("name", ""))
        return out

    def device(self, name: str) -> Optional[dict]:
        """A device's registry entry, or None when it is not registered (or
        cannot be read)."""
        try:
            return self._device_entry(name)
        except FabricError:
            return None

    def _device_entry(self, name: str, timeout: Optional[float] = None) -> Optional[dict]:
        """A device's registry entry, or None when it is not registered, by a
        direct get of its key; FabricError when the registry cannot be read.
        A direct get may be answered by a replica that has not caught up (a
        cluster node just started again): before calling a device
        unregistered, the stream's leader is asked (STREAM.MSG.GET)."""
        subject = "$KV.%s.device.%s" % (self.ctrl_bucket, name)
        m = self.conn.request("$JS.API.DIRECT.GET.KV_%s.%s" % (self.ctrl_bucket, subject), b"", timeout=timeout)
        if m.status and m.status != "404":
            raise JetStreamError("registry entry %s: status %s %s" % (name, m.status, m.headers.get("Description", "")),
                                 int(m.status) if m.status.isdigit() else 0, 0, m.headers.get("Description", ""))
        if m.status == "404" or not m.data or m.headers.get("KV-Operation") in ("DEL", "PURGE"):
            if self.tenant:
                # A tenant may not ask the stream's leader: the registry
                # service reads the entries through a watch the leader serves.
                return self._registry_service_entry(name, timeout)
            try:
                r = self.conn.js_api("STREAM.MSG.GET.KV_" + self.ctrl_bucket, {"last_by_subj": subject}, timeout=timeout)
            except JetStreamError as e:
                if e.code == 404:
                    return None
                raise
            msg = r.get("message") or {}
            import base64
            if msg.get("hdrs") and b"KV-Operation" in base64.b64decode(msg["hdrs"]):
                return None
            raw = base64.b64decode(msg.get("data") or "")
            return json.loads(raw) if raw else None
        if m.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        return json.loads(bytes(m.data))

    def _registry_service_entry(self, name: str, timeout: Optional[float] = None) -> Optional[dict]:
        """Device name's entry in the broker's registry service's list
        (<prefix>.svc.registry, docs/PROTOCOL.md §14: the stream leader's
        view), or None when the list does not hold it."""
        m = self.conn.request("%s.svc.registry" % self.prefix, b"", timeout=timeout)
        if m.headers.get("Nats-Service-Error"):
            raise FabricError("device registry: %s" % m.headers.get("Nats-Service-Error"))
        try:
            devs = json.loads(bytes(m.data))
        except ValueError as e:
            raise FabricError("device registry: undecodable answer: %s" % e) from None
        for d in devs if isinstance(devs, list) else []:
            if isinstance(d, dict) and d.get("name") == name:
                return d
        return None

    def live_devices(self) -> List[str]:
        """The names of the live devices."""
        return [d["name"] for d in self.devices() if live(d)]

    def session(self, device: Optional[str] = None) -> Session:
        """Opens a session on device (default: the first live device).

        The device must be registered and live (serving, with a heartbeat
        under 10 s old), as the Go client's Open requires: a name that is not
        a device token (1 to 64 of A-Z a-z 0-9 _ -) raises ValueError; a
        device the registry does not hold, or whose entry is not live, raises
        NoDeviceError saying which (a registry read by a direct get, which any
        replica answers, is checked with the stream's leader, or for a tenant
        with the broker's registry service, before the device is called
        unregistered or not serving); a registry that cannot be read raises
        FabricError."""
        if device is None:
            names = self.live_devices()
            if not names:
                raise FabricError("no live device is registered in %s: start a worker" % self.ctrl_bucket)
            device = names[0]
        self._check_device(device)
        s = Session(self, device)
        with self._lock:
            self._sessions.append(s)
            if self._beater is None and self.heartbeat > 0:
                self._beater = threading.Thread(target=self._beat, name="jetfabric-heartbeat", daemon=True)
                self._beater.start()
        return s

    open = session

    def _check_device(self, device: str) -> None:
        """Raises unless device is a registered, live device (see session)."""
        if not isinstance(device, str) or not _TOKEN.fullmatch(device):
            raise ValueError("device %r: want 1 to 64 characters of A-Z a-z 0-9 _ - (python -m jetfabric devices lists "
                             "the devices)" % (device,))
        try:
            d = self._device_entry(device)
        except FabricError as e:
            raise type(e)("device registry %s: %s" % (self.ctrl_bucket, e)) from None
        except ValueError as e:  # an entry that is not JSON
            raise FabricError("registry entry %s: %s" % (device, e)) from None
        if d is None:
            raise NoDeviceError("%s is not registered (python -m jetfabric devices lists them)" % device)
        if not live(d) and self.tenant:
            # A tenant's direct get may be answered by a replica that has
            # not caught up: the registry service reads the leader's.
            try:
                ld = self._registry_service_entry(device)
            except FabricError:
                ld = None
            if ld is not None:
                d = ld
        if not live(d):
            try:
                ago = "%.0fs ago" % (time.time() - _parse_time(d.get("beat", "")))
            except (ValueError, TypeError, AttributeError):
                ago = "unknown"
            raise NoDeviceError("%s is %s, last heartbeat %s: no worker serves it (start one)" % (
                device, d.get("state") or "not serving", ago))

    def default_session(self) -> Session:
        """The session tensor() uses, opened on the first live device when first needed."""
        with self._lock:
            s = self._default
        if s is None or s.closed:
            s = self.session()
            with self._lock:
                self._default = s
        return s

    def tensor(self, obj: Any, dtype: Optional[str] = None) -> Tensor:
        """A tensor in the default session (see Session.tensor)."""
        return self.default_session().tensor(obj, dtype)

    # -- uploads and large results -------------------------------------------

    def _upload_object(self, s: Session, op: Dict[str, Any], mv: memoryview) -> None:
        """Uploads through the object store (docs §7), named by content as
        upload-<sha256 hex>, so the same bytes are stored once.

        A session's upload sends its op at once, naming an alias,
        upload-<chunk subject token>, and the chunk subject, so the worker
        copies every chunk as the broker takes it; the chunks go out while
        another thread hashes them. When the digest is known, either those
        bytes were stored before (the write stops and its chunks are purged)
        or the write finishes under the digest's name; either way the alias
        is then made a link to the object named by the digest. A failed
        write marks the alias deleted with the reason, which the worker
        reports. A job's upload is written whole first (its op must name a
        complete object)."""
        nuid = secrets.token_hex(16)
        target: List[str] = []

        def named(sha: bytes) -> str:
            target.append("upload-" + sha.hex())
            return target[0]

        if s.record:
            # Stored before or written now, the object is complete when the op is queued.
            self.objects.put(named, mv, nuid=nuid)
            op["object"] = target[0]
            s._queue(op)
            return
        alias = "upload-" + nuid
        op["object"], op["nuid"] = alias, nuid
        s._queue(op)
        s.flush()
        try:
            self.objects.put(named, mv, nuid=nuid)  # None when those bytes were stored before
            self.objects.link(alias, target[0])
        except BaseException as e:
            # The worker follows the alias: tell it why nothing will come.
            try:
                self.objects.abort(alias, nuid, "the client's upload failed: %s" % (e or type(e).__name__))
            except FabricError:
                pass
            raise

    def _fetch_result(self, td: dict, timeout: Optional[float]) -> bytearray:
        name = td["object"]
        wait = self.read_timeout if timeout is None else timeout
        store = self._bucket(td.get("bucket") or self.xfer_bucket)
        if td.get("nuid"):
            size = None
            if td.get("dtype") in DTYPES:
                size = _numel(td.get("shape") or ()) * DTYPES[td["dtype"]][0]
            data, meta = store.follow(name, td["nuid"], timeout=wait, size=size)
        else:
            meta = store.wait(name, timeout=wait)
            data = store.get(name, meta)
        try:
            store.delete(name, meta, wait=False)
        except FabricError:
            pass
        return data

    def _bucket(self, bucket: str) -> ObjectStore:
        """The object bucket a result names (FABRIC_RESULTS, in the broker's
        memory, for the single-user sessions), on this client's connection."""
        if bucket == self.objects.bucket:
            return self.objects
        with self._lock:
            store = self._buckets.get(bucket)
            if store is None:
                if not bucket or any(not (c.isalnum() or c in "_-") for c in bucket):
                    raise ObjectStoreError("a result names the object bucket %r" % bucket)
                store = self._buckets[bucket] = ObjectStore(self.conn, bucket, timeout=self.objects.timeout)
            return store

    # -- graphs ----------------------------------------------------------------

    def graph(self) -> Graph:
        """A new graph to record ops into (see Graph)."""
        return Graph(self)

    def store_graph(self, g: GraphDef) -> None:
        """Stores g in the graph bucket (key-value, FABRIC_GRAPHS) under its
        name with a create; a key that exists holds the same bytes, so that
        is success too."""
        import hashlib
        if hashlib.sha256(g.data).hexdigest() != g.name:
            raise ValueError("graph definition named %s does not hash to its name" % g.name[:12])
        subject = "$KV.%s.%s" % (self.graph_bucket, self._graph_key(g.name))
        try:
            # A create published again (its acknowledgement lost) finds the
            # key it made: success too.
            self.conn.js_publish(subject, g.data, headers={"Nats-Expected-Last-Subject-Sequence": "0"}, retry=True)
        except JetStreamError as e:
            if e.err_code != 10071:  # wrong last sequence: the key exists
                raise JetStreamError("store graph %s: %s" % (g.name[:12], e), e.code, e.err_code, e.description) from None

    def _graph_key(self, name: str) -> str:
        """The key of graph name in the graph bucket: a tenant's keys are
        t.<tenant>.<name> (docs/PROTOCOL.md, Tenants)."""
        return "t.%s.%s" % (self.tenant, name) if self.tenant else name

    def load_graph(self, name: str) -> GraphDef:
        """The stored graph named name (64 hex digits)."""
        import hashlib
        if len(name) != 64 or any(c not in "0123456789abcdef" for c in name):
            raise ValueError("graph name %r: want 64 lower-case hex digits" % name)
        # The direct get in its subject form: the one a tenant may use.
        m = self.conn.request("$JS.API.DIRECT.GET.KV_%s.$KV.%s.%s" % (self.graph_bucket, self.graph_bucket, self._graph_key(name)), b"")
        if m.status and m.status not in ("200", "404"):
            raise JetStreamError("load graph %s: status %s %s" % (name[:12], m.status, m.headers.get("Description", "")),
                                 int(m.status), 0, m.headers.get("Description", ""))
        if m.status == "404" or not m.data or m.headers.get("KV-Operation") in ("DEL", "PURGE"):
            raise FabricError("graph %s is not stored in %s" % (name, self.graph_bucket))
        data = bytes(m.data)
        if hashlib.sha256(data).hexdigest() != name:
            raise FabricError("graph %s: the stored bytes hash to another name" % name)
        d = cbor.loads(data)
        if not isinstance(d, dict) or d.get("v") != PROTOCOL_VERSION:
            raise FabricError("graph %s: not a version %d definition" % (name, PROTOCOL_VERSION))
        return GraphDef(d, data)

    # -- jobs ----------------------------------------------------------------

    def job(self) -> Job:
        """A new job to record ops into (see Job)."""
        return Job(self)

    def submit(self, kind: str, job: Job, outputs: Sequence[Tensor]) -> str:
        """Publishes job for workers of device kind ("cpu", "gpu") and returns its id."""
        if not isinstance(job, Job):
            raise TypeError("submit takes a Job from Fabric.job()")
        jid = secrets.token_hex(16)
        body = {"v": PROTOCOL_VERSION, "id": jid, "ops": job._ops, "outputs": [t.id for t in outputs]}
        # The job's id as its Nats-Msg-Id: published again when its
        # acknowledgement is lost, it is stored once.
        self.conn.js_publish("%s.jobs.%s" % (self.prefix, kind), cbor.dumps(body), headers={"Nats-Msg-Id": "job-" + jid})
        return jid

    def wait_job(self, job_id: str, timeout: float = 60.0) -> JobResult:
        """Waits for the result of job job_id."""
        subject = "$KV.%s.job.%s" % (self.ctrl_bucket, job_id)
        sub = self.conn.subscribe(subject)
        try:
            m = self.conn.direct_get("KV_" + self.ctrl_bucket, {"last_by_subj": subject})
            if m is None or not m.data:
                m = sub.next(timeout)
            return JobResult(self, json.loads(bytes(m.data)))
        finally:
            sub.unsubscribe()


def connect(url: Union[str, Sequence[str]] = "nats://127.0.0.1:4222", **kw: Any) -> Fabric:
    """Connects to a jetfabric broker, or the first of several that answers (see Fabric)."""
    return Fabric(url, **kw)


# -- collectives ------------------------------------------------------------

def _collective(name: str, ts: Sequence[Tensor], attrs: Dict[str, Any], timeout: float,
                inputs: Optional[Sequence[Optional[Tensor]]] = None, shape_of: Any = None) -> List[Tensor]:
    group = secrets.token_hex(16)
    outs = []
    sessions = [t.s for t in ts]
    if len(set(id(s) for s in sessions)) != len(sessions):
        raise ValueError("%s: every rank needs its own session" % name)
    for r, t in enumerate(ts):
        s = t.s
        out = Tensor(s, s._id(), t.dtype, shape_of(t) if shape_of else t.shape)
        op: Dict[str, Any] = {"op": name, "out": [out.id], "group": group, "rank": r, "size": len(ts),
                              "timeout_ms": int(timeout * 1000)}
        inp = t if inputs is None else inputs[r]
        if inp is not None:
            op["in"] = [inp.id]
        op.update(attrs)
        s._queue(op)
        outs.append(out)
    for s in sessions:
        s.flush()
    return outs


def all_reduce(ts: Sequence[Tensor], reduce: str = "sum", algo: str = "", timeout: float = 60.0) -> List[Tensor]:
    """Every rank's tensor reduced elementwise (sum, mean, max, min), on every rank."""
    attrs: Dict[str, Any] = {"reduce": reduce}
    if algo:
        attrs["algo"] = algo
    return _collective("all_reduce", ts, attrs, timeout)


def all_gather(ts: Sequence[Tensor], timeout: float = 60.0) -> List[Tensor]:
    """The ranks' tensors joined along axis 0, on every rank."""
    n = len(ts)
    return _collective("all_gather", ts, {}, timeout,
                       shape_of=lambda t: (t.shape[0] * n,) + t.shape[1:] if t.shape else None)


def reduce_scatter(ts: Sequence[Tensor], reduce: str = "sum", timeout: float = 60.0) -> List[Tensor]:
    """Rank r gets the r-th slice (axis 0) of the reduction."""
    n = len(ts)
    return _collective("reduce_scatter", ts, {"reduce": reduce}, timeout,
                       shape_of=lambda t: (t.shape[0] // n,) + t.shape[1:] if t.shape else None)


def broadcast(ts: Sequence[Tensor], root: int = 0, timeout: float = 60.0) -> List[Tensor]:
    """Every rank gets rank root's tensor (the others' tensors only name their sessions)."""
    return _collective("broadcast", ts, {"root": root} if root else {}, timeout,
                       inputs=[t if r == root else None for r, t in enumerate(ts)],
                       shape_of=lambda t: ts[root].shape)
