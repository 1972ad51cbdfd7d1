"""Graph capture and replay (docs/PROTOCOL.md §11) and session heartbeats
(§1), against a real broker and worker (see _fabric.py)."""

import os
import random
import struct
import threading
import time
import unittest

import jetfabric
from jetfabric import cbor

from . import _fabric

fab = None


def setUpModule():
    global fab
    fab = jetfabric.connect(_fabric.url())


def tearDownModule():
    if fab is not None:
        fab.close()


def bits(t):
    """The tensor's value as raw bytes: bit-for-bit comparisons."""
    return bytes(t.read().data)


def random_program(s, r, ins, scalar, bind=None):
    """A random program of elementwise ops, reductions broadcast back,
    matrix products, random draws and frees over inputs of shape [4, 6]
    f32; the same r gives the same program in a session and in a graph.
    bind(t, attr) binds the op that made t to the scalar placeholder."""
    pool = list(ins)
    made = []

    def pick():
        return pool[r.randrange(len(pool))]

    def add(t):
        pool.append(t)
        made.append(t)

    for _ in range(10 + r.randrange(15)):
        k = r.randrange(10)
        if k == 0:
            add(pick() + pick())
        elif k == 1:
            add(pick() * pick().tanh())
        elif k == 2:
            add(pick() - pick().max(axis=1, keepdims=True))
        elif k == 3:
            add((pick() @ pick().T) @ pick())
        elif k == 4:
            u = s.uniform([4, 6], -1.0, scalar)
            if bind:
                bind(u, "high")
            add(u)
        elif k == 5:
            add(s.normal([4, 6]) * pick())
        elif k == 6:
            f = s.full([4, 6], scalar)
            if bind:
                bind(f, "value")
            add(pick() * f)
        elif k == 7 and len(made) > 4:
            j = r.randrange(len(made) - 3)
            t = made.pop(j)
            pool = [u for u in pool if u is not t]
            t.free()
        elif k == 8:
            a, b = pick().split([2, 4], axis=1)
            add(s.concat([b, a], axis=1).sigmoid())
        else:
            add(pick().exp().log1p())
    return made[-2:]


