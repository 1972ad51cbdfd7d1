"""The fabric the tests run against: JETFABRIC_URL when set (the Go test
python_test.go sets it to a broker and workers it started), else
`jetfabric up` started here from JETFABRIC_BIN or ../bin/jetfabric on a free
port with a temporary store; the tests skip when neither is available."""

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import jetfabric

_HERE = os.path.dirname(os.path.abspath(__file__))
_url = None
_proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop() -> None:
    if _proc is not None:
        _proc.terminate()
        try:
            _proc.wait(10)
        except subprocess.TimeoutExpired:
            _proc.kill()


def url() -> str:
    """The broker's URL, starting a fabric if needed (or skipping the test)."""
    global _url, _proc
    if _url:
        return _url
    env = os.environ.get("JETFABRIC_URL")
    if env:
        _url = env
        return _url
    binary = os.environ.get("JETFABRIC_BIN") or os.path.join(_HERE, "..", "..", "bin", "jetfabric")
    if not os.path.exists(binary):
        raise unittest.SkipTest("no fabric: set JETFABRIC_URL, or build bin/jetfabric (go build -o bin/jetfabric ./cmd/jetfabric)")
    store = tempfile.mkdtemp(prefix="jetfabric-py-")
    atexit.register(shutil.rmtree, store, True)
    port = _free_port()
    _proc = subprocess.Popen([binary, "up", "--listen", "127.0.0.1:%d" % port, "--store", store, "--http", "",
                              "--cpus", "2", "--gpus", "none", "--jobs", "cpu"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(_stop)
    candidate = "nats://127.0.0.1:%d" % port
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with jetfabric.connect(candidate) as f:
                if len(f.live_devices()) >= 2:
                    _url = candidate
                    return _url
        except jetfabric.FabricError:
            pass
        time.sleep(0.1)
    raise RuntimeError("jetfabric up did not serve two devices within 30s")
