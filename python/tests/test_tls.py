"""TLS: a broker that requires TLS and verifies client certificates, met
with the certificates `jetfabric certs` writes; each way a TLS connection
fails says what to do. The Go test python_test.go (TestPythonTLS) starts
the brokers and sets JETFABRIC_TLS_URL (TLS, client certificates verified),
JETFABRIC_TLS_DIR (its certificates), JETFABRIC_TLS_OTHER_DIR (another
authority's) and JETFABRIC_PLAIN_URL (a broker without TLS); without them
the tests skip. JETFABRIC_TLS_FIRST_URL is a broker that starts TLS before
its INFO (handshake_first)."""

import hashlib
import os
import random
import unittest

import jetfabric

URL = os.environ.get("JETFABRIC_TLS_URL", "")
DIR = os.environ.get("JETFABRIC_TLS_DIR", "")
OTHER = os.environ.get("JETFABRIC_TLS_OTHER_DIR", "")
PLAIN = os.environ.get("JETFABRIC_PLAIN_URL", "")
FIRST = os.environ.get("JETFABRIC_TLS_FIRST_URL", "")


def files(d: str) -> dict:
    return {"tls_ca": os.path.join(d, "ca.pem"), "tls_cert": os.path.join(d, "client.pem"),
            "tls_key": os.path.join(d, "client-key.pem")}


@unittest.skipUnless(URL and DIR and OTHER and PLAIN and FIRST, "no TLS fabric (python_test.go's TestPythonTLS sets one up)")
class TestTLS(unittest.TestCase):
    def test_round_trip(self):
        with jetfabric.connect(URL, **files(DIR)) as fab:
            self.assertIn(fab.conn.tls_version, ("TLSv1.2", "TLSv1.3"))
            with fab.session("cpu-0") as s:
                x = s.tensor([[1.0, 2.0], [3.0, 4.0]])
                self.assertEqual((x @ x + 1).sum(axis=0).tolist(), [24.0, 34.0])
                # 24 MiB each way through the object store, over TLS.
                n = 6 << 20
                data = bytes(random.Random(7).getrandbits(8) for _ in range(4096)) * (n * 4 // 4096)
                back = s.upload(data, "f32", [n]).read()
                self.assertEqual(hashlib.sha256(back.data).digest(), hashlib.sha256(data).digest())

    def test_nats_url_upgrades(self):
        # A nats:// URL meets a broker that requires TLS with TLS.
        with jetfabric.connect(URL.replace("tls://", "nats://"), **files(DIR)) as fab:
            self.assertIsNotNone(fab.conn.tls_version)
            self.assertTrue(fab.live_devices())

    def test_refusals(self):
        own, other = files(DIR), files(OTHER)
        cases = [
            ("no CA", URL, {}, ["requires TLS", "does not trust", "tls_ca"]),
            ("another CA", URL, {"tls_ca": other["tls_ca"]}, ["does not trust"]),
            ("no client certificate", URL, {"tls_ca": own["tls_ca"]}, ["verifies client certificates", "tls_cert"]),
            ("a foreign client certificate", URL, dict(own, tls_cert=other["tls_cert"], tls_key=other["tls_key"]),
             ["requires a client certificate", "tls_cert"]),
            ("TLS refused", URL.replace("tls://", "nats://"), {"tls": False}, ["requires TLS", "tls=False"]),
            ("TLS to a plain broker", PLAIN, {"tls_ca": own["tls_ca"]}, ["does not offer it"]),
            ("tls:// to a plain broker", PLAIN.replace("nats://", "tls://"), {}, ["does not offer it"]),
            ("certificate without key", URL, {"tls_ca": own["tls_ca"], "tls_cert": own["tls_cert"]}, ["both tls_cert and tls_key"]),
            ("missing CA file", URL, {"tls_ca": "/nonexistent/ca.pem"}, ["/nonexistent/ca.pem"]),
        ]
        for name, url, kw, mentions in cases:
            with self.subTest(name):
                with self.assertRaises(jetfabric.TLSError) as cm:
                    jetfabric.connect(url, timeout=20, **kw).close()
                for m in mentions:
                    self.assertIn(m, str(cm.exception))
        with self.assertRaises(jetfabric.FabricError):
            jetfabric.connect(URL, tls=False, **own)

    def test_handshake_first(self):
        with jetfabric.nats.Connection(FIRST, tls_ca=files(DIR)["tls_ca"], tls_handshake_first=True) as c:
            self.assertIsNotNone(c.tls_version)
            self.assertTrue(c.info.get("jetstream"))
            c.flush()
        # Waiting for an INFO such a server never sends in plain text fails.
        with self.assertRaises(jetfabric.TimeoutError) as cm:
            jetfabric.nats.Connection(FIRST, tls_ca=files(DIR)["tls_ca"], timeout=1)
        self.assertIn("tls_handshake_first=True", str(cm.exception))

    def test_plain_broker_without_tls(self):
        # TLS is used only where it is asked for or required.
        with jetfabric.connect(PLAIN) as fab:
            self.assertIsNone(fab.conn.tls_version)


if __name__ == "__main__":
    unittest.main()
