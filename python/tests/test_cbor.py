import math
import struct
import unittest

from jetfabric import cbor


class TestCBOR(unittest.TestCase):
    def test_round_trip(self):
        for v in [0, 23, 24, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -24, -25, -2**63, 1.5, -0.0,
                  float("inf"), "", "héllo", b"", b"\x00\xff", [], [1, [2, [3]]], {}, {"a": 1, "b": [True, False, None]}]:
            with self.subTest(v=v):
                self.assertEqual(cbor.loads(cbor.dumps(v)), v)
        self.assertTrue(math.isnan(cbor.loads(cbor.dumps(float("nan")))))

    def test_known_bytes(self):
        # RFC 8949 appendix A.
        self.assertEqual(cbor.dumps(100), bytes.fromhex("1864"))
        self.assertEqual(cbor.dumps(-1000), bytes.fromhex("3903e7"))
        self.assertEqual(cbor.dumps([1, 2, 3]), bytes.fromhex("83010203"))
        self.assertEqual(cbor.dumps({"a": 1}), bytes.fromhex("a1616101"))
        self.assertEqual(cbor.loads(bytes.fromhex("f93c00")), 1.0)          # half
        self.assertEqual(cbor.loads(bytes.fromhex("fa47c35000")), 100000.0)  # single
        self.assertEqual(cbor.loads(bytes.fromhex("c11a514b67b0")), 1363896240)  # a tag: its content

    def test_bad_input(self):
        for b in [b"", b"\x18", b"\x5a\x00\x00\x00\x10ab", b"\x9f\x01\xff", b"\x01\x02"]:
            with self.subTest(b=b):
                with self.assertRaises(cbor.CBORError):
                    cbor.loads(b)
        with self.assertRaises(cbor.CBORError):
            cbor.dumps(object())
        with self.assertRaises(cbor.CBORError):
            cbor.dumps(2**64)


if __name__ == "__main__":
    unittest.main()
