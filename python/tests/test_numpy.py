"""With numpy: Tensor.numpy(), Session.tensor(ndarray) for every dtype, and a
differential test of random programs against numpy in float64."""

import random
import unittest

try:
    import numpy as np
except ImportError:  # the standard-library tests cover the rest
    np = None

import jetfabric

from . import _fabric

fab = None


def setUpModule():
    global fab
    if np is None:
        raise unittest.SkipTest("numpy is not installed")
    fab = jetfabric.connect(_fabric.url())


def tearDownModule():
    if fab is not None:
        fab.close()


class TestNumpy(unittest.TestCase):
    def setUp(self):
        self.s = fab.session("cpu-0")

    def tearDown(self):
        self.s.close()

    def test_dtypes(self):
        rng = np.random.default_rng(1)
        for dt in ("float32", "float64", "float16", "int32", "int64", "uint8", "bool"):
            with self.subTest(dtype=dt):
                a = (rng.standard_normal((3, 5)) * 50).astype(dt)
                t = self.s.tensor(a)
                self.assertEqual(t.dtype, jetfabric.client._NP_TO_DTYPE[dt])
                got = t.numpy()
                self.assertEqual(got.dtype, a.dtype)
                np.testing.assert_array_equal(got, a)
        # bfloat16 rounds to nearest even; numpy() gives float32.
        a = np.array([1.0, 1.00390625, 3.14159, -2.5e-3, np.inf], dtype=np.float32)
        got = self.s.tensor(a, dtype="bf16").numpy()
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_allclose(got, a, rtol=1 / 128)
        # Non-contiguous and big-endian arrays upload as their values.
        m = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
        np.testing.assert_array_equal(self.s.tensor(m).numpy(), m)
        self.assertEqual(np.asarray(self.s.tensor(m) * 2).tolist(), (m * 2).tolist())
        np.testing.assert_array_equal(fab.tensor(np.eye(3)).numpy(), np.eye(3))

    def test_large(self):
        a = np.random.default_rng(2).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
        t = self.s.tensor(a)
        np.testing.assert_array_equal(t.numpy(), a)
        np.testing.assert_allclose((t * 2 + 1).numpy(), a * 2 + 1, rtol=1e-6)

    def test_random_programs(self):
        """Random programs of broadcasting, reductions, matmul and movement, in
        float32 on the fabric and float64 in numpy."""
        rng = random.Random(7)
        nrng = np.random.default_rng(7)
        unary = {
            "tanh": np.tanh, "sin": np.sin, "cos": np.cos, "neg": np.negative, "abs": np.abs,
            "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
            "exp": lambda x: np.exp(np.tanh(x)),
        }
        binary = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}
        checked = 0
        for prog in range(25):
            vals = []
            for shape in [(3, 4), (4,), (1, 4), (4, 3), (2, 3, 4)]:
                a = nrng.uniform(-2, 2, shape).astype(np.float32)
                vals.append((self.s.tensor(a), a.astype(np.float64)))
            for step in range(12):
                kind = rng.choice(["unary", "binary", "reduce", "matmul", "move", "index"])
                t, r = rng.choice(vals)
                if kind == "unary":
                    name = rng.choice(sorted(unary))
                    if name == "exp":
                        t, r = t.tanh().exp(), np.exp(np.tanh(r))
                    else:
                        t, r = getattr(t, name)() if name not in ("neg",) else -t, unary[name](r)
                elif kind == "binary":
                    u, q = rng.choice(vals)
                    try:
                        np.broadcast_shapes(r.shape, q.shape)
                    except ValueError:
                        continue
                    name = rng.choice(sorted(binary))
                    t, r = t._binary(name, u), binary[name](r, q)
                elif kind == "reduce":
                    if r.ndim == 0:
                        continue
                    ax = rng.randrange(r.ndim)
                    name = rng.choice(["sum", "mean", "max", "min"])
                    keep = rng.random() < 0.5
                    t, r = getattr(t, name)(axis=ax, keepdims=keep), getattr(np, name if name != "mean" else "mean")(r, axis=ax, keepdims=keep)
                elif kind == "matmul":
                    cands = [(u, q) for u, q in vals if r.ndim >= 1 and q.ndim >= 1 and r.shape[-1] == (q.shape[-2] if q.ndim > 1 else q.shape[0])]
                    if not cands:
                        continue
                    u, q = rng.choice(cands)
                    try:
                        want = r @ q
                    except ValueError:
                        continue
                    t, r = t @ u, want
                elif kind == "move":
                    if r.ndim < 2:
                        t, r = t.reshape(-1, 1), r.reshape(-1, 1)
                    else:
                        t, r = t.transpose(), np.swapaxes(r, -1, -2)
                else:
                    if r.ndim == 0 or r.shape[0] < 2:
                        continue
                    t, r = t[1:, ...][::-1], r[1:, ...][::-1]
                self.assertEqual(t.shape, r.shape, "program %d step %d (%s)" % (prog, step, kind))
                vals.append((t, r))
            for t, r in vals[5:]:
                got = t.numpy()
                scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
                np.testing.assert_allclose(got, r, rtol=1e-4, atol=1e-5 * scale)
                checked += got.size
        self.assertGreater(checked, 500)


if __name__ == "__main__":
    unittest.main()
