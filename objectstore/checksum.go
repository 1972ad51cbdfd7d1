package objectstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// hdrCRC32 carries, in an object's meta headers, the CRC-32 (IEEE, as
// zlib and Python's zlib.crc32 compute it) of the object's data as 8
// lowercase hex digits. Put writes it beside the SHA-256 digest, and a
// reader that finds it checks the data against it instead of the digest:
// it catches what the digest catches short of a writer that lies (a lost,
// extra, stale or foreign chunk, a replaced object) at about a twentieth
// of the CPU (one core: 30 GB/s against 1.3 to 1.9 for SHA-256). The
// digest stays in the meta, as the format requires, and is what a reader
// without the header (nats.go, the nats CLI, an object another tool wrote)
// checks.
const hdrCRC32 = "Jetfabric-Crc32"

// checkOf returns the hash a reader of the object that oi describes
// computes over its data: CRC-32 where the meta carries a well-formed
// one, else SHA-256. The digest itself must be well formed either way.
func checkOf(oi *jetstream.ObjectInfo) (hash.Hash, error) {
	if _, err := parseDigest(oi.Digest); err != nil {
		return nil, err
	}
	if _, ok := crcOf(oi); ok {
		return crc32.NewIEEE(), nil
	}
	return sha256.New(), nil
}

// crcOf returns the CRC-32 that oi's headers give, and whether they give
// a well-formed one. A malformed value is ignored: the reader checks the
// digest instead.
func crcOf(oi *jetstream.ObjectInfo) (uint32, bool) {
	if oi.Headers == nil {
		return 0, false
	}
	v := oi.Headers.Get(hdrCRC32)
	if len(v) != 8 {
		return 0, false
	}
	b, err := hex.DecodeString(v)
	if err != nil {
		return 0, false
	}
	return binary.BigEndian.Uint32(b), true
}

// crcString is the header value for CRC-32 c.
func crcString(c uint32) string { return fmt.Sprintf("%08x", c) }

// verify checks sum, computed by the hash checkOf gave for oi, against
// oi: its CRC-32 or its digest.
func verify(oi *jetstream.ObjectInfo, sum []byte) error {
	if c, ok := crcOf(oi); ok {
		if len(sum) != crc32.Size || binary.BigEndian.Uint32(sum) != c {
			return fmt.Errorf("read CRC-32 %x, meta says %08x", sum, c)
		}
		return nil
	}
	want, err := parseDigest(oi.Digest)
	if err != nil {
		return err
	}
	if !bytes.Equal(sum, want) {
		return fmt.Errorf("read SHA-256 %x, meta says %x", sum, want)
	}
	return nil
}

// verifyData checks data, read while the meta was not known yet and
// hashed with CRC-32 as it came (crc), against oi: the CRC-32 where oi
// carries one, else the SHA-256 of data, computed now.
func verifyData(oi *jetstream.ObjectInfo, crc uint32, data []byte) error {
	if _, ok := crcOf(oi); ok {
		return verify(oi, binary.BigEndian.AppendUint32(nil, crc))
	}
	sum := sha256.Sum256(data)
	return verify(oi, sum[:])
}

// withCRC returns a copy of hdr that also carries CRC-32 c.
func withCRC(hdr nats.Header, c uint32) nats.Header {
	out := make(nats.Header, len(hdr)+1)
	for k, v := range hdr {
		out[k] = slices.Clone(v)
	}
	out.Set(hdrCRC32, crcString(c))
	return out
}
