package objectstore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/objectstore"
)

// The brokers here use file storage (brokertest's default), over TCP on
// loopback. Put replaces one object per iteration, for us and for nats.go
// alike (each purges the replaced chunks). nats.go runs with 1 MiB chunks
// (the reference configuration) and with our default chunk size.

func BenchmarkObjectStore(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	ours := e.store(b)
	natsgo := []struct {
		name  string
		chunk uint32
	}{
		{"natsgo-1MiB", 1 << 20},
		{fmt.Sprintf("natsgo-%dKiB", objectstore.DefaultChunkSize>>10), objectstore.DefaultChunkSize},
	}
	for _, size := range []int{1 << 20, 64 << 20, 256 << 20} {
		data := randomBytes(size, 1)
		dst := make([]byte, size)
		prefix := fmt.Sprintf("%dMiB/", size>>20)
		b.Run(prefix+"put/ours", func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := ours.Put(ctx, "bench-ours", data, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, n := range natsgo {
			b.Run(prefix+"put/"+n.name, func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					meta := jetstream.ObjectMeta{Name: "bench-" + n.name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: n.chunk}}
					if _, err := e.obs.Put(ctx, meta, bytes.NewReader(data)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(prefix+"get/ours", func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, _, err := ours.Get(ctx, "bench-ours"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(prefix+"get/ours-into", func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				if _, err := ours.GetInto(ctx, "bench-ours", dst); err != nil {
					b.Fatal(err)
				}
			}
		})
		for _, n := range natsgo {
			b.Run(prefix+"get/"+n.name, func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, err := e.obs.GetBytes(ctx, "bench-"+n.name); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSmall is the latency of a small tensor's round trip.
func BenchmarkSmall(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	ours := e.store(b)
	data := randomBytes(4<<10, 1)
	b.Run("4KiB/ours/put", func(b *testing.B) {
		for b.Loop() {
			if _, err := ours.Put(ctx, "small-ours", data, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("4KiB/natsgo/put", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.obs.PutBytes(ctx, "small-natsgo", data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("4KiB/ours/get", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := ours.Get(ctx, "small-ours"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("4KiB/natsgo/get", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.obs.GetBytes(ctx, "small-natsgo"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkChunkSize is how the default chunk size was chosen.
func BenchmarkChunkSize(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	for _, size := range []int{64 << 20, 256 << 20} {
		data := randomBytes(size, 1)
		for _, chunk := range []int{128 << 10, 256 << 10, 1 << 20, 4 << 20} {
			// The same bytes in flight for every chunk size: 16 MiB.
			s := e.store(b, objectstore.WithChunkSize(chunk), objectstore.WithWindow(max(1, 16<<20/chunk)))
			name := fmt.Sprintf("%dMiB/chunk=%dKiB", size>>20, chunk>>10)
			b.Run(name+"/put", func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, err := s.Put(ctx, "chunks", data, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(name+"/get", func(b *testing.B) {
				b.SetBytes(int64(size))
				for b.Loop() {
					if _, _, err := s.Get(ctx, "chunks"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkWindow is how the default window was chosen.
func BenchmarkWindow(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	const size = 256 << 20
	data := randomBytes(size, 1)
	for _, w := range []int{8, 16, 32, 64, 128, 256} {
		s := e.store(b, objectstore.WithWindow(w))
		b.Run(fmt.Sprintf("256MiB/window=%d/put", w), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := s.Put(ctx, "window", data, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParts compares one object with parts moved in parallel.
func BenchmarkParts(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	const size = 256 << 20
	data := randomBytes(size, 1)
	for _, parts := range []int{1, 2, 4} {
		s := e.store(b, objectstore.WithParts(parts), objectstore.WithPartThreshold(64<<20))
		name := fmt.Sprintf("256MiB/parts=%d", parts)
		b.Run(name+"/put", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := s.Put(ctx, "parts", data, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/get", func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, _, err := s.Get(ctx, "parts"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkReadAhead is how the default read-ahead was chosen.
func BenchmarkReadAhead(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	const size = 256 << 20
	data := randomBytes(size, 1)
	dst := make([]byte, size)
	for _, chunk := range []int{256 << 10, 1 << 20} {
		w := e.store(b, objectstore.WithChunkSize(chunk))
		if _, err := w.Put(ctx, "readahead", data, nil); err != nil {
			b.Fatal(err)
		}
		for _, ra := range []int{1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20} {
			s := e.store(b, objectstore.WithReadAhead(ra))
			b.Run(fmt.Sprintf("256MiB/chunk=%dKiB/readahead=%dMiB/getinto", chunk>>10, ra>>20), func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					if _, err := s.GetInto(ctx, "readahead", dst); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPipelined moves an object from a writer to a reader on another
// connection: the reader follows the chunks as they are stored (Follow),
// against a Put then a GetInto, in the same run.
func BenchmarkPipelined(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	w := e.store(b)
	r := e.second(b).store(b)
	for _, size := range []int{64 << 20, 256 << 20} {
		data := randomBytes(size, 1)
		dst := make([]byte, size)
		prefix := fmt.Sprintf("%dMiB/", size>>20)
		i := 0
		b.Run(prefix+"put-then-get", func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				i++
				name := fmt.Sprintf("seq-%d", i)
				if _, err := w.Put(ctx, name, data, nil); err != nil {
					b.Fatal(err)
				}
				if _, err := r.GetInto(ctx, name, dst); err != nil {
					b.Fatal(err)
				}
				_ = w.Delete(ctx, name)
			}
		})
		b.Run(prefix+"follow", func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				i++
				followOnce(b, w, r, fmt.Sprintf("pipe-%d", i), data, dst)
			}
		})
	}
}

// BenchmarkFollowAhead is how the default follow-ahead was chosen: a
// writer and a reader that follows it, on two connections, for pull
// windows from 8 to 32 MiB.
func BenchmarkFollowAhead(b *testing.B) {
	e := newEnv(b)
	const size = 256 << 20
	data := randomBytes(size, 1)
	dst := make([]byte, size)
	w := e.store(b)
	i := 0
	for _, ahead := range []int{8 << 20, 16 << 20, 32 << 20} {
		r := e.second(b).store(b, objectstore.WithFollowAhead(ahead))
		b.Run(fmt.Sprintf("256MiB/followahead=%dMiB", ahead>>20), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				i++
				followOnce(b, w, r, fmt.Sprintf("ahead-%d", i), data, dst)
			}
		})
	}
}

// followOnce writes data as name with w while r follows it into dst, then
// deletes it.
func followOnce(b *testing.B, w, r *objectstore.Store, name string, data, dst []byte) {
	ctx := context.Background()
	nuid := objectstore.NewNUID()
	done := make(chan error, 1)
	go func() {
		_, err := r.Follow(ctx, name, nuid, dst)
		done <- err
	}()
	if _, err := w.Put(ctx, name, data, nil, objectstore.WithNUID(nuid)); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	_ = w.Delete(ctx, name)
}
