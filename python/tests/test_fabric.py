"""The package against a real broker and worker (see _fabric.py): ops against
a float64 reference computed in Python, the integer and empty-input
semantics docs/PROTOCOL.md states, the object store, bad input."""

import hashlib
import json
import math
import os
import random
import secrets
import time
import unittest

import jetfabric
from jetfabric import cbor
from jetfabric.client import Tensor

from . import _fabric

fab = None


def setUpModule():
    global fab
    fab = jetfabric.connect(_fabric.url())


def tearDownModule():
    if fab is not None:
        fab.close()


def close(a, b, rtol=1e-5, atol=1e-6):
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y, rtol, atol) for x, y in zip(a, b))
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


def f32(x):
    """x rounded to float32, as an upload of it stores it."""
    import struct
    return struct.unpack("<f", struct.pack("<f", x))[0]


class FabricTest(unittest.TestCase):
    def setUp(self):
        self.s = fab.session("cpu-0")

    def tearDown(self):
        try:
            self.s.close()
        except jetfabric.FabricError:
            pass

    def assertClose(self, got, want, rtol=1e-5, atol=1e-6, msg=None):
        self.assertTrue(close(got, want, rtol, atol), "%s: got %s, want %s" % (msg or "", got, want))


class TestOps(FabricTest):
    """Every op checked against a float64 reference computed in Python."""

    def test_unary(self):
        rng = random.Random(1)
        xs = [f32(rng.uniform(-3, 3)) for _ in range(50)]
        pos = [f32(rng.uniform(0.1, 4)) for _ in range(50)]
        phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
        sig = lambda x: 1 / (1 + math.exp(-x))
        table = [
            ("neg", xs, lambda x: -x), ("abs", xs, abs), ("relu", xs, lambda x: max(x, 0.0)),
            ("exp", xs, math.exp), ("log", pos, math.log), ("sqrt", pos, math.sqrt), ("tanh", xs, math.tanh),
            ("sign", xs, lambda x: float((x > 0) - (x < 0))), ("expm1", xs, math.expm1), ("log1p", pos, math.log1p),
            ("rsqrt", pos, lambda x: 1 / math.sqrt(x)), ("reciprocal", pos, lambda x: 1 / x), ("sin", xs, math.sin),
            ("cos", xs, math.cos), ("sigmoid", xs, sig), ("gelu", xs, lambda x: x * phi(x)),
            ("gelu_tanh", xs, lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
            ("silu", xs, lambda x: x * sig(x)), ("erf", xs, math.erf), ("floor", xs, math.floor),
            ("ceil", xs, math.ceil), ("round", [0.5, 1.5, 2.5, -0.5, 1.2], round),
        ]
        for dtype in ("f32", "f64"):
            for name, data, ref in table:
                with self.subTest(op=name, dtype=dtype):
                    t = self.s.tensor(data, dtype=dtype)
                    got = self.s.op(name, [t], dtype=dtype, shape=t.shape).tolist()
                    self.assertClose(got, [float(ref(x)) for x in data], rtol=1e-5, atol=1e-6, msg=name)

    def test_binary_broadcast(self):
        rng = random.Random(2)
        a = [[f32(rng.uniform(-3, 3)) for _ in range(4)] for _ in range(3)]
        b = [f32(rng.uniform(0.5, 3)) for _ in range(4)]
        ta, tb = self.s.tensor(a, dtype="f64"), self.s.tensor(b, dtype="f64")
        table = [
            ("+", ta + tb, lambda x, y: x + y), ("-", ta - tb, lambda x, y: x - y), ("*", ta * tb, lambda x, y: x * y),
            ("/", ta / tb, lambda x, y: x / y), ("%", ta % tb, lambda x, y: x - math.floor(x / y) * y),
            ("maximum", ta.maximum(tb), max), ("minimum", ta.minimum(tb), min),
            ("pow", tb ** ta, None),
        ]
        for name, t, ref in table:
            with self.subTest(op=name):
                if name == "pow":
                    want = [[b[j] ** a[i][j] for j in range(4)] for i in range(3)]
                else:
                    want = [[ref(a[i][j], b[j]) for j in range(4)] for i in range(3)]
                self.assertEqual(t.shape, (3, 4))
                got = t.tolist()
                for g, w in zip(got, want):
                    self.assertClose(g, w, rtol=1e-12, atol=1e-12, msg=name)
        # Python scalars on either side.
        self.assertClose((2.0 - ta * 3).tolist()[0], [2.0 - 3 * x for x in a[0]], rtol=1e-12)

    def test_comparisons_where_clamp(self):
        a = self.s.tensor([1.0, 2.0, float("nan"), 4.0])
        b = self.s.tensor([2.0, 2.0, 2.0, 2.0])
        self.assertEqual((a < b).tolist(), [True, False, False, False])
        self.assertEqual((a <= b).tolist(), [True, True, False, False])
        self.assertEqual((a > b).tolist(), [False, False, False, True])
        self.assertEqual((a >= b).tolist(), [False, True, False, True])
        self.assertEqual((a == b).tolist(), [False, True, False, False])
        self.assertEqual((a != b).tolist(), [True, False, True, True])
        self.assertEqual(a.isnan().tolist(), [False, False, True, False])
        self.assertEqual((a == b).dtype, "bool")
        # where's inputs are [cond, a, b].
        self.assertEqual(self.s.where(a < b, a, b * 10).tolist(), [1.0, 20.0, 20.0, 20.0])
        x = self.s.tensor([-5, 0, 5, 10], dtype="i32")
        self.assertEqual(x.clamp(-1, 6).tolist(), [-1, 0, 5, 6])
        bo = self.s.tensor([True, False, True])
        self.assertEqual((bo & self.s.tensor([True, True, False])).tolist(), [True, False, False])
        self.assertEqual((~bo).tolist(), [False, True, False])

    def test_reductions(self):
        rng = random.Random(3)
        rows = [[f32(rng.uniform(-2, 2)) for _ in range(5)] for _ in range(4)]
        t = self.s.tensor(rows, dtype="f64")
        cols = list(zip(*rows))
        flat = [x for r in rows for x in r]
        mean = lambda v: sum(v) / len(v)
        self.assertClose(t.sum().item(), math.fsum(flat), rtol=1e-12)
        self.assertClose(t.sum(axis=0).tolist(), [math.fsum(c) for c in cols], rtol=1e-12)
        self.assertClose(t.mean(axis=1).tolist(), [mean(r) for r in rows], rtol=1e-12)
        self.assertEqual(t.mean(axis=1, keepdims=True).shape, (4, 1))
        self.assertEqual(t.max(axis=1).tolist(), [max(r) for r in rows])
        self.assertEqual(t.min(axis=0).tolist(), [min(c) for c in cols])
        self.assertClose(t.prod(axis=1).tolist(), [math.prod(r) for r in rows], rtol=1e-12)
        am = t.argmax(axis=1)
        self.assertEqual(am.dtype, "i64")
        self.assertEqual(am.tolist(), [r.index(max(r)) for r in rows])
        self.assertEqual(t.argmin().item(), flat.index(min(flat)))
        self.assertClose(t.logsumexp(axis=1).tolist(), [math.log(sum(math.exp(x) for x in r)) for r in rows], rtol=1e-12)
        var = lambda v, c: sum((x - mean(v)) ** 2 for x in v) / (len(v) - c)
        self.assertClose(t.var(axis=1).tolist(), [var(r, 0) for r in rows], rtol=1e-10)
        self.assertClose(t.var(axis=0, correction=1).tolist(), [var(c, 1) for c in cols], rtol=1e-10)
        sm = t.softmax(axis=1).tolist()
        for r, got in zip(rows, sm):
            e = [math.exp(x - max(r)) for x in r]
            self.assertClose(got, [x / sum(e) for x in e], rtol=1e-12)
        lsm = t.log_softmax(axis=-1).tolist()[0]
        self.assertClose(lsm, [x - math.log(sum(math.exp(y) for y in rows[0])) for x in rows[0]], rtol=1e-12, atol=1e-12)

    def test_matmul(self):
        rng = random.Random(4)
        for (n, k, m) in [(3, 4, 2), (1, 7, 5), (8, 8, 8)]:
            a = [[float(rng.randint(-9, 9)) for _ in range(k)] for _ in range(n)]
            b = [[float(rng.randint(-9, 9)) for _ in range(m)] for _ in range(k)]
            want = [[sum(a[i][p] * b[p][j] for p in range(k)) for j in range(m)] for i in range(n)]
            got = (self.s.tensor(a) @ self.s.tensor(b))
            self.assertEqual(got.shape, (n, m))
            self.assertEqual(got.tolist(), want)
        # A 1-D right operand is a column vector whose unit dim is dropped; batches broadcast.
        v = self.s.tensor([1.0, 2.0])
        mtx = self.s.tensor([[1.0, 2.0], [3.0, 4.0]])
        self.assertEqual((mtx @ v).tolist(), [5.0, 11.0])
        batch = self.s.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 2.0]]])
        self.assertEqual((batch @ mtx).tolist(), [[[1.0, 2.0], [3.0, 4.0]], [[2.0, 4.0], [6.0, 8.0]]])

    def test_movement_and_indexing(self):
        data = [[[float(100 * i + 10 * j + k) for k in range(4)] for j in range(3)] for i in range(2)]
        t = self.s.tensor(data, dtype="f64")
        self.assertEqual(t[1].tolist(), data[1])
        self.assertEqual(t[-1, 2].tolist(), data[-1][2])
        self.assertEqual(t[:, 1:, ::2].tolist(), [[r[::2] for r in m[1:]] for m in data])
        self.assertEqual(t[..., -1].tolist(), [[r[-1] for r in m] for m in data])
        self.assertEqual(t[::-1, ::-2, 1].tolist(), [[r[1] for r in m[::-2]] for m in data[::-1]])
        self.assertEqual(t[0, None, 1:2].shape, (1, 1, 4))
        self.assertEqual(t[0, None, 1:2].tolist(), [[data[0][1]]])
        idx = self.s.tensor([2, 0], dtype="i64")
        self.assertEqual(t[0, idx].tolist(), [data[0][2], data[0][0]])
        with self.assertRaises(IndexError):
            t[2]
        flat = [x for m in data for r in m for x in r]
        self.assertEqual(t.reshape(4, -1).tolist(), [flat[i * 6:(i + 1) * 6] for i in range(4)])
        self.assertEqual(t.permute(2, 0, 1).shape, (4, 2, 3))
        self.assertEqual(t.permute(2, 0, 1).tolist(), [[[data[i][j][k] for j in range(3)] for i in range(2)] for k in range(4)])
        m = self.s.tensor([[1, 2, 3], [4, 5, 6]], dtype="i32")
        self.assertEqual(m.T.tolist(), [[1, 4], [2, 5], [3, 6]])
        self.assertEqual(self.s.concat([m, m], axis=1).tolist(), [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5, 6]])
        self.assertEqual(self.s.stack([m, m]).shape, (2, 2, 3))
        a, b = m.split([1, 2], axis=1)
        self.assertEqual((a.tolist(), b.tolist()), ([[1], [4]], [[2, 3], [5, 6]]))
        self.assertEqual(m.pad([1, 0, 0, 1], value=9).tolist(), [[9, 9, 9, 9], [1, 2, 3, 9], [4, 5, 6, 9]])
        self.assertEqual(m.flip(1).tolist(), [[3, 2, 1], [6, 5, 4]])
        self.assertEqual(m[:, :1].squeeze(1).tolist(), [1, 4])
        self.assertEqual(m.unsqueeze(0).shape, (1, 2, 3))
        self.assertEqual(self.s.tensor([1.0, 2.0]).expand(3, 2).tolist(), [[1.0, 2.0]] * 3)
        g = m.gather(self.s.tensor([[1, 0, 1]], dtype="i64"), axis=0)
        self.assertEqual(g.tolist(), [[4, 2, 6]])
        self.assertEqual(self.s.tensor([0, 2], dtype="i32").one_hot(3).tolist(), [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
        self.assertEqual(self.s.ones((3, 3)).tril().tolist(), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
        sa = self.s.zeros((3,), dtype="i32").scatter_add(self.s.tensor([0, 2, 0], dtype="i64"), self.s.tensor([1, 2, 3], dtype="i32"))
        self.assertEqual(sa.tolist(), [4, 0, 2])

    def test_networks(self):
        s = self.s
        # conv2d against a direct float64 sum, with padding and a bias.
        rng = random.Random(6)
        N, C, H, W, O, K = 1, 2, 4, 5, 3, 3
        x = [[[[float(rng.randint(-3, 3)) for _ in range(W)] for _ in range(H)] for _ in range(C)] for _ in range(N)]
        w = [[[[float(rng.randint(-2, 2)) for _ in range(K)] for _ in range(K)] for _ in range(C)] for _ in range(O)]
        b = [1.0, -1.0, 0.5]
        y = s.tensor(x, dtype="f64").conv2d(s.tensor(w, dtype="f64"), s.tensor(b, dtype="f64"), padding=(1, 1))
        self.assertEqual(y.shape, (1, 3, 4, 5))
        want = [[[[b[o] + sum(w[o][c][p][q] * x[0][c][i - 1 + p][j - 1 + q]
                              for c in range(C) for p in range(K) for q in range(K)
                              if 0 <= i - 1 + p < H and 0 <= j - 1 + q < W)
                   for j in range(W)] for i in range(H)] for o in range(O)]]
        self.assertEqual(y.tolist(), want)
        img = s.tensor([[[[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0], [13.0, 14.0, 15.0, 16.0]]]])
        self.assertEqual(img.max_pool2d((2, 2)).tolist(), [[[[6.0, 8.0], [14.0, 16.0]]]])
        self.assertEqual(img.avg_pool2d((2, 2)).tolist(), [[[[3.5, 5.5], [11.5, 13.5]]]])
        self.assertEqual(img.max_pool2d((2, 2), stride=(1, 1)).shape, (1, 1, 3, 3))
        logits = [[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]]
        tgt = [2, 0]
        lse = [math.log(sum(math.exp(v) for v in r)) for r in logits]
        losses = [lse[i] - logits[i][tgt[i]] for i in range(2)]
        lt = s.tensor(logits, dtype="f64")
        tt = s.tensor(tgt, dtype="i64")
        self.assertClose(lt.cross_entropy(tt).item(), sum(losses) / 2, rtol=1e-12)
        self.assertClose(lt.cross_entropy(tt, reduce="none").tolist(), losses, rtol=1e-12)
        ln = lt.layer_norm().tolist()[0]
        m = sum(logits[0]) / 3
        v = sum((a - m) ** 2 for a in logits[0]) / 3
        self.assertClose(ln, [(a - m) / math.sqrt(v + 1e-5) for a in logits[0]], rtol=1e-9)
        rn = lt.rms_norm(s.tensor([2.0, 2.0, 2.0], dtype="f64")).tolist()[0]
        ms = sum(a * a for a in logits[0]) / 3
        self.assertClose(rn, [2 * a / math.sqrt(ms + 1e-5) for a in logits[0]], rtol=1e-9)

    def test_creation(self):
        self.assertEqual(self.s.arange(5).tolist(), [0.0, 1.0, 2.0, 3.0, 4.0])
        self.assertEqual(self.s.arange(1, 2, 0.25, dtype="f64").tolist(), [1.0, 1.25, 1.5, 1.75])
        self.assertEqual(self.s.linspace(0, 1, 5, dtype="f64").tolist(), [0.0, 0.25, 0.5, 0.75, 1.0])
        self.assertEqual(self.s.eye(2, 3, k=1, dtype="i64").tolist(), [[0, 1, 0], [0, 0, 1]])
        self.assertEqual(self.s.full((2,), 7, dtype="u8").tolist(), [7, 7])
        # Random ops are functions of (seed, output id): two sessions with the same ops give the same bits.
        with fab.session("cpu-0") as s2, fab.session("cpu-1") as s3:
            s2.seed(42)
            s3.seed(42)
            u = s2.uniform((1000,), -1, 1, dtype="f64").tolist()
            self.assertEqual(s3.uniform((1000,), -1, 1, dtype="f64").tolist(), u)
            self.assertTrue(all(-1 <= x < 1 for x in u))
            self.assertLess(abs(sum(u) / len(u)), 0.1)
            n = s2.normal((2000,), 3, 2, dtype="f64").tolist()
            self.assertLess(abs(sum(n) / len(n) - 3), 0.2)
        bern = self.s.bernoulli((1000,), 0.25).tolist()
        self.assertTrue(set(bern) <= {0.0, 1.0})

    def test_dtypes_round_trip(self):
        vals = [0.0, 1.5, -2.25, 65504.0]
        for dtype in ("f32", "f64", "f16", "bf16"):
            with self.subTest(dtype=dtype):
                got = self.s.tensor(vals, dtype=dtype).tolist()
                self.assertEqual(got[:3], vals[:3])
        self.assertEqual(self.s.tensor([1.0, 2.0], dtype="bf16").cast("f32").tolist(), [1.0, 2.0])
        self.assertEqual(self.s.tensor(3.5).tolist(), 3.5)
        self.assertEqual(self.s.tensor(3.5).shape, ())


class TestSemantics(FabricTest):
    """The integer, bool and empty-input semantics of docs/PROTOCOL.md §3."""

    def u8(self, v):
        return self.s.tensor(v, dtype="u8")

    def test_integer_wraps(self):
        self.assertEqual((self.u8([16]) * self.u8([16])).tolist(), [0])
        self.assertEqual((self.u8([250]) + self.u8([10])).tolist(), [4])
        self.assertEqual((-self.u8([3])).tolist(), [253])
        self.assertEqual((self.u8([3]) - self.u8([5])).tolist(), [254])
        i32 = lambda v: self.s.tensor(v, dtype="i32")
        self.assertEqual((i32([2**31 - 1]) + i32([1])).tolist(), [-2**31])
        self.assertEqual(abs(i32([-2**31])).tolist(), [-2**31])
        self.assertEqual((self.s.tensor([2**62], dtype="i64") * self.s.tensor([4], dtype="i64")).tolist(), [0])

    def test_integer_division(self):
        i32 = lambda v: self.s.tensor(v, dtype="i32")
        self.assertEqual((i32([7, -7, 7, -7, 5]) / i32([2, 2, -2, -2, 0])).tolist(), [3, -3, -3, 3, 0])
        self.assertEqual((i32([-2**31]) / i32([-1])).tolist(), [-2**31])
        self.assertEqual((i32([-7, 7, 5]) % i32([3, -3, 0])).tolist(), [2, -2, 0])
        self.assertEqual((self.s.tensor([-7.0]) % self.s.tensor([3.0])).tolist(), [2.0])
        self.assertEqual((self.u8([200]) / self.u8([0])).tolist(), [0])

    def test_casts(self):
        self.assertEqual(self.s.tensor([300, -1, 256], dtype="i32").cast("u8").tolist(), [44, 255, 0])
        self.assertEqual(self.s.tensor([2**40 + 5], dtype="i64").cast("i32").tolist(), [5])
        self.assertEqual(self.s.tensor([300.7, -5.0, -2.9, float("nan"), 1e30]).cast("u8").tolist(), [255, 0, 0, 0, 255])
        self.assertEqual(self.s.tensor([1e30, -1e30, -2.9]).cast("i32").tolist(), [2**31 - 1, -2**31, -2])
        self.assertEqual(self.s.tensor([0.0, float("nan"), -0.5]).cast("bool").tolist(), [False, True, True])
        self.assertEqual(self.s.tensor([True, False]).cast("f32").tolist(), [1.0, 0.0])
        # full's and pad's value saturate like a cast from f64.
        self.assertEqual(self.s.full((2,), 300, dtype="u8").tolist(), [255, 255])
        self.assertEqual(self.s.tensor([1], dtype="u8").pad([1, 0], value=-5).tolist(), [0, 1])

    def test_json_values_saturate(self):
        # `values` (here in a JSON frame, as the nats CLI sends it) saturate, unlike integer casts.
        inbox = fab.conn.new_inbox()
        sub = fab.conn.subscribe(inbox)
        token = secrets.token_hex(16)
        frame = {"v": 1, "ops": [{"op": "upload", "out": [1], "dtype": "u8", "shape": [4], "values": [300, -1, 2.7, 255]},
                                 {"op": "read", "in": [1], "tag": 1}, {"op": "close"}]}
        fab.conn.js_publish("fabric.ops.cpu-0." + token, json.dumps(frame).encode(),
                            headers={"Content-Type": "application/json", "Fabric-Reply": inbox})
        r = json.loads(bytes(sub.next(10).data))
        sub.unsubscribe()
        self.assertEqual(r["tensor"]["values"], [255, 0, 2, 255])
        self.assertEqual(r["tag"], 1)

    def test_bool_is_not_numeric(self):
        b = self.s.tensor([True, False, True])
        for make in (lambda: b.sum(), lambda: b + b, lambda: -b, lambda: b.max()):
            with self.assertRaises(jetfabric.DTypeError):
                make().tolist()
        self.assertEqual(b.cast("i32").sum().tolist(), 2)

    def test_reduction_dtypes(self):
        u = self.u8([200, 100, 3])
        self.assertEqual(u.sum().dtype, "u8")
        s = u.sum()
        self.assertEqual(s.tolist(), (200 + 100 + 3) % 256)
        self.assertEqual(s.read().dtype, "u8")
        self.assertEqual(u.mean().tolist(), 101)  # 303 / 3, in the input dtype
        self.assertEqual(self.s.tensor([-7, 0], dtype="i32").mean().tolist(), -3)  # truncated toward zero
        self.assertEqual(u.prod().tolist(), (200 * 100 * 3) % 256)
        self.assertEqual(u.argmax().read().dtype, "i64")
        self.assertEqual(self.s.tensor([1.0], dtype="f16").sum().read().dtype, "f16")

    def test_empty_reductions(self):
        e = self.s.zeros((0,))
        self.assertEqual(e.sum().tolist(), 0.0)
        self.assertEqual(e.prod().tolist(), 1.0)
        self.assertTrue(math.isnan(e.mean().tolist()))
        self.assertEqual(e.logsumexp().tolist(), -math.inf)
        self.assertTrue(math.isnan(self.s.ones((1,)).var(correction=1).tolist()))
        self.assertEqual(self.s.zeros((0,), dtype="i32").mean().tolist(), 0)
        for name in ("max", "min", "argmax", "argmin"):
            with self.subTest(op=name):
                with self.assertRaises(jetfabric.ShapeError) as cm:
                    getattr(e, name)().tolist()
                self.assertEqual(cm.exception.op, name)
        # Reducing the non-empty axis of an empty tensor is fine.
        self.assertEqual(self.s.zeros((0, 3)).max(axis=1).shape, (0,))
        self.assertEqual(self.s.zeros((0, 3)).max(axis=1).tolist(), [])


class TestObjectStore(FabricTest):
    def test_put_retries_out_of_range(self):
        # How often a write may start over is checked before anything is sent.
        for bad in (-1, 1001):
            with self.subTest(retries=bad):
                name = "pytest-retries-" + os.urandom(8).hex()
                with self.assertRaises(ValueError) as cm:
                    fab.objects.put(name, b"abc", retries=bad)
                self.assertIn("want 0 to 1000", str(cm.exception))
                self.assertIsNone(fab.objects.info(name))
        with self.assertRaises(TypeError):
            fab.objects.put("pytest-retries-type", b"abc", retries="8")  # type: ignore[arg-type]

    def test_large_upload_and_read(self):
        n = 6 << 20  # f32 elements: 24 MiB, over the inline limits both ways
        data = bytes(random.Random(5).getrandbits(8) for _ in range(4096)) * (n * 4 // 4096)
        t = self.s.upload(data, "f32", [n])
        # The result comes through FABRIC_RESULTS, which the broker keeps in memory.
        store, gets, placers = fab._bucket("FABRIC_RESULTS"), [], []
        real_get, real_finish = store.get, jetfabric.objectstore._Placer.finish

        def finish(placer):
            placers.append(placer)
            return real_finish(placer)

        store.get = lambda *a, **k: gets.append(a) or real_get(*a, **k)
        jetfabric.objectstore._Placer.finish = finish
        try:
            back = t.read()
        finally:
            store.get = real_get
            jetfabric.objectstore._Placer.finish = real_finish
        self.assertEqual(len(placers), 1)
        if placers[0].first >= 0:  # chunks came live (all may be stored first on a stalled machine)
            self.assertFalse(placers[0].bad, "the live chunks could not be placed")
            self.assertEqual(gets, [], "the result was read again from the stream, not taken as it was written")
        self.assertEqual(back.shape, (n,))
        self.assertEqual(hashlib.sha256(back.data).digest(), hashlib.sha256(data).digest())
        # A result over the inline limit comes through the object store and is deleted once read.
        name = "upload-" + hashlib.sha256(data).hexdigest()
        meta = fab.objects.info(name)
        self.assertIsNotNone(meta)
        self.assertEqual(meta["size"], len(data))
        self.assertTrue(meta["digest"].startswith("SHA-256="))
        self.assertEqual(jetfabric.objectstore.parse_digest(meta["digest"]), hashlib.sha256(data).digest())
        # The same bytes again: stored once, named by digest, not written again.
        t2 = self.s.upload(data, "f32", [n])
        self.assertEqual((t2 == t).cast("i32").sum().item(), n)
        self.assertEqual(fab.objects.info(name)["nuid"], meta["nuid"])

    def test_put_get_link_delete(self):
        store = fab.objects
        data = os.urandom(700_000)
        name = "pytest-" + secrets.token_hex(8)
        meta = store.put(name, data, chunk_size=100_000)
        self.assertEqual(meta["chunks"], 7)
        self.assertEqual(bytes(store.get(name)), data)
        store.link(name + "-alias", name)
        self.assertEqual(bytes(store.get(name + "-alias")), data)
        # A worker reads what we wrote, by name.
        t = self.s.op("upload", [], dtype="u8", shape=(len(data),), attrs={"dtype": "u8", "shape": [len(data)], "object": name})
        self.assertEqual(t.sum().item(), sum(data) % 256)
        store.delete(name)
        self.assertTrue(store.info(name)["deleted"])
        with self.assertRaises(jetfabric.ObjectStoreError):
            store.get(name)
        with self.assertRaises(jetfabric.UnavailableError):
            self.s.op("upload", [], dtype="u8", shape=(4,), attrs={"dtype": "u8", "shape": [4], "object": name}).tolist()

    def test_crc32(self):
        """put writes the data's CRC-32 in the meta's headers (none when the
        digest is given), and get checks it instead of the digest where it
        is well formed; a malformed one is ignored and the digest checked."""
        import zlib
        store = fab.objects
        data = os.urandom(300_000)
        name = "pytest-crc-" + secrets.token_hex(8)
        meta = store.put(name, data, chunk_size=100_000)
        self.assertEqual(meta["headers"]["Jetfabric-Crc32"], ["%08x" % zlib.crc32(data)])
        self.assertEqual(store.info(name)["headers"]["Jetfabric-Crc32"], ["%08x" % zlib.crc32(data)])
        given = store.put(name + "-given", data, sha256=hashlib.sha256(data).digest())
        self.assertNotIn("Jetfabric-Crc32", given.get("headers") or {})
        wrong = jetfabric.objectstore.digest_string(hashlib.sha256(b"other").digest())
        for crc, digest, ok in (("%08x" % zlib.crc32(data), wrong, True), ("0badf00d", meta["digest"], False),
                                ("0badf00g", meta["digest"], True), ("0badf00g", wrong, False)):
            store._publish_meta(dict(meta, digest=digest, headers={"Jetfabric-Crc32": [crc]}))
            if ok:
                self.assertEqual(bytes(store.get(name)), data, (crc, digest))
            else:
                with self.assertRaisesRegex(jetfabric.ObjectStoreError, "does not match", msg=(crc, digest)):
                    store.get(name)
        store.delete(name)
        store.delete(name + "-given")


    def test_follow(self):
        """A reader following a write takes the chunks live into place; those
        stored before it subscribed come from the stream; chunks whose reply
        subjects do not name their places make it read the stored object."""
        import threading
        store = fab.objects
        data = os.urandom(10 * 65536 + 1000)
        pieces = [data[i:i + 65536] for i in range(0, len(data), 65536)]
        for case, before, label in (("live", 0, str), ("stored first", 4, str), ("mislabeled", 0, lambda i: str(i + 1))):
            name, nuid = "pytest-follow-" + secrets.token_hex(8), secrets.token_hex(16)
            subj = store.chunk_subject(nuid)
            acks = []
            cv = threading.Condition()

            def on_ack(m):
                with cv:
                    acks.append(m)
                    cv.notify_all()

            reply, token = fab.conn.new_reply(on_ack)

            def publish(i):
                fab.conn.publish(subj, pieces[i], reply="%s.%s" % (reply, label(i)))

            def wait_acks(n):
                deadline = time.monotonic() + 20
                with cv:
                    while len(acks) < n:
                        self.assertGreater(deadline - time.monotonic(), 0, "%s: acks" % case)
                        cv.wait(deadline - time.monotonic())

            for i in range(before):
                publish(i)
            wait_acks(before)
            gets = []
            real_get = store.get
            store.get = lambda *a, **k: gets.append(a) or real_get(*a, **k)
            got = {}
            reader = threading.Thread(target=lambda: got.update(r=store.follow(name, nuid, timeout=20, size=len(data))))
            try:
                reader.start()
                deadline = time.monotonic() + 20
                while not any(sub.subject == subj for sub in list(fab.conn._subs.values())):
                    self.assertGreater(deadline - time.monotonic(), 0, "%s: the reader did not subscribe" % case)
                    time.sleep(0.001)
                fab.conn.flush()
                for i in range(before, len(pieces)):
                    publish(i)
                wait_acks(len(pieces))
                for m in acks:
                    jetfabric.nats.parse_ack(m, subj)
                store._publish_meta({"name": name, "bucket": store.bucket, "nuid": nuid, "size": len(data),
                                     "chunks": len(pieces), "mtime": "2026-11-24T00:00:00Z",
                                     "digest": jetfabric.objectstore.digest_string(hashlib.sha256(data).digest())})
                reader.join(30)
            finally:
                store.get = real_get
                fab.conn.drop_reply(token)
            out, meta = got["r"]
            self.assertEqual(bytes(out), data, case)
            self.assertEqual(len(gets), 1 if case == "mislabeled" else 0, case)
            store.delete(name)

    def test_upload_failure_reaches_the_worker(self):
        """An upload whose write fails marks its alias deleted with the
        reason; the worker following it fails the op with that reason."""
        store = fab.objects
        real_put = store.put

        def failing_put(name, data, **kw):
            def named(sha):
                raise OSError("disk on fire")
            return real_put(named, data, **kw)

        store.put = failing_put
        try:
            with self.assertRaisesRegex(OSError, "disk on fire"):
                self.s.upload(os.urandom(3 << 20), "u8", [3 << 20])
        finally:
            store.put = real_put
        with self.assertRaises(jetfabric.UnavailableError) as cm:
            self.s.sync()
        self.assertIn("the client's upload failed: disk on fire", str(cm.exception))
        self.assertEqual(self.s.tensor([1.0]).tolist(), [1.0])  # the session goes on


class TestBadInput(FabricTest):
    """Bad input gets the right error, as an exception carrying the wire code."""

    def test_op_errors(self):
        s = self.s
        x = s.tensor([[1.0, 2.0], [3.0, 4.0]])
        cases = [
            ("unknown op", lambda: s.op("frobnicate", [x], dtype="f32"), jetfabric.UnknownOpError, "frobnicate"),
            ("arity", lambda: s.op("add", [x], dtype="f32"), jetfabric.ArityError, "add"),
            ("broadcast", lambda: x + s.tensor([1.0, 2.0, 3.0]), jetfabric.ShapeError, "add"),
            ("matmul", lambda: x @ s.tensor([[1.0, 2.0, 3.0]]), jetfabric.ShapeError, "matmul"),
            ("mixed dtypes", lambda: x + s.tensor([1, 2], dtype="i32"), jetfabric.DTypeError, "add"),
            ("float op on ints", lambda: s.tensor([1], dtype="i32").exp(), jetfabric.DTypeError, "exp"),
            ("axis", lambda: x.softmax(axis=5), jetfabric.AttrError, "softmax"),
            ("perm", lambda: x.permute(0, 0), jetfabric.AttrError, "permute"),
            ("reshape", lambda: x.reshape(3, -1), jetfabric.ShapeError, "reshape"),
            ("unknown id", lambda: s.op("neg", [Tensor(s, 999999, "f32", None)], dtype="f32"), jetfabric.UnknownIDError, "neg"),
            ("index", lambda: x.index_select(s.tensor([5], dtype="i64"), 0), jetfabric.ShapeError, "index_select"),
            ("too large", lambda: s.zeros((1 << 20, 1 << 20)), jetfabric.TooLargeError, "zeros"),
            ("cross entropy target", lambda: s.op("cross_entropy", [x, s.tensor([0, 7], dtype="i64")], dtype="f32"),
             jetfabric.ShapeError, "cross_entropy"),
        ]
        for name, make, exc, op in cases:
            with self.subTest(case=name):
                with self.assertRaises(exc) as cm:
                    make().tolist()
                e = cm.exception
                self.assertIsInstance(e, jetfabric.OpError)
                self.assertEqual(e.code, exc.code)
                self.assertEqual(e.op, op)
                self.assertGreater(e.seq, 0)
                self.assertIn(op, str(e))
        # The session still works, and errors are reported once.
        s.sync()
        self.assertEqual((x * 2).sum().item(), 20.0)

    def test_failed_inputs_report_the_first_cause(self):
        s = self.s
        bad = s.tensor([1.0, 2.0]) + s.tensor([1.0, 2.0, 3.0])
        later = (bad * 2).exp()
        with self.assertRaises(jetfabric.ShapeError) as cm:
            later.tolist()
        self.assertEqual(cm.exception.op, "add")
        with self.assertRaises(jetfabric.ShapeError) as cm:
            later.tolist()  # the first cause again, for a read of a failed id
        self.assertEqual(cm.exception.op, "add")

    def test_duplicate_id(self):
        s = self.s
        x = s.tensor([1.0])
        s._queue({"op": "neg", "in": [x.id], "out": [x.id]})
        with self.assertRaises(jetfabric.DuplicateError):
            s.sync()

    def test_bad_frames(self):
        # An undecodable frame is answered at once, with no tag, and the next sync reports it again.
        inbox = fab.conn.new_inbox()
        sub = fab.conn.subscribe(inbox)
        token = secrets.token_hex(16)
        subject = "fabric.ops.cpu-0." + token
        for body, hdr, code in [(b"\xff\x00garbage", {}, "malformed"),
                                (cbor.dumps({"v": 2, "ops": []}), {}, "version"),
                                (b"{}", {"Content-Type": "text/plain"}, "malformed")]:
            with self.subTest(code=code, body=body[:10]):
                fab.conn.js_publish(subject, body, headers=dict(hdr, **{"Fabric-Reply": inbox}))
                r = cbor.loads(bytes(sub.next(10).data))
                self.assertNotIn("tag", r)
                self.assertNotIn("index", r)
                self.assertEqual([e["code"] for e in r["errors"]], [code])
                self.assertFalse(r["errors"][0].get("op"))
        fab.conn.js_publish(subject, cbor.dumps({"v": 1, "ops": [{"op": "sync", "tag": 5}]}), headers={"Fabric-Reply": inbox})
        r = cbor.loads(bytes(sub.next(10).data))
        self.assertEqual(r["tag"], 5)
        self.assertEqual([e["code"] for e in r["errors"]], ["malformed", "version", "malformed"])
        sub.unsubscribe()
        # Through a Session, an untagged answer becomes the exception of the wait.
        self.s.tensor([1.0]).tolist()
        fab.conn.publish(self.s.subject, b"\xff", headers={"Fabric-Reply": self.s.inbox})
        with self.assertRaises(jetfabric.MalformedError):
            self.s.sync()

    def test_oversize_frame(self):
        # Over max_payload: refused before sending (the server would drop the connection).
        limit = fab.conn.max_payload
        with self.assertRaises(jetfabric.MaxPayloadError):
            fab.conn.publish(self.s.subject, b"\0" * (limit + 1))
        self.assertEqual(self.s.tensor([1.0, 2.0]).sum().item(), 3.0)  # the connection lives on
        # A raw connection that sends it anyway is disconnected by the server, as PROTOCOL.md says.
        c = jetfabric.nats.Connection(_fabric.url())
        c.max_payload = 1 << 62  # disable the client's check
        try:
            c.publish("fabric.ops.cpu-0." + secrets.token_hex(16), b"\0" * (limit + 1))
        except jetfabric.ConnectionClosedError:
            pass  # closed while still sending
        deadline = time.monotonic() + 10
        while (c._closed is None or "Maximum Payload" not in c.last_error) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertIsNotNone(c._closed)
        self.assertIn("Maximum Payload", c.last_error)
        c.close()

    def test_client_side_errors(self):
        with self.assertRaises(ValueError):
            self.s.upload(b"\0" * 3, "f32", [1])
        with self.assertRaises(ValueError):
            self.s.tensor([1.0], dtype="f8")
        with self.assertRaises(TypeError):
            bool(self.s.tensor([1.0]))
        with self.assertRaises(jetfabric.NoRespondersError):
            fab.conn.js_publish("nostream.ops.cpu-0.x", b"\0")

    def test_frame_not_stored(self):
        # A read's frame goes out as a plain publish; when its answer is late the
        # client asks the stream whether it stored the frame, and fails the read if not.
        with jetfabric.connect(_fabric.url(), prefix="nostream", frame_check=0.05) as other:
            # That prefix has no registry either: session() says so.
            with self.assertRaises(jetfabric.FabricError) as cm:
                other.session("cpu-0")
            self.assertIn("NOSTREAM_CTRL", str(cm.exception))
            s = jetfabric.Session(other, "cpu-0")  # past the registry check, to publish there all the same
            with self.assertRaises(jetfabric.FabricError) as cm:
                s.tensor([1.0]).tolist()
            self.assertIn("not stored", str(cm.exception))
            self.assertIn("no stream captures", str(cm.exception))


class TestRefusedFrames(unittest.TestCase):
    """On a fabric whose op stream stores frames of at most 64 KiB
    (python_test.go starts one and sets JETFABRIC_SMALL_FRAMES_URL), a
    frame of a 128 KiB inline upload is refused: as with the Go client, the
    refusal fails the next read or sync only, once, and the session goes
    on (an empty frame of its number takes its place)."""

    def setUp(self):
        url = os.environ.get("JETFABRIC_SMALL_FRAMES_URL")
        if not url:
            self.skipTest("JETFABRIC_SMALL_FRAMES_URL not set (python_test.go sets it)")
        self.fab = jetfabric.connect(url, frame_check=0.05, read_timeout=30)
        self.addCleanup(self.fab.close)
        self.s = self.fab.session("cpu-0")
        self.big = [1.0] * (32 << 10)  # 128 KiB of f32, sent inline

    def test_read_in_a_refused_frame(self):
        s = self.s
        self.assertEqual(s.full([2], 1.0).sum().item(), 2.0)
        with self.assertRaises(jetfabric.FabricError) as cm:
            s.tensor(self.big).sum().tolist()
        self.assertIn("not stored", str(cm.exception))
        self.assertIn("maximum", str(cm.exception))
        # The session goes on: the frames after it run.
        self.assertEqual(s.full([2], 3.0).sum().item(), 6.0)
        s.sync()
        self.assertEqual(s.full([2], 4.0).sum().item(), 8.0)

    def test_refused_with_no_call_waiting(self):
        s = self.s
        x = s.full([2], 2.0)
        s.sync()
        lost = s.tensor(self.big)  # refused: nothing waits on its frame
        s.flush()
        with self.assertRaises(jetfabric.JetStreamError) as cm:
            s.full([1], 1.0).tolist()
        self.assertEqual(cm.exception.err_code, 10054)  # over the stream's max message size
        self.assertIn("maximum", str(cm.exception))
        # Reported once: the next reads and syncs carry on.
        self.assertEqual((x * 2).tolist(), [4.0, 4.0])
        s.sync()
        self.assertEqual(x.sum().item(), 4.0)
        # What the refused frame would have made was never made.
        with self.assertRaises(jetfabric.UnknownIDError):
            lost.sum().tolist()
        # Two refused frames before a sync: it raises once, naming both.
        s.tensor(self.big)
        s.flush()
        s.tensor(self.big)
        s.flush()
        with self.assertRaises(jetfabric.JetStreamError) as cm:
            s.sync()
        self.assertIn("and 1 more frames refused", str(cm.exception))
        s.sync()
        self.assertEqual(x.tolist(), [2.0, 2.0])
        s.close()


class TestSessionsAndJobs(FabricTest):
    def test_session_needs_a_live_device(self):
        """As the Go client's Open: a device not registered, or registered
        and served by no worker, raises NoDeviceError saying which; a name
        that is no device token raises ValueError; nothing is subscribed."""
        subs = len(fab.conn._subs)
        with self.assertRaises(jetfabric.NoDeviceError) as cm:
            fab.session("nosuch-0")
        self.assertIn("nosuch-0 is not registered", str(cm.exception))
        gone = os.environ.get("JETFABRIC_GONE_DEVICE")
        if gone:  # python_test.go registers it and stops its worker
            self.assertIsNotNone(fab.device(gone))
            with self.assertRaises(jetfabric.NoDeviceError) as cm:
                fab.session(gone)
            self.assertIn("%s is stopped, last heartbeat" % gone, str(cm.exception))
            self.assertIn("no worker serves it", str(cm.exception))
        for bad in ("", "cpu.0", "cpu 0", "x" * 65, "cpu-*", 3):
            with self.subTest(device=bad):
                with self.assertRaises(ValueError) as cm:
                    fab.session(bad)  # type: ignore[arg-type]
                self.assertIn("want 1 to 64 characters", str(cm.exception))
        self.assertEqual(len(fab.conn._subs), subs)
        with fab.session("cpu-1") as s:
            self.assertEqual(s.tensor([1.0]).item(), 1.0)

    def test_devices(self):
        devs = fab.devices()
        names = [d["name"] for d in devs]
        self.assertIn("cpu-0", names)
        self.assertTrue(all(jetfabric.live(d) for d in devs if d["name"] in ("cpu-0", "cpu-1")))
        with fab.session() as s:  # the first live device
            self.assertEqual(s.device, names[0])
        self.assertEqual(fab.tensor([1, 2, 3]).sum().item(), 6)

    def test_transfer_and_collectives(self):
        with fab.session("cpu-1") as s1:
            x = self.s.tensor([[1.0, 2.0], [3.0, 4.0]])
            y = x.to(s1)
            self.assertEqual(y.s, s1)
            self.assertEqual((y * 2).tolist(), [[2.0, 4.0], [6.0, 8.0]])
            a, b = jetfabric.all_reduce([x, s1.tensor([[10.0, 20.0], [30.0, 40.0]])], "sum")
            self.assertEqual(a.tolist(), [[11.0, 22.0], [33.0, 44.0]])
            self.assertEqual(b.tolist(), [[11.0, 22.0], [33.0, 44.0]])
            g0, g1 = jetfabric.all_gather([self.s.tensor([1.0]), s1.tensor([2.0])])
            self.assertEqual(g1.tolist(), [1.0, 2.0])
            b0, b1 = jetfabric.broadcast([self.s.tensor([5.0, 6.0]), s1.zeros((2,))], root=0)
            self.assertEqual(b1.tolist(), [5.0, 6.0])
            r0, r1 = jetfabric.reduce_scatter([self.s.tensor([1.0, 2.0, 3.0, 4.0]), s1.tensor([10.0, 20.0, 30.0, 40.0])], "max")
            self.assertEqual((r0.tolist(), r1.tolist()), ([10.0, 20.0], [30.0, 40.0]))
            m0, _ = jetfabric.all_reduce([self.s.tensor([1.0, 2.0]), s1.tensor([3.0, 6.0])], "mean", algo="naive")
            self.assertEqual(m0.tolist(), [2.0, 4.0])

    def test_job(self):
        job = fab.job()
        a = job.tensor([[1.0, 2.0], [3.0, 4.0]])
        out = (a @ a).sum(axis=1)
        jid = fab.submit("cpu", job, [out])
        res = fab.wait_job(jid, timeout=30)
        res.check()
        self.assertEqual(res.output(0).tolist(), [17.0, 37.0])
        # An input over the inline limit is written to the object store whole
        # before the job names it; the same bytes again are not written twice.
        raw = bytes(range(256)) * (3 << 12)  # 3 MiB
        for _ in range(2):
            big = fab.job()
            u = big.upload(raw, "u8", [len(raw)])
            res = fab.wait_job(fab.submit("cpu", big, [u.cast("i64").sum()]), timeout=30)
            res.check()
            self.assertEqual(res.output(0).tolist(), sum(range(256)) * (3 << 12))
        bad = fab.job()
        o = bad.tensor([1.0, 2.0]) + bad.tensor([1.0, 2.0, 3.0])
        res = fab.wait_job(fab.submit("cpu", bad, [o]), timeout=30)
        with self.assertRaises(jetfabric.ShapeError):
            res.check()

    def test_cli(self):
        import io
        import contextlib
        from jetfabric.__main__ import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["--url", _fabric.url(), "devices"]), 0)
        self.assertIn("cpu-0", out.getvalue())
        self.assertIn("serving", out.getvalue())


if __name__ == "__main__":
    unittest.main()
