"""python -m jetfabric devices [--url URL] [--tls-ca FILE] [--json]: the fabric's devices."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

from .client import Fabric, _parse_time, live
from .errors import FabricError


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jetfabric", description="jetfabric from Python")
    p.add_argument("--url", default=os.environ.get("JETFABRIC_URL", "nats://127.0.0.1:4222"),
                   help="the broker's URL (env JETFABRIC_URL)")
    p.add_argument("--prefix", default="fabric", help="the fabric's subject prefix")
    p.add_argument("--tls-ca", default=os.environ.get("JETFABRIC_TLS_CA", ""),
                   help="PEM certificates of the authorities to trust for the broker's TLS certificate (env JETFABRIC_TLS_CA)")
    p.add_argument("--tls-cert", default=os.environ.get("JETFABRIC_TLS_CERT", ""),
                   help="PEM client certificate, for a broker that verifies its clients (env JETFABRIC_TLS_CERT)")
    p.add_argument("--tls-key", default=os.environ.get("JETFABRIC_TLS_KEY", ""),
                   help="PEM private key of --tls-cert (env JETFABRIC_TLS_KEY)")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("devices", help="list the devices in the registry")
    d.add_argument("--json", action="store_true", help="print the registry entries as JSON")
    args = p.parse_args(argv)
    try:
        fab = Fabric(args.url, prefix=args.prefix, tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key)
    except FabricError as e:
        print("jetfabric: %s" % e, file=sys.stderr)
        return 1
    try:
        devs = fab.devices()
        if args.json:
            print(json.dumps(devs, indent=2))
            return 0
        now = time.time()
        print("%-8s %-4s %-10s %-8s %8s %10s  %s" % ("DEVICE", "KIND", "BACKEND", "STATE", "SESSIONS", "APPLIED", "BEAT"))
        for dv in devs:
            try:
                age = "%.1fs ago" % (now - _parse_time(dv.get("beat", "")))
            except ValueError:
                age = "?"
            print("%-8s %-4s %-10s %-8s %8d %10d  %s%s" % (dv.get("name"), dv.get("kind"), dv.get("backend"), dv.get("state"),
                                                          dv.get("sessions", 0), dv.get("applied", 0), age,
                                                          "" if live(dv, now) else " (not live)"))
        return 0
    except FabricError as e:
        print("jetfabric: %s" % e, file=sys.stderr)
        return 1
    finally:
        fab.close()


if __name__ == "__main__":
    sys.exit(main())
