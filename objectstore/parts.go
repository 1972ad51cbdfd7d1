package objectstore

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// partName names part i of a parted object. The token is new on every Put,
// so a replaced object's parts are never overwritten while a reader may
// still be reading them.
func partName(name string, i int, token string) string {
	return fmt.Sprintf("%s.part%d.%s", name, i, token)
}

// putParts writes data as parts moved in parallel, then the manifest under
// name. The window is shared among the parts, so as many bytes are in
// flight as for one object.
func (s *Store) putParts(ctx context.Context, name string, data []byte, meta map[string]string) (Info, error) {
	chunk := int64(s.opts.chunkSize)
	size := int64(len(data))
	per := (size + int64(s.opts.parts) - 1) / int64(s.opts.parts)
	per = (per + chunk - 1) / chunk * chunk
	k := int((size + per - 1) / per)
	token := newNUID()[:12]
	window := max(1, s.opts.window/k)

	dig := startDigest(data, hashBlock, false, nil)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	man := manifest{Version: manifestVersion, Size: size, Parts: make([]partInfo, k)}
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		a, b := int64(i)*per, min(int64(i+1)*per, size)
		man.Parts[i] = partInfo{Name: partName(name, i, token), Size: b - a}
		wg.Go(func() {
			oi, err := s.putObject(pctx, man.Parts[i].Name, data[a:b], nil, nil, window, putConfig{})
			if err != nil {
				errs[i] = err
				cancel()
				return
			}
			man.Parts[i].Digest = oi.Digest
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		dig.stop()
		s.dropParts(ctx, man.Parts)
		return Info{}, fmt.Errorf("objectstore: %s: put %q in %d parts: %w", s.bucket, name, k, err)
	}
	sum, _ := dig.wait()
	man.SHA256 = hex.EncodeToString(sum[:])
	content, err := json.Marshal(man)
	if err != nil {
		s.dropParts(ctx, man.Parts)
		return Info{}, fmt.Errorf("objectstore: %s: put %q: encode manifest: %w", s.bucket, name, err)
	}
	hdr := nats.Header{}
	hdr.Set(hdrParts, strconv.Itoa(k))
	hdr.Set(hdrSize, strconv.FormatInt(size, 10))
	hdr.Set(hdrSHA256, man.SHA256)
	oi, err := s.putObject(ctx, name, content, meta, hdr, s.opts.window, putConfig{})
	if err != nil {
		s.dropParts(ctx, man.Parts)
		return Info{}, err
	}
	return info(oi), nil
}

// firstError is the first error that is not a cancellation caused by
// another part failing.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return first
}

// dropParts deletes the parts that were written, best effort.
func (s *Store) dropParts(ctx context.Context, parts []partInfo) {
	ctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	for _, p := range parts {
		if p.Digest != "" {
			_ = s.Delete(ctx, p.Name)
		}
	}
}

// readParts reads a parted object: the manifest, then every part in
// parallel into its place in dst. Each part is checked against its own
// meta and the manifest (size and SHA-256); the read-ahead is shared.
func (s *Store) readParts(ctx context.Context, oi *jetstream.ObjectInfo, dst []byte) error {
	man, err := s.readManifest(ctx, oi)
	if err != nil {
		return err
	}
	var total int64
	for _, p := range man.Parts {
		if p.Size < 0 {
			return fmt.Errorf("%w: %q in bucket %s: part %q has size %d", ErrDigest, oi.Name, s.bucket, p.Name, p.Size)
		}
		total += p.Size
	}
	if total != man.Size || total != int64(len(dst)) || len(man.Parts) == 0 {
		return fmt.Errorf("%w: %q in bucket %s: %d parts of %d bytes in all, manifest says %d, destination %d", ErrDigest, oi.Name, s.bucket, len(man.Parts), total, man.Size, len(dst))
	}
	readAhead := max(64<<10, s.opts.readAhead/len(man.Parts))
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(man.Parts))
	var wg sync.WaitGroup
	var off int64
	for i, p := range man.Parts {
		part := dst[off : off+p.Size]
		off += p.Size
		wg.Go(func() {
			err := s.readPart(pctx, p, part, readAhead)
			if err != nil {
				errs[i] = err
				cancel()
			}
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return fmt.Errorf("objectstore: %s: get %q: %w", s.bucket, oi.Name, err)
	}
	return nil
}

func (s *Store) readPart(ctx context.Context, p partInfo, dst []byte, readAhead int) error {
	poi, _, err := s.readMeta(ctx, p.Name)
	if err != nil {
		return fmt.Errorf("part %q: %w", p.Name, err)
	}
	if poi.Deleted || poi.Digest != p.Digest || int64(poi.Size) != p.Size {
		return fmt.Errorf("%w: part %q is %d bytes with digest %q (deleted %v), manifest says %d bytes with %q", ErrDigest, p.Name, poi.Size, poi.Digest, poi.Deleted, p.Size, p.Digest)
	}
	return s.readChunks(ctx, poi, dst, readAhead)
}
