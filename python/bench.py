"""Measures the Python client against a running fabric:

    python3 bench.py --url nats://127.0.0.1:4222 [--rounds 2000] [--mib 64]

tiny op + read round trips (p50, p90, p99), pipelined ops per second, and a
large upload and read-back through the object store (MB/s each way)."""

import argparse
import os
import statistics
import time

import jetfabric


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", default=os.environ.get("JETFABRIC_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--device", default="cpu-0")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--ops", type=int, default=100000)
    p.add_argument("--mib", type=int, default=64)
    a = p.parse_args()
    with jetfabric.connect(a.url) as fab, fab.session(a.device) as s:
        x = s.full((), 1.0)
        for _ in range(50):
            (x + x).item()
        lat = []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            y = x + x  # one op, as the Go client's benchmark
            y.item()
            lat.append(time.perf_counter() - t0)
            y.free()
        lat.sort()
        q = lambda f: lat[int(f * (len(lat) - 1))] * 1e6
        print("tiny op + read: p50 %.0f us, p90 %.0f us, p99 %.0f us (%d rounds)" % (q(0.5), q(0.9), q(0.99), a.rounds))
        t0 = time.perf_counter()
        y = x
        for _ in range(a.ops):
            y = y + x
        y.item()
        dt = time.perf_counter() - t0
        print("pipelined: %d dependent adds in %.2fs: %.0f ops/s" % (a.ops, dt, a.ops / dt))
        if a.mib:
            data = os.urandom(a.mib << 20)
            t0 = time.perf_counter()
            t = s.upload(data, "u8", [len(data)])
            s.sync()
            up = time.perf_counter() - t0
            t = t + s.full((), 0, dtype="u8")  # a new tensor, so the read is a real read
            s.sync()
            t0 = time.perf_counter()
            back = t.read()
            down = time.perf_counter() - t0
            assert bytes(back.data) == data
            mb = len(data) / 1e6
            print("%d MiB upload %.0f MB/s (%.3fs), read-back %.0f MB/s (%.3fs)" % (a.mib, mb / up, up, mb / down, down))


if __name__ == "__main__":
    main()
