"""Measures the Python client, and the Go client beside it, on one fabric:

    python3 bench.py --start ../bin/jetfabric [--xfer-storage memory] --go [--runs 3]
    python3 bench.py --url nats://127.0.0.1:4222 [--go ../bin/jetfabric]

tiny op + read round trips (p50, p90, p99), pipelined ops per second, and a
64 MiB upload and read-back through the object store (MB/s each way, medians
of 3, as `jetfabric bench` takes them: bytes never uploaded before each time,
the uploaded tensor read back), with hashlib's SHA-256 rate over the same
bytes (the object store hashes every byte, each way).

--start BIN starts a fabric for the run: a broker (FABRIC_XFER on
--xfer-storage) and a worker, each a process of its own, on a free port.
--go runs `jetfabric bench --url` (BIN from --start, or the path given) on
the same fabric in each run, before the Python client, and prints the
ratios of the two."""

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jetfabric  # noqa: E402


def measure(url, device, rounds, ops, mib):
    """The Python client's figures on the fabric at url."""
    r = {}
    with jetfabric.connect(url) as fab, fab.session(device) as s:
        x = s.full((), 1.0)
        for _ in range(50):
            (x + x).item()
        lat = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            y = x + x  # one op, as the Go client's benchmark
            y.item()
            lat.append(time.perf_counter() - t0)
            y.free()
        lat.sort()
        for q in (50, 90, 99):
            r["p%d_us" % q] = lat[int(q / 100 * (len(lat) - 1))] * 1e6
        t0 = time.perf_counter()
        y = x
        for _ in range(ops):
            y = y + x
        y.item()
        r["pipelined_ops_s"] = ops / (time.perf_counter() - t0)
        if mib:
            data = bytearray(i % 251 for i in range(256)) * ((mib << 20) // 256)
            up, back = [], []
            for _ in range(3):
                # New bytes each run, and each bench (the Go client's on the same
                # fabric too): an upload of bytes stored before is not sent again.
                data[:8] = os.urandom(8)
                t0 = time.perf_counter()
                t = s.upload(data, "u8", [len(data)])
                s.sync()
                up.append(len(data) / 1e6 / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                got = t.read()
                back.append(len(data) / 1e6 / (time.perf_counter() - t0))
                if got.data != data:
                    raise SystemExit("read-back differs from the upload")
                t.free()
                del got
            r["upload_mb_s"], r["read_mb_s"] = statistics.median(up), statistics.median(back)
            # The object store hashes every byte (SHA-256, each way): hashlib's
            # rate on this machine, in this run, bounds what a client can do.
            sha = []
            for _ in range(3):
                t0 = time.perf_counter()
                hashlib.sha256(data).digest()
                sha.append(len(data) / 1e6 / (time.perf_counter() - t0))
            r["sha256_mb_s"] = statistics.median(sha)
    return r


def go_bench(binary, url, device, rounds, ops, mib):
    """`jetfabric bench --url` on the same fabric: the Go client's figures."""
    out = subprocess.run([binary, "bench", "--url", url, "--device", device, "--rounds", str(rounds), "--ops", str(ops),
                          "--upload-mib", str(mib), "--json"], check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)


def start_fabric(binary, storage):
    """A broker and a worker, each a process of its own; returns the URL and a stop function."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    store = tempfile.mkdtemp(prefix="jetfabric-pybench-")
    url = "nats://127.0.0.1:%d" % port
    procs = [subprocess.Popen([binary, "broker", "--listen", "127.0.0.1:%d" % port, "--http", "", "--store", store,
                               "--xfer-storage", storage], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def stop():
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(store, True)

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                jetfabric.nats.Connection(url).close()
                break
            except jetfabric.FabricError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        procs.append(subprocess.Popen([binary, "worker", "--url", url, "--idle-timeout", "1h", "--gpus", "none"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with jetfabric.connect(url) as fab:
            while True:
                try:
                    if "cpu-0" in fab.live_devices():
                        break
                except jetfabric.FabricError:
                    pass  # the broker is still making the registry
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not serve cpu-0 within 30s")
                time.sleep(0.1)
    except BaseException:
        stop()
        raise
    return url, stop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get("JETFABRIC_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--start", metavar="BIN", help="start a fabric with this jetfabric binary")
    p.add_argument("--xfer-storage", default="file", choices=("file", "memory"), help="with --start: the broker's -xfer-storage")
    p.add_argument("--go", nargs="?", const="", metavar="BIN", help="also run the Go client's bench on the same fabric")
    p.add_argument("--device", default="cpu-0")
    p.add_argument("--runs", type=int, default=1, help="runs, each the Go client's (with --go) then the Python client's")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--ops", type=int, default=100000)
    p.add_argument("--mib", type=int, default=64)
    a = p.parse_args()
    go = a.go
    if go == "":
        go = a.start
        if not go:
            p.error("--go needs a binary when --start is not given")
    url, stop = a.url, (lambda: None)
    if a.start:
        url, stop = start_fabric(a.start, a.xfer_storage)
        print("fabric: broker (FABRIC_XFER on %s) and worker as separate processes at %s" % (a.xfer_storage, url))
    try:
        print("machine: %d CPUs, %s" % (os.cpu_count(), sys.version.split()[0]))
        for run in range(a.runs):
            g = go_bench(go, url, a.device, a.rounds, a.ops, a.mib) if go else None
            r = measure(url, a.device, a.rounds, a.ops, a.mib)
            print("run %d python: tiny op + read p50 %.0f us, p90 %.0f us, p99 %.0f us; pipelined %.0f ops/s" % (
                run + 1, r["p50_us"], r["p90_us"], r["p99_us"], r["pipelined_ops_s"]))
            if a.mib:
                print("run %d python: %d MiB upload %.0f MB/s, read-back %.0f MB/s (medians of 3); hashlib sha256 %.0f MB/s" % (
                    run + 1, a.mib, r["upload_mb_s"], r["read_mb_s"], r["sha256_mb_s"]))
            if g:
                print("run %d go:     tiny op + read p50 %.0f us, p99 %.0f us; pipelined %.0f ops/s; raw request/reply p50 %.0f us" % (
                    run + 1, g["roundtrip_p50_us"], g["roundtrip_p99_us"], g["pipelined_ops_per_s"], g["raw_request_p50_us"]))
                line = "run %d python/go: tiny op p50 %.2fx" % (run + 1, r["p50_us"] / g["roundtrip_p50_us"])
                if a.mib:
                    print("run %d go:     %d MiB upload %.0f MB/s, read-back %.0f MB/s (medians of 3)" % (
                        run + 1, a.mib, g["upload_64mib_mb_per_s"], g["read_64mib_mb_per_s"]))
                    line += ", upload %.2fx, read-back %.2fx" % (r["upload_mb_s"] / g["upload_64mib_mb_per_s"],
                                                                r["read_mb_s"] / g["read_64mib_mb_per_s"])
                print(line)
    finally:
        stop()


if __name__ == "__main__":
    main()
