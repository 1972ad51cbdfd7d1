//go:build cgo && linux

package cuda

import (
	"bytes"
	"errors"
	"testing"

	"github.com/jetfabric/jetfabric/kernels"
)

// TestHostBuffer: uploads from a lent buffer (whole, or a part at an
// offset) and downloads into one give the same bytes as through the
// staging buffers; a buffer given back is lent again, its upload done
// first, and what is kept stays under the cache's bound; a size under the
// minimum is refused; a buffer given back twice is given back once.
func TestHostBuffer(t *testing.T) {
	b := newBackend(t)
	if _, _, err := b.HostBuffer(hostMinBytes - 1); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("a host buffer under the minimum: %v, want ErrShape", err)
	}
	n := 3*stageBytes + 4321
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*31 + i>>11)
	}
	dev, err := b.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free(dev)

	h, give, err := b.HostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	copy(h, src)
	if err := b.Upload(dev, h); err != nil {
		t.Fatal(err)
	}
	give() // the upload may still read it: the next lend waits for it
	give()
	h2, give2, err := b.HostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	if &h2[0] != &h[0] {
		t.Error("the buffer given back was not lent again")
	}
	clear(h2)
	if err := b.Download(h2, dev); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h2, src) {
		t.Fatal("an upload from a lent buffer, downloaded into one, changed the data")
	}
	plain := make([]byte, n)
	if err := b.Download(plain, dev); err != nil || !bytes.Equal(plain, src) {
		t.Fatalf("the same through staging: %v, equal %v", err, bytes.Equal(plain, src))
	}
	// A part of a lent buffer, at an odd offset.
	part := h2[777 : 777+hostMinBytes]
	for i := range part {
		part[i] = byte(255 - i%251)
	}
	if err := b.Upload(dev, part); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(part))
	if err := b.Download(got, dev); err != nil || !bytes.Equal(got, part) {
		t.Fatalf("an upload from a part of a lent buffer: %v, equal %v", err, bytes.Equal(got, part))
	}
	give2()

	// Buffers given back beyond the cache's bound are freed.
	var gives []func()
	for range hostCacheBytes/(64<<20) + 2 {
		_, g, err := b.HostBuffer(64 << 20)
		if err != nil {
			t.Fatal(err)
		}
		gives = append(gives, g)
	}
	for _, g := range gives {
		g()
	}
	var kept int
	if err := b.do(func() error { kept = b.hosts.kept; return nil }); err != nil {
		t.Fatal(err)
	}
	if kept > hostCacheBytes || kept == 0 {
		t.Errorf("%d bytes kept, want some, at most %d", kept, hostCacheBytes)
	}
	// Trim frees what is kept, not what is lent.
	lent, giveLent, err := b.HostBuffer(hostMinBytes)
	if err != nil {
		t.Fatal(err)
	}
	lent[0] = 7
	b.Trim()
	var bufs int
	if err := b.do(func() error { kept, bufs = b.hosts.kept, len(b.hosts.all); return nil }); err != nil {
		t.Fatal(err)
	}
	if kept != 0 || bufs != 1 {
		t.Errorf("after Trim: %d bytes kept, %d buffers; want 0 and the one lent", kept, bufs)
	}
	if err := b.Upload(dev, lent); err != nil {
		t.Fatal(err)
	}
	giveLent()
}
