package objectstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/objectstore"
)

// TestCRC32: Put writes the data's CRC-32 in the meta's headers beside the
// digest (none when the caller gave the digest), and this package's
// readers check the data against it, where it is well formed, instead of
// the digest; nats.go, which knows only the digest, reads the same
// objects. A well-formed CRC-32 that does not match fails the read; a
// malformed one is ignored and the digest checked.
func TestCRC32(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10), objectstore.WithRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := randomBytes(1<<20+5, 11)
	header := func(name string) string {
		t.Helper()
		oi, err := e.obs.GetInfo(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return oi.Headers.Get("Jetfabric-Crc32")
	}
	for _, d := range [][]byte{data, {}} {
		name := fmt.Sprintf("crc-%d", len(d))
		if _, err := s.Put(ctx, name, d, nil); err != nil {
			t.Fatal(err)
		}
		if got, want := header(name), fmt.Sprintf("%08x", crc32.ChecksumIEEE(d)); got != want {
			t.Errorf("%d bytes: header %q, want %q", len(d), got, want)
		}
		if got, err := e.obs.GetBytes(ctx, name); err != nil || !bytes.Equal(got, d) {
			t.Errorf("%d bytes: nats.go get: %v", len(d), err)
		}
		if got, _, err := s.Get(ctx, name); err != nil || !bytes.Equal(got, d) {
			t.Errorf("%d bytes: get: %v", len(d), err)
		}
	}
	if _, err := s.Put(ctx, "given", data, nil, objectstore.WithSHA256(sha256.Sum256(data))); err != nil {
		t.Fatal(err)
	}
	if h := header("given"); h != "" {
		t.Errorf("an object put with a given digest has CRC-32 %q, want none", h)
	}

	// Metas rewritten over the same chunks: which check each reader makes.
	wrong := sha256.Sum256([]byte("other"))
	for _, tc := range []struct {
		name, crc string
		digest    bool // the digest is the data's
		ok        bool // this package reads it
	}{
		{"right CRC-32, wrong digest", fmt.Sprintf("%08x", crc32.ChecksumIEEE(data)), false, true},
		{"wrong CRC-32, right digest", "0badf00d", true, false},
		{"malformed CRC-32, right digest", "xyz", true, true},
		{"malformed CRC-32 of 8 characters, right digest", "0badf00g", true, true},
		{"malformed CRC-32, wrong digest", "0badf00d0", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Put(ctx, "rewritten", data, nil); err != nil {
				t.Fatal(err)
			}
			oi, err := e.obs.GetInfo(ctx, "rewritten")
			if err != nil {
				t.Fatal(err)
			}
			oi.Headers.Set("Jetfabric-Crc32", tc.crc)
			if !tc.digest {
				oi.Digest = "SHA-256=" + b64(wrong[:])
			}
			publishMeta(t, e, oi)
			got, _, err := s.Get(ctx, "rewritten")
			switch {
			case tc.ok && (err != nil || !bytes.Equal(got, data)):
				t.Errorf("Get: %v, want the data", err)
			case !tc.ok && !errors.Is(err, objectstore.ErrDigest):
				t.Errorf("Get: %v, want ErrDigest", err)
			}
			dst := make([]byte, len(data))
			if _, err := s.Follow(ctx, "rewritten", objectstore.NewNUID(), dst); tc.ok != (err == nil) {
				t.Errorf("Follow: %v, want success %v", err, tc.ok)
			}
			if _, err := e.obs.GetBytes(ctx, "rewritten"); tc.digest != (err == nil) {
				t.Errorf("nats.go get: %v, want success %v (it checks the digest)", err, tc.digest)
			}
		})
	}
}

// TestFollowGivenDigest: a writer that gave its digest writes no CRC-32,
// and a reader following it checks the digest once the meta comes: the
// data when it is right, ErrDigest when it is not.
func TestFollowGivenDigest(t *testing.T) {
	e := newEnv(t)
	s := e.store(t, objectstore.WithChunkSize(64<<10), objectstore.WithRetries(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := randomBytes(2<<20+9, 12)
	for _, right := range []bool{true, false} {
		sum := sha256.Sum256(data)
		if !right {
			sum[0] ^= 1
		}
		name, nuid := fmt.Sprintf("given-%v", right), objectstore.NewNUID()
		dst := make([]byte, len(data))
		done := make(chan error, 1)
		go func() {
			_, err := s.Follow(ctx, name, nuid, dst)
			done <- err
		}()
		e.waitSubscribed(t, "$O."+bucket+".C."+nuid)
		if _, err := s.Put(ctx, name, data, nil, objectstore.WithNUID(nuid), objectstore.WithSHA256(sum)); err != nil {
			t.Fatal(err)
		}
		err := <-done
		switch {
		case right && (err != nil || !bytes.Equal(dst, data)):
			t.Errorf("right digest: %v, want the data", err)
		case !right && !errors.Is(err, objectstore.ErrDigest):
			t.Errorf("wrong digest: %v, want ErrDigest", err)
		}
	}
}
