"""A session that outlives its connection, against processes of their own:
a broker (jetfabric broker, a file store, so that its stream and buckets
survive its restart) and a worker (jetfabric worker), both started here
from JETFABRIC_BIN, else ../bin/jetfabric (the tests skip without one).

The broker is stopped and started again under a session, which carries
on; a proxy between the client and the broker (tests/_proxy.py) loses
acknowledgements and answers, and cuts the connection, so that the
client's publishing again (stored once, run once) and asking again are
seen to happen; bad URLs and a fabric that is not there fail within their
deadline, saying why. Every wait is for a condition, with a generous
bound: the machine may be loaded."""

import hashlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import jetfabric

from ._proxy import Proxy

_HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(cond, timeout: float = 120.0, what: str = "condition"):
    """Polls cond until it returns something true, or fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("%s not met within %.0fs" % (what, timeout))
        time.sleep(0.02)


class Processes:
    """A broker and a worker, processes of jetfabric's binary."""

    def __init__(self, binary: str):
        self.binary = binary
        self.store = tempfile.mkdtemp(prefix="jetfabric-py-reconnect-")
        self.port = _free_port()
        self.url = "nats://127.0.0.1:%d" % self.port
        self.broker = None
        self.worker = None
        self.logs = open(os.path.join(self.store, "log"), "w+b")

    def start_broker(self) -> None:
        self.broker = subprocess.Popen([self.binary, "broker", "--listen", "127.0.0.1:%d" % self.port,
                                        "--store", os.path.join(self.store, "js"), "--http", ""],
                                       stdout=self.logs, stderr=self.logs)

    def stop_broker(self) -> None:
        self.broker.send_signal(signal.SIGTERM)
        try:
            self.broker.wait(60)
        except subprocess.TimeoutExpired:
            self.broker.kill()
            self.broker.wait()

    def start_worker(self) -> None:
        self.worker = subprocess.Popen([self.binary, "worker", "--url", self.url, "--cpus", "1", "--gpus", "none"],
                                       stdout=self.logs, stderr=self.logs)

    def wait_serving(self) -> None:
        """Waits until cpu-0 is live in the registry."""
        def serving():
            try:
                with jetfabric.connect(self.url, timeout=5, reconnect=False) as f:
                    return "cpu-0" in f.live_devices()
            except jetfabric.FabricError:
                return False
        wait_until(serving, what="cpu-0 served at %s (log: %s)" % (self.url, self.log()))

    def log(self) -> str:
        self.logs.flush()
        with open(self.logs.name, "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def stop(self) -> None:
        for p in (self.worker, self.broker):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.logs.close()
        shutil.rmtree(self.store, True)


procs = None


def setUpModule():
    global procs
    if os.environ.get("JETFABRIC_RECONNECT_TESTS") == "0":
        raise unittest.SkipTest("JETFABRIC_RECONNECT_TESTS=0 (go test ./python runs them in TestPythonReconnect)")
    binary = os.environ.get("JETFABRIC_BIN") or os.path.join(_HERE, "..", "..", "bin", "jetfabric")
    if not os.path.exists(binary):
        raise unittest.SkipTest("no jetfabric binary: set JETFABRIC_BIN, or go build -o bin/jetfabric ./cmd/jetfabric")
    procs = Processes(binary)
    procs.start_broker()
    procs.start_worker()
    procs.wait_serving()


def tearDownModule():
    if procs is not None:
        procs.stop()


class TestBadInput(unittest.TestCase):
    def test_garbage_urls(self):
        # Each is refused before anything is dialled, naming the entry.
        for url, says in (("", "empty broker URL"),
                          ("%s, ,%s" % (procs.url, procs.url), "empty broker URL"),
                          ([procs.url, "ftp://127.0.0.1:21"], "unsupported URL scheme 'ftp'"),
                          ("nats://127.0.0.1:notaport", "the port is not a number"),
                          ("nats://127.0.0.1:0", "the port is not a number"),
                          ("nats://127.0.0.1:4222/some/path", "not of the form"),
                          ([], "no broker URL given"),
                          ([procs.url, None], "is not a string"),
                          (42, "want a string")):
            with self.subTest(url=url):
                with self.assertRaises(jetfabric.FabricError) as cm:
                    jetfabric.connect(url)
                self.assertNotIsInstance(cm.exception, jetfabric.ConnectionClosedError)
                self.assertIn(says, str(cm.exception))
        for kw in ({"reconnect_time": -1}, {"reconnect_wait": 0}, {"reconnect_wait": 3, "reconnect_max_wait": 1},
                   {"reconnect_buffer": -1}, {"ping_interval": -1}, {"max_pings_out": 0}, {"fail_fast": 0}, {"device_timeout": -1}, {"publish_window": 0}):
            with self.subTest(kw=kw):
                with self.assertRaises(ValueError):
                    jetfabric.connect(procs.url, **kw)

    def test_no_broker(self):
        dead = "nats://127.0.0.1:%d" % _free_port()
        with self.assertRaises(jetfabric.ConnectionClosedError) as cm:
            jetfabric.connect(dead, timeout=5)
        self.assertIn("no broker at %s" % dead, str(cm.exception))
        self.assertIn("connection refused", str(cm.exception))
        # Two URLs, neither answering: the error names both.
        dead2 = "nats://127.0.0.1:%d" % _free_port()
        with self.assertRaises(jetfabric.ConnectionClosedError) as cm:
            jetfabric.connect([dead, dead2], timeout=5)
        self.assertIn("any of 2 URLs", str(cm.exception))
        self.assertIn(dead, str(cm.exception))
        self.assertIn(dead2, str(cm.exception))

    def test_silent_server_deadline(self):
        # A server that accepts and says nothing: connect gives up at its
        # deadline, for all the URLs together, and says what it waited for.
        ls = [socket.socket(), socket.socket()]
        try:
            for s in ls:
                s.bind(("127.0.0.1", 0))
                s.listen(4)
            urls = ["nats://127.0.0.1:%d" % s.getsockname()[1] for s in ls]
            t0 = time.monotonic()
            with self.assertRaises(jetfabric.TimeoutError) as cm:
                jetfabric.connect(urls, timeout=1.0)
            took = time.monotonic() - t0
            self.assertIn("no INFO from", str(cm.exception))
            self.assertGreaterEqual(took, 1.0)
            self.assertLess(took, 30.0)  # the deadline, not a wait for ever (with room for a loaded machine)
        finally:
            for s in ls:
                s.close()

    def test_first_url_that_answers(self):
        dead = "nats://127.0.0.1:%d" % _free_port()
        with jetfabric.connect("%s,%s" % (dead, procs.url)) as fab:
            self.assertEqual(fab.conn.url, procs.url)
            with fab.session("cpu-0") as s:
                self.assertEqual(s.tensor([1.0, 2.0]).sum().item(), 3.0)


class TestLostAnswers(unittest.TestCase):
    """Through the proxy: what the server sends is lost, the broker stays up."""

    def setUp(self):
        self.proxy = Proxy(("127.0.0.1", procs.port))
        self.addCleanup(self.proxy.close)

    def test_lost_ack_published_again_stored_once(self):
        with jetfabric.connect(self.proxy.url) as fab:
            s = fab.session("cpu-0")
            x = s.tensor([1.0, 2.0])
            s.sync()
            # The stream's acknowledgement of the next frame is lost.
            self.proxy.drop("%s.%d" % (s._ack_reply, s._frame + 1))
            y = x * 3
            fr = s.flush()
            msg_id = "Nats-Msg-Id: %s-%d\r\n" % (s.subject, fr.n)
            wait_until(lambda: fab.undelivered()[0] == 0 and s.redelivered >= 1, what="the frame published again and acknowledged")
            self.assertEqual(self.proxy.dropped, 1)
            self.assertEqual(self.proxy.sent_count(msg_id), 2)
            # The stream had it: the second copy was acknowledged as a duplicate.
            self.assertGreaterEqual(self.proxy.received_matches(r'"duplicate":\s*true'), 1)
            # Run once: a second run would make y's id twice (a duplicate error).
            self.assertEqual(y.tolist(), [3.0, 6.0])
            s.sync()

            # The acknowledgement lost with the connection: published again once connected.
            self.proxy.drop("%s.%d" % (s._ack_reply, s._frame + 1), cut=True)
            z = y + x
            fr = s.flush()
            msg_id = "Nats-Msg-Id: %s-%d\r\n" % (s.subject, fr.n)
            wait_until(lambda: fab.conn.reconnects >= 1 and fab.undelivered()[0] == 0, what="reconnected, the frame acknowledged")
            self.assertEqual(self.proxy.dropped, 2)
            self.assertGreaterEqual(self.proxy.sent_count(msg_id), 2)
            self.assertEqual(z.tolist(), [4.0, 8.0])
            s.sync()
            s.close()

    def test_answer_lost_on_the_workers_side(self):
        # The worker's answer is lost and the connection stays up: the client
        # learns from the registry that the worker applied the frame, and asks again.
        with jetfabric.connect(self.proxy.url) as fab:
            s = fab.session("cpu-0")
            x = s.tensor([2.0, 3.0])
            s.sync()
            self.proxy.drop(s.inbox)
            self.assertEqual((x + x).read(timeout=60).tolist(), [4.0, 6.0])
            self.assertEqual(self.proxy.dropped, 1)
            self.assertEqual(fab.conn.reconnects, 0)
            self.assertGreaterEqual(s.reasked, 1)
            self.assertEqual(x.tolist(), [2.0, 3.0])
            s.close()

    def test_answer_lost_with_the_connection(self):
        with jetfabric.connect(self.proxy.url) as fab:
            s = fab.session("cpu-0")
            x = s.tensor([1.0, -1.0])
            s.sync()
            self.proxy.drop(s.inbox, cut=True)
            self.assertEqual((x * 5).read(timeout=60).tolist(), [5.0, -5.0])
            self.assertEqual(self.proxy.dropped, 1)
            self.assertGreaterEqual(fab.conn.reconnects, 1)
            self.assertGreaterEqual(s.reasked, 1)
            # The subscriptions were made again: the session goes on.
            self.assertEqual((x - 1).tolist(), [0.0, -2.0])
            s.close()

    def test_silent_connection(self):
        # The server's host is gone without a word (the proxy carries nothing
        # and closes nothing): PINGs without PONGs tell, and the connection
        # is made again; the read sent into the silence is asked again.
        with jetfabric.connect(self.proxy.url, ping_interval=0.5, fail_fast=60) as fab:
            s = fab.session("cpu-0")
            x = s.tensor([3.0])
            s.sync()
            self.proxy.freeze()
            self.assertEqual((x + 1).read(timeout=120).tolist(), [4.0])
            self.assertGreaterEqual(fab.conn.reconnects, 1)
            self.assertIn("stale connection", fab.conn._lost_why)
            s.close()

    def test_large_result_across_a_cut(self):
        # A result over the inline limit comes through the object store while
        # the client follows its chunks: the connection is cut with a chunk
        # in flight, and the read carries on, from the stream where needed.
        n = 8 << 20  # 32 MiB of f32, 128 chunks
        with jetfabric.connect(self.proxy.url) as fab:
            s = fab.session("cpu-0")
            x = s.full([n], 1.5)
            s.sync()
            self.proxy.drop("$O.FABRIC_RESULTS.C.", cut=True)  # results: in memory, FABRIC_RESULTS
            for _ in range(30):
                a = x.read(timeout=120)
                self.assertEqual(a.shape, (n,))
                self.assertEqual(bytes(a.data), struct.pack("<f", 1.5) * n)
                if self.proxy.dropped:
                    break
                # Every chunk was stored before the read subscribed (a slow
                # or loaded machine: the -race build, another run beside),
                # so none came live: read again until one does.
            self.assertEqual(self.proxy.dropped, 1)
            self.assertGreaterEqual(fab.conn.reconnects, 1)
            self.assertEqual((x.sum()).item(), 1.5 * n)
            s.close()

    def test_upload_across_a_cut(self):
        # A large upload whose chunk acknowledgement is lost with the
        # connection, cut mid-write, starts over once connected, on a new
        # chunk subject, as the Go client's writes do; the worker, which
        # followed the first subject, reads the object the write made.
        n = 6 << 20  # f32: 24 MiB, 96 chunks
        data = os.urandom(4096) * (n * 4 // 4096)
        with jetfabric.connect(self.proxy.url) as fab:
            s = fab.session("cpu-0")
            s.sync()
            self.proxy.drop(re.compile(re.escape(fab.conn._mux_prefix.encode()) + rb"[0-9a-f]+\.40$"), cut=True)
            t = s.upload(data, "f32", [n])
            self.assertEqual(self.proxy.dropped, 1)
            self.assertGreaterEqual(fab.conn.reconnects, 1)
            self.assertGreaterEqual(fab.objects.restarts, 1)
            back = t.read(timeout=120)
            self.assertEqual(hashlib.sha256(back.data).digest(), hashlib.sha256(data).digest())
            meta = fab.objects.info("upload-" + hashlib.sha256(data).hexdigest())
            self.assertEqual((meta["size"], meta["chunks"]), (len(data), 96))
            s.close()

    def test_object_write_without_retries(self):
        # With retries=0 a write whose acknowledgement is lost with the
        # connection does not start over: it raises, saying it gave up, and
        # stores no object; the connection is made again all the same.
        n = 4 << 20  # 16 chunks
        data = os.urandom(4096) * (n // 4096)
        with jetfabric.connect(self.proxy.url) as fab:
            fab.conn.flush()
            name = "pytest-noretry-" + os.urandom(8).hex()
            self.proxy.drop(re.compile(re.escape(fab.conn._mux_prefix.encode()) + rb"[0-9a-f]+\.5$"), cut=True)
            with self.assertRaises(jetfabric.DisconnectedError) as cm:
                fab.objects.put(name, data, retries=0)
            self.assertIn("gave up after 0 restarts", str(cm.exception))
            self.assertEqual(self.proxy.dropped, 1)
            self.assertEqual(fab.objects.restarts, 0)
            fab.conn.wait_connected(30)
            self.assertIsNone(fab.objects.info(name))
            # The next write, with the default retries, is stored.
            meta = fab.objects.put(name, data)
            self.assertEqual((meta["size"], meta["chunks"]), (n, 16))
            self.assertEqual(hashlib.sha256(fab.objects.get(name)).digest(), hashlib.sha256(data).digest())

    def test_reconnects_to_another_url(self):
        with jetfabric.connect([self.proxy.url, procs.url]) as fab:
            self.assertEqual(fab.conn.url, self.proxy.url)
            s = fab.session("cpu-0")
            x = s.tensor([7.0])
            s.sync()
            self.proxy.close()  # the first URL is gone for good
            wait_until(lambda: fab.conn.reconnects >= 1, what="reconnected")
            self.assertEqual(fab.conn.url, procs.url)
            self.assertEqual((x + 1).tolist(), [8.0])
            s.close()


class TestBrokerRestart(unittest.TestCase):
    def test_session_carries_on(self):
        fab = jetfabric.connect(procs.url)
        self.addCleanup(fab.close)
        # A read issued while the broker is down, by a client that rides
        # out the restart, is answered once it is back.
        patient = jetfabric.connect(procs.url, fail_fast=600)
        self.addCleanup(patient.close)
        # A client that gives up reconnecting after a second.
        quitter = jetfabric.connect(procs.url, reconnect_time=1.0)
        self.addCleanup(quitter.close)

        s = fab.session("cpu-0")
        x = s.tensor([1.0, 2.0, 3.0])
        y = x * 2
        self.assertEqual(y.tolist(), [2.0, 4.0, 6.0])
        ps = patient.session("cpu-0")
        a = ps.tensor([5.0])
        ps.sync()

        procs.stop_broker()
        wait_until(lambda: fab.conn.status == "reconnecting", what="the client sees the broker gone")
        # A read while the broker is down fails within fail_fast (and the
        # checks' bounds), saying why.
        t0 = time.monotonic()
        with self.assertRaises(jetfabric.DisconnectedError) as cm:
            (y + 1).tolist()
        took = time.monotonic() - t0
        self.assertIn("no connection to the broker", str(cm.exception))
        self.assertIn(procs.url, str(cm.exception))
        self.assertIn("read on cpu-0", str(cm.exception))
        self.assertLess(took, 60.0)
        # Other calls say the same at once.
        with self.assertRaises(jetfabric.DisconnectedError):
            fab.devices()
        # Ops sent meanwhile are kept until the connection is back.
        z = y + x
        s.flush()
        self.assertGreater(fab.conn.buffered(), 0)

        got = {}

        def patient_read():
            try:
                got["v"] = (a * 2).read(timeout=300).tolist()
            except Exception as e:  # noqa: BLE001 - reported below
                got["err"] = e

        th = threading.Thread(target=patient_read)
        th.start()
        wait_until(lambda: patient.conn.buffered() > 0, what="the patient read's frame kept")

        wait_until(lambda: quitter.conn.closed, what="the quitter gives up")
        with self.assertRaises(jetfabric.ConnectionClosedError) as cm:
            quitter.devices()
        self.assertNotIsInstance(cm.exception, jetfabric.DisconnectedError)
        self.assertIn("could not connect again", str(cm.exception))

        procs.start_broker()
        th.join(300)
        self.assertFalse(th.is_alive())
        self.assertNotIn("err", got, got.get("err"))
        self.assertEqual(got["v"], [10.0])
        # The same session carries on, with every tensor it had.
        self.assertEqual((z + 1).tolist(), [4.0, 7.0, 10.0])
        self.assertEqual(y.tolist(), [2.0, 4.0, 6.0])
        self.assertGreaterEqual(fab.conn.reconnects, 1)
        # Large tensors go through the object store, which is back too.
        big = s.tensor(list(range(300000)), dtype="f64")
        self.assertEqual(big.sum().item(), float(sum(range(300000))))
        self.assertEqual(big[-1].item(), 299999.0)
        s.sync()
        s.close()
        ps.close()
        procs.wait_serving()

    def test_object_write_carries_on(self):
        # The broker restarts while a large object is being written: the
        # write starts over once connected, on a new chunk subject, and
        # stores the object a write without the restart stores; the first
        # subject is purged.
        n = 16 << 20  # 64 chunks
        data = os.urandom(4096) * (n // 4096)
        fab = jetfabric.connect(procs.url)
        self.addCleanup(fab.close)
        started, down = threading.Event(), threading.Event()
        publish = fab.conn.publish

        def watched(subject, data=b"", reply="", headers=None):
            if subject.startswith("$O.") and reply.endswith(".8") and not started.is_set():
                # The write is under way, 8 chunks sent: the rest go out
                # once the broker is down.
                started.set()
                down.wait(120)
            return publish(subject, data, reply, headers)

        fab.conn.publish = watched
        name, first = "pytest-restart-" + os.urandom(8).hex(), os.urandom(16).hex()
        got = {}

        def write():
            try:
                got["meta"] = fab.objects.put(name, data, nuid=first)
            except Exception as e:  # noqa: BLE001 - reported below
                got["err"] = e

        th = threading.Thread(target=write)
        th.start()
        self.assertTrue(started.wait(60), "the write did not start")
        procs.stop_broker()
        wait_until(lambda: fab.conn.status == "reconnecting", what="the client sees the broker gone")
        down.set()
        procs.start_broker()
        th.join(300)
        self.assertFalse(th.is_alive())
        self.assertNotIn("err", got, got.get("err"))
        self.assertGreaterEqual(fab.conn.reconnects, 1)
        self.assertGreaterEqual(fab.objects.restarts, 1)
        meta = got["meta"]
        self.assertNotEqual(meta["nuid"], first)
        self.assertEqual((meta["size"], meta["chunks"]), (n, 64))
        self.assertEqual(fab.objects.info(name)["nuid"], meta["nuid"])
        self.assertEqual(hashlib.sha256(fab.objects.get(name)).digest(), hashlib.sha256(data).digest())
        held = fab.conn.js_api("STREAM.INFO." + fab.objects.stream, {"subjects_filter": "$O.%s.C.>" % fab.xfer_bucket})
        subjects = held["state"].get("subjects") or {}
        self.assertNotIn(fab.objects.chunk_subject(first), subjects)
        self.assertEqual(subjects.get(fab.objects.chunk_subject(meta["nuid"])), 64)
        fab.objects.delete(name)
        procs.wait_serving()

if __name__ == "__main__":
    unittest.main()
