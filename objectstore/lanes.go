package objectstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxPieces is the most pieces an object is split into.
const MaxPieces = 64

// MinPiece is the smallest piece Lanes.Pieces cuts: below it a piece's
// fixed costs (its meta, its subscription) outweigh the parallel move.
const MinPiece = 8 << 20

// PieceRange returns the bytes [lo, hi) of piece i of k of an object of n
// bytes: lo = i*n/k and hi = (i+1)*n/k, so the pieces differ in size by
// at most a byte and none is empty when n >= k.
func PieceRange(n, k, i int) (lo, hi int) {
	return i * n / k, (i + 1) * n / k
}

// PieceName names piece i of the object name.
func PieceName(name string, i int) string { return name + "." + strconv.Itoa(i) }

// PieceNUID is the chunk subject token of piece i of an object whose
// pieces are written under nuid.
func PieceNUID(nuid string, i int) string { return nuid + "-" + strconv.Itoa(i) }

// CheckPieces says whether an object of n bytes can be read or written as
// k pieces under nuid: 2 to MaxPieces pieces of at least a byte each, and
// every piece's chunk subject token valid.
func CheckPieces(n, k int, nuid string) error {
	switch {
	case k < 2 || k > MaxPieces:
		return fmt.Errorf("%w: %d pieces, want 2 to %d", ErrInvalidOption, k, MaxPieces)
	case n < k:
		return fmt.Errorf("%w: %d pieces of %d bytes", ErrInvalidOption, k, n)
	}
	return ValidNUID(PieceNUID(nuid, k-1))
}

// Lanes are stores of one bucket, each on a connection of its own. An
// object written as pieces, each an ordinary object on a lane of its own,
// moves faster than one object: the broker reads each connection on one
// goroutine, and each piece is hashed on its own. Piece i of k of an
// object name holds PieceRange(n, k, i) of its bytes, is named
// PieceName(name, i) and written on the chunk subject PieceNUID(nuid, i),
// so its reader can follow it while it is written. Lanes must hold at
// least one store.
type Lanes []*Store

// NewLanes opens bucket on each JetStream context, one a lane (see New);
// js must hold at least one.
func NewLanes(js []jetstream.JetStream, bucket string, opts ...Option) (Lanes, error) {
	if len(js) == 0 {
		return nil, fmt.Errorf("%w: no lanes for bucket %s", ErrInvalidOption, bucket)
	}
	lanes := make(Lanes, len(js))
	for i, j := range js {
		s, err := New(j, bucket, opts...)
		if err != nil {
			return nil, err
		}
		lanes[i] = s
	}
	return lanes, nil
}

// Pieces returns how many pieces an object of n bytes is best moved in:
// at most one a lane and limit, none smaller than MinPiece. 1 (also for a
// limit under 2) means one ordinary object. A bucket kept on file is
// moved whole: on the 16-core hosts measured, the disk was the limit and
// pieces written at once were slower than one object (BENCHMARKS.md).
func (l Lanes) Pieces(n, limit int) int {
	if len(l) < 2 || !l[0].InMemory() {
		return 1
	}
	return max(1, min(len(l), n/MinPiece, limit, MaxPieces))
}

// lane is the store that moves piece i.
func (l Lanes) lane(i int) *Store { return l[i%len(l)] }

// Each runs f for each of k pieces on its lane, in parallel, and returns
// the first error; the first error cancels the others' context.
func (l Lanes) Each(ctx context.Context, k int, f func(ctx context.Context, s *Store, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for i := range k {
		wg.Go(func() {
			if err := f(ctx, l.lane(i), i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// Put writes data as k pieces of name, on the chunk subjects of nuid, each
// with meta. A piece that fails is aborted with the error as the reason,
// so that its reader stops at once; the other pieces too.
func (l Lanes) Put(ctx context.Context, name, nuid string, k int, data []byte, meta map[string]string) error {
	if err := CheckPieces(len(data), k, nuid); err != nil {
		return err
	}
	err := l.Each(ctx, k, func(ctx context.Context, s *Store, i int) error {
		lo, hi := PieceRange(len(data), k, i)
		_, err := s.Put(ctx, PieceName(name, i), data[lo:hi], meta, WithNUID(PieceNUID(nuid, i)))
		return err
	})
	if err != nil {
		l.Abort(context.WithoutCancel(ctx), name, nuid, k, err.Error())
		return fmt.Errorf("objectstore: put %q in %d pieces: %w", name, k, err)
	}
	return nil
}

// Follow reads the k pieces of name into dst while they are written (see
// Store.Follow), each on its lane; len(dst) is the whole object's size.
func (l Lanes) Follow(ctx context.Context, name, nuid string, k int, dst []byte) error {
	if err := CheckPieces(len(dst), k, nuid); err != nil {
		return err
	}
	return l.Each(ctx, k, func(ctx context.Context, s *Store, i int) error {
		lo, hi := PieceRange(len(dst), k, i)
		_, err := s.Follow(ctx, PieceName(name, i), PieceNUID(nuid, i), dst[lo:hi])
		return err
	})
}

// Abort marks each of the k pieces of name deleted with reason, so that
// their readers stop (see Store.Abort). Best effort.
func (l Lanes) Abort(ctx context.Context, name, nuid string, k int, reason string) {
	_ = l.Each(ctx, k, func(ctx context.Context, s *Store, i int) error {
		_ = s.Abort(ctx, PieceName(name, i), PieceNUID(nuid, i), reason)
		return nil
	})
}

// Discard deletes the k pieces of name, written under nuid, without
// reading their metas first (see Store.Discard): for the reader that
// followed them. It tries every piece and returns their errors joined.
func (l Lanes) Discard(ctx context.Context, name, nuid string, k int) error {
	errs := make([]error, k)
	_ = l.Each(ctx, k, func(ctx context.Context, s *Store, i int) error {
		errs[i] = s.Discard(ctx, PieceName(name, i), PieceNUID(nuid, i))
		return nil
	})
	return errors.Join(errs...)
}
