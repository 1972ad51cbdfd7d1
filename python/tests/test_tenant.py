"""Credentials and tenants: the Ed25519 signature against RFC 8032 and Go's
nkeys, and a tenant's session on a fabric with tenants (when the Go test
python_test.go starts one and sets JETFABRIC_TENANT_URL)."""

import os
import unittest

import jetfabric
from jetfabric import nkeys


class TestEd25519(unittest.TestCase):
    def test_rfc8032(self):
        # RFC 8032 section 7.1, test 2.
        seed = bytes.fromhex("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb")
        self.assertEqual(nkeys.public_key(seed).hex(), "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c")
        self.assertEqual(nkeys.sign(seed, b"\x72").hex(),
                         "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
                         "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00")

    def test_go_nkeys(self):
        # seed:nonce:signature made by Go's nkeys in python_test.go.
        vec = os.environ.get("JETFABRIC_NKEY_VECTOR")
        if not vec:
            self.skipTest("JETFABRIC_NKEY_VECTOR not set")
        seed, nonce, sig = vec.split(":")
        self.assertEqual(nkeys.sign_nonce(seed, nonce), sig)

    def test_bad_seeds(self):
        for bad in ["", "SUAB", "not base32 !", "SUAM" + "A" * 54]:
            with self.assertRaises(ValueError):
                nkeys.seed_bytes(bad)
        with self.assertRaises(ValueError):
            nkeys.parse_creds("no creds here")


class TestTenant(unittest.TestCase):
    def setUp(self):
        self.url = os.environ.get("JETFABRIC_TENANT_URL")
        if not self.url:
            self.skipTest("JETFABRIC_TENANT_URL not set (python_test.go sets it)")
        self.creds = os.environ["JETFABRIC_TENANT_CREDS"]

    def test_session(self):
        with jetfabric.connect(self.url, creds=self.creds) as f:
            self.assertEqual(f.tenant, "alice")
            self.assertTrue(jetfabric.live(f.device("cpu-0")))
            with f.session("cpu-0") as s:
                x = s.tensor([[1.0, 2.0], [3.0, 4.0]])
                self.assertEqual((x @ x).tolist(), [[7.0, 10.0], [15.0, 22.0]])
                big = s.tensor([float(i % 13) for i in range(300_000)])  # through the tenant's bucket
                self.assertEqual((big + big).sum().item(), 2 * sum(i % 13 for i in range(300_000)))
            self.assertEqual(f.live_devices(), ["cpu-0"])

    def test_session_needs_a_live_device(self):
        # A tenant reads the registry by direct gets, and asks the broker's
        # registry service before calling a device unregistered or not serving.
        with jetfabric.connect(self.url, creds=self.creds) as f:
            with self.assertRaises(jetfabric.NoDeviceError) as cm:
                f.session("nosuch-0")
            self.assertIn("nosuch-0 is not registered", str(cm.exception))
            gone = os.environ.get("JETFABRIC_GONE_DEVICE")
            if gone:
                with self.assertRaises(jetfabric.NoDeviceError) as cm:
                    f.session(gone)
                self.assertIn("%s is stopped" % gone, str(cm.exception))
            with self.assertRaises(ValueError):
                f.session("cpu.0")

    def test_refused(self):
        with self.assertRaises(jetfabric.FabricError) as cm:
            jetfabric.connect(self.url, creds=os.environ["JETFABRIC_TENANT_FOREIGN"])
        self.assertIn("refused the credentials", str(cm.exception))
        with self.assertRaises(jetfabric.FabricError):
            jetfabric.connect(self.url)  # no credentials


if __name__ == "__main__":
    unittest.main()