class TestGraphs(unittest.TestCase):
    def test_replay_is_the_ops_one_by_one(self):
        """Random programs: a replay gives the same bits as the same ops
        sent one by one at the same place in a session, random draws and
        bound scalars included, replayed twice with other scalars."""
        for seed in range(4):
            r = random.Random(seed)
            g = fab.graph()
            ins = [g.input("f32", [4, 6]) for _ in range(2)]
            sc = g.scalar(0.5)
            outs = random_program(g.session, random.Random(seed), ins, 0.5,
                                  bind=lambda t, attr: g.bind(t, attr, sc))
            d = g.define(*outs)
            self.assertEqual(len(d.name), 64)
            vals = [[r.uniform(-2, 2) for _ in range(24)] for _ in range(2)]
            for scalar in (0.25, 1.5):
                with fab.session("cpu-0") as a, fab.session("cpu-0") as b:
                    a.seed(seed)
                    b.seed(seed)
                    xa = [a.tensor([v[i * 6:(i + 1) * 6] for i in range(4)]) for v in vals]
                    xb = [b.tensor([v[i * 6:(i + 1) * 6] for i in range(4)]) for v in vals]
                    got = a.replay(d, xa, [scalar])
                    want = random_program(b, random.Random(seed), xb, scalar)
                    self.assertEqual([t.id for t in got], [t.id for t in want])
                    for gt, wt in zip(got, want):
                        self.assertEqual(bits(gt), bits(wt), "seed %d scalar %s" % (seed, scalar))
                        self.assertEqual(gt.read().shape, (4, 6))

    def test_define_load_and_names(self):
        g = fab.graph()
        x = g.input("f32", [3])
        y = (x * 2 + 1).sum()
        d = g.define(y)
        self.assertEqual(d.internal, 5)  # full 2, mul, full 1, add, sum
        again = fab.graph()
        x2 = again.input("f32", [3])
        self.assertEqual(again.build((x2 * 2 + 1).sum()).name, d.name, "the same program has one name")
        g.define(y)  # stored before: nothing changes
        loaded = fab.load_graph(d.name)
        self.assertEqual(loaded.data, d.data)
        self.assertEqual(loaded.internal, d.internal)
        with fab.session("cpu-0") as s:
            t = s.tensor([1.0, 2.0, 3.0])
            (a,) = s.replay(loaded, [t])
            (b,) = s.replay(d, [t])
            self.assertEqual(a.item(), 15.0)
            self.assertEqual(b.item(), 15.0)
            # The intermediate tensors were freed on the worker.
            with self.assertRaises(jetfabric.UnknownIDError):
                jetfabric.Tensor(s, a.id - 1, "f32", None).tolist()

    def test_canonical_encoding(self):
        """Keys sorted by their encoding, shortest floats: the bytes the Go
        client writes for the same definition."""
        d = {"v": 1, "ops": [{"op": "full", "out": [2], "value": 1.0, "shape": [3]}],
             "inputs": [{"dtype": "f32", "shape": []}], "outputs": [2]}
        self.assertEqual(cbor.dumps_canonical(d).hex(),
                         "a4" "6176" "01" "636f7073" "81" "a4" "626f70" "6466756c6c" "636f7574" "8102"
                         "657368617065" "8103" "6576616c7565" "f93c00"
                         "66696e70757473" "81" "a2" "656474797065" "63663332" "657368617065" "80"
                         "676f757470757473" "8102")
        enc = cbor.dumps_canonical({"bb": 1, "a": 2, "c": 3})
        self.assertEqual(enc, bytes.fromhex("a3") + b"\x61a\x02" + b"\x61c\x03" + b"\x62bb\x01")
        for v, want in ((1.0, "f93c00"), (0.1, "fb3fb999999999999a"), (100000.0, "fa47c35000"),
                        (float("inf"), "f97c00"), (float("nan"), "f97e00"), (-0.0, "f98000"), (1e300, "fb7e37e43c8800759c")):
            self.assertEqual(cbor.dumps_canonical(v).hex(), want, v)
            if v == v:
                self.assertEqual(cbor.loads(cbor.dumps_canonical(v)), v)
        go = os.environ.get("JETFABRIC_GO_GRAPH")
        if go:  # the name the Go client gave the same program (python_test.go)
            self.assertEqual(go_program().name, go)

    def test_bad_input(self):
        g = fab.graph()
        x = g.input("f32", [2])
        sc = g.scalar(1.0)
        f = g.session.full([2], 1.0)
        g.bind(f, "value", sc)
        d = g.define(x + f)
        with fab.session("cpu-0") as s:
            good = s.tensor([1.0, 2.0])
            # Counts and sessions, on the client.
            with self.assertRaisesRegex(ValueError, "replay: graph %s takes 1 inputs, 2 given" % d.name[:12]):
                s.replay(d, [good, good], [1.0])
            with self.assertRaisesRegex(ValueError, "replay: graph .* takes 1 scalars, 0 given"):
                s.replay(d, [good])
            with fab.session("cpu-1") as other:
                with self.assertRaisesRegex(ValueError, "replay: input 0 .* not a tensor of this session"):
                    s.replay(d, [other.tensor([1.0, 2.0])], [1.0])
            with self.assertRaises(TypeError):
                s.replay(d.name, [good], [1.0])
            # Wrong bindings, on the worker: the replay runs nothing and its
            # outputs fail with an error naming the op.
            for bad, cls, text in ((s.tensor([1.0, 2.0, 3.0]), jetfabric.ShapeError, "the graph takes f32[2]"),
                                   (s.tensor([1, 2]), jetfabric.DTypeError, "")):
                (y,) = s.replay(d, [bad], [1.0])
                with self.assertRaises(cls) as cm:
                    y.tolist()
                self.assertEqual(cm.exception.op, "replay")
                self.assertIn(text, str(cm.exception))
            ghost = jetfabric.Tensor(s, 999999, "f32", [2])
            (y,) = s.replay(d, [ghost], [1.0])
            with self.assertRaises(jetfabric.UnknownIDError) as cm:
                y.tolist()
            self.assertEqual(cm.exception.op, "replay")
            # A graph that is not stored.
            other = fab.graph()
            z = other.input("f32", [2])
            unknown = other.build(z * 3)
            (y,) = s.replay(unknown, [good])
            with self.assertRaises(jetfabric.UnknownGraphError) as cm:
                y.tolist()
            self.assertEqual(cm.exception.op, "replay")
            self.assertIn(unknown.name, str(cm.exception))
            # A graph whose op cannot run on its placeholders is refused as a
            # whole; the message names the graph's op.
            g2 = fab.graph()
            a = g2.input("f32", [2])
            bad_op = g2.define(a.reshape(2, 1) @ a.reshape(2, 1))
            (y,) = s.replay(bad_op, [good])
            with self.assertRaises(jetfabric.ShapeError) as cm:
                y.tolist()
            self.assertEqual(cm.exception.op, "replay")
            self.assertIn("graph %s op 2 (matmul) does not validate" % bad_op.name[:12], str(cm.exception))
            # An op that fails as it runs reports itself.
            g5 = fab.graph()
            v, i = g5.input("f32", [3]), g5.input("i64", [2])
            gather = g5.define((v * 2).index_select(i))
            vals = s.tensor([1.0, 2.0, 3.0])
            (y,) = s.replay(gather, [vals, s.tensor([0, 2])])
            self.assertEqual(y.tolist(), [2.0, 6.0])
            (y,) = s.replay(gather, [vals, s.tensor([0, 5])])
            with self.assertRaises(jetfabric.ShapeError) as cm:
                y.tolist()
            self.assertEqual(cm.exception.op, "index_select")
            self.assertIn("graph %s op 2: " % gather.name[:12], str(cm.exception))
            # The session goes on.
            (y,) = s.replay(d, [good], [10.0])
            self.assertEqual(y.tolist(), [11.0, 12.0])
        # Bad definitions, refused on the client.
        g3 = fab.graph()
        a = g3.input("f32", [2])
        with self.assertRaisesRegex(ValueError, "a graph cannot hold upload"):
            g3.session.tensor([1.0, 2.0])
        a.expose("0" * 32)
        with self.assertRaisesRegex(ValueError, r"a graph cannot hold expose \(op 0\)"):
            g3.build(a)
        g4 = fab.graph()
        with self.assertRaisesRegex(ValueError, "placeholder"):
            g4.bind(g4.input("f32", [1]), "value", g4.scalar(1.0))
        with self.assertRaisesRegex(ValueError, "cannot take a scalar"):
            g4.bind(g4.session.full([1], 1.0), "shape", 0)
        with self.assertRaisesRegex(ValueError, "output 0 is not a tensor of the graph"):
            with fab.session("cpu-0") as s:
                g4.build(s.tensor([1.0]))
        with self.assertRaisesRegex(jetfabric.FabricError, "a graph cannot read"):
            g4.session.full([1], 1.0).tolist()
        with self.assertRaisesRegex(ValueError, "64 lower-case hex"):
            fab.load_graph("nope")
        with self.assertRaisesRegex(jetfabric.FabricError, "not stored"):
            fab.load_graph("0" * 64)


def go_program():
    """The program python_test.go builds with the Go client."""
    g = fab.graph()
    x = g.input("f32", [2, 3])
    b = g.input("f32", [3])
    sc = g.scalar(1.0)
    f = g.session.full([2, 3], 1.0)
    g.bind(f, "value", sc)
    u = g.session.uniform([2, 3], 0.0, 0.5)
    return g.build(x * f + b + u)


class TestHeartbeat(unittest.TestCase):
    def test_beats_on_the_alive_subject(self):
        """Each open session's heartbeat, an empty message on
        fabric.alive.<device>.<session>; none once the session is closed."""
        got = {}
        lock = threading.Lock()
        cond = threading.Condition(lock)

        def on(m):
            if m is None:
                return
            with cond:
                got.setdefault(m.subject, []).append(bytes(m.data))
                cond.notify_all()

        def wait_for(pred, what):
            deadline = time.monotonic() + 20
            with cond:
                while not pred():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.fail("no %s within 20s: %r" % (what, {k: len(v) for k, v in got.items()}))
                    cond.wait(left)

        watch = fab.conn.subscribe("fabric.alive.>", cb=on)
        fab.conn.flush()
        try:
            with jetfabric.connect(_fabric.url(), heartbeat=0.05) as f2:
                a, b = f2.session("cpu-0"), f2.session("cpu-1")
                sa, sb = "fabric.alive.cpu-0." + a.token, "fabric.alive.cpu-1." + b.token
                wait_for(lambda: len(got.get(sa, [])) >= 2 and len(got.get(sb, [])) >= 2, "beats of both sessions")
                self.assertEqual(set(got[sa]), {b""})
                a.close()
                # Beats of a and b go out in one round, a's first, on one
                # connection: once b has beaten twice more, every beat of a
                # sent around the close has arrived. After that, none.
                with cond:
                    seen_b = len(got[sb])
                wait_for(lambda: len(got[sb]) >= seen_b + 2, "beats of the open session")
                with cond:
                    after_close, seen_b = len(got[sa]), len(got[sb])
                wait_for(lambda: len(got[sb]) >= seen_b + 3, "beats of the open session")
                with cond:
                    self.assertEqual(len(got[sa]), after_close, "beats of a closed session")
        finally:
            watch.unsubscribe()
        with self.assertRaises(ValueError):
            jetfabric.connect(_fabric.url(), heartbeat=-1)

    def test_keeps_an_idle_session(self):
        """On a device with a short idle timeout (python_test.go starts one),
        a session whose client beats survives while one whose client does not
        is freed, and its next read says so."""
        dev = os.environ.get("JETFABRIC_IDLE_DEVICE")
        if not dev:
            raise unittest.SkipTest("no device with a short idle timeout (JETFABRIC_IDLE_DEVICE)")
        with jetfabric.connect(_fabric.url(), heartbeat=0.05) as alive, \
                jetfabric.connect(_fabric.url(), heartbeat=0) as silent:
            sa, ss = alive.session(dev), silent.session(dev)
            xa, xs = sa.full([2], 3.0), ss.full([2], 5.0)
            sa.sync()
            # The stream sequence of the silent session's last frame: a
            # registry entry written before it ran may count one session.
            seq = ss._call({"op": "sync"}, None).get("seq", 0)
            self.assertGreater(seq, 0)
            # Wait until the worker has freed one of the two sessions.
            deadline = time.monotonic() + 20
            while True:
                entry = [d for d in alive.devices() if d["name"] == dev]
                if entry and entry[0].get("applied", 0) >= seq and entry[0].get("sessions") == 1:
                    break
                if time.monotonic() > deadline:
                    self.fail("the worker did not free the silent session: %r" % entry)
                time.sleep(0.02)
            self.assertEqual(xa.tolist(), [3.0, 3.0])
            with self.assertRaises(jetfabric.SessionFreedError) as cm:
                xs.tolist()
            self.assertIn("freed", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
