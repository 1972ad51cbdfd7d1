package client_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// workers starts a broker and n workers, each serving one CPU device
// (cpu-0 ... cpu-n-1) over its own connection: the devices' data moves
// between workers only through the broker.
func workers(b testing.TB, n int, edit ...func(*broker.Config)) (*broker.Broker, *client.Client) {
	b.Helper()
	return workersWith(b, n, nil, edit...)
}

// workersWith is workers with each worker's configuration changed by wedit
// (nil: none).
func workersWith(b testing.TB, n int, wedit func(*worker.Config), edit ...func(*broker.Config)) (*broker.Broker, *client.Client) {
	b.Helper()
	br := brokertest.Run(b, append([]func(*broker.Config){func(c *broker.Config) { c.Provision.XferMaxBytes = 20 << 30 }}, edit...)...)
	for i, d := range workertest.CPUs(n) {
		d.Name = fmt.Sprintf("cpu-%d", i)
		workertest.Run(b, br, []worker.Device{d}, func(c *worker.Config) {
			c.ID = fmt.Sprintf("w%d", i)
			c.CheckpointInterval = 0
			c.Logf = nil
			if wedit != nil {
				wedit(c)
			}
		})
	}
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return br, c
}

func brokerBytes(s *server.Server) (in, out int64) {
	v, _ := s.Varz(nil)
	return v.InBytes, v.OutBytes
}

var sizes = []struct {
	name string
	n    int
}{{"1MiB", 1 << 20}, {"64MiB", 64 << 20}, {"256MiB", 256 << 20}, {"1GiB", 1 << 30}}

// BenchmarkTransfer moves a tensor between two workers: from the expose
// being issued to the import complete. Beside it, in the same run, the raw
// NATS paths: core pub/sub of 1 MiB messages, and nats.go's object store
// Put then Get of the same bytes. The fabric runs twice, with FABRIC_XFER
// on file and on memory storage.
func BenchmarkTransfer(b *testing.B) {
	br, c := workers(b, 2)
	_, cmem := workers(b, 2, func(c *broker.Config) { c.Provision.XferStorage = jetstream.MemoryStorage })
	ctx := context.Background()
	for _, sz := range sizes {
		b.Run("fabric/"+sz.name, func(b *testing.B) { benchTransfer(b, c, sz.n) })
		b.Run("fabric-memory/"+sz.name, func(b *testing.B) { benchTransfer(b, cmem, sz.n) })
		b.Run("nats-object-put-get/"+sz.name, func(b *testing.B) {
			nc, _ := nats.Connect(br.ClientURL())
			defer nc.Close()
			js, _ := jetstream.New(nc)
			os, err := js.ObjectStore(ctx, "FABRIC_XFER")
			if err != nil {
				b.Fatal(err)
			}
			data := bytes.Repeat([]byte{7}, sz.n)
			b.SetBytes(int64(sz.n))
			i := 0
			for b.Loop() {
				name := fmt.Sprintf("raw-%s-%d", sz.name, i)
				i++
				if _, err := os.PutBytes(ctx, name, data); err != nil {
					b.Fatal(err)
				}
				if _, err := os.GetBytes(ctx, name); err != nil {
					b.Fatal(err)
				}
				_ = os.Delete(ctx, name)
			}
		})
	}
	b.Run("nats-core-pubsub-1MiB-msgs", func(b *testing.B) {
		pub, _ := nats.Connect(br.ClientURL())
		defer pub.Close()
		sub, _ := nats.Connect(br.ClientURL())
		defer sub.Close()
		const msgs = 256
		got := make(chan struct{}, 1)
		n := 0
		s, _ := sub.Subscribe("bench.raw", func(*nats.Msg) {
			n++
			if n%msgs == 0 {
				got <- struct{}{}
			}
		})
		s.SetPendingLimits(-1, -1)
		sub.Flush()
		data := make([]byte, 1<<20)
		b.SetBytes(msgs << 20)
		for b.Loop() {
			for range msgs {
				if err := pub.Publish("bench.raw", data); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-got:
			case <-time.After(time.Minute):
				b.Fatal("pub/sub stalled")
			}
		}
	})
}

// benchTransfer moves a tensor of n bytes from cpu-0 to cpu-1, as often
// as the benchmark asks.
func benchTransfer(b *testing.B, c *client.Client, n int) {
	ctx := context.Background()
	src, dst := open(b, c, "cpu-0"), open(b, c, "cpu-1")
	x := src.Full([]int{n / 4}, 1.5)
	if err := src.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(n))
	for b.Loop() {
		y := x.To(dst)
		if err := dst.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		y.Free()
	}
}

// BenchmarkAllReduce reduces 64 MiB of f32 over 2 and 4 devices, with the
// reduce-scatter + all-gather algorithm and with the naive one, and reports
// the bytes through the broker (its in plus out) per all_reduce.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		br, c := workers(b, n)
		ctx := context.Background()
		var xs []*client.Tensor
		var ss []*client.Session
		for r := range n {
			s := open(b, c, fmt.Sprintf("cpu-%d", r))
			ss = append(ss, s)
			xs = append(xs, s.Full([]int{16 << 20}, float64(r)))
		}
		for _, s := range ss {
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
		for _, algo := range []string{"scatter", "naive"} {
			b.Run(fmt.Sprintf("%d-devices/%s", n, algo), func(b *testing.B) {
				var opts []client.CollectiveOption
				if algo == "naive" {
					opts = append(opts, client.Naive())
				}
				in0, out0 := brokerBytes(br.Server())
				rounds := 0
				for b.Loop() {
					out, err := client.AllReduce("sum", xs, opts...)
					if err != nil {
						b.Fatal(err)
					}
					for _, s := range ss {
						if err := s.Sync(ctx); err != nil {
							b.Fatal(err)
						}
					}
					for _, o := range out {
						o.Free()
					}
					rounds++
				}
				in1, out1 := brokerBytes(br.Server())
				b.ReportMetric(float64(in1-in0+out1-out0)/float64(rounds)/(1<<20), "broker-MiB/op")
				b.ReportMetric(float64(64*n), "tensor-MiB-total")
			})
		}
	}
}

// BenchmarkGradExchange sums the gradients of a model over data-parallel
// devices, as training does each step: the 784-512-512-10 MLP over two
// devices and PyTorch's MNIST CNN over four. Layouts: one all_reduce a
// parameter ("per-param"); what jetfabric train sends ("train": one for
// each parameter over 64 KiB, one for the rest concatenated); one of all
// of them concatenated ("concatenated"); and one of 4 B ("scalar"), the
// fixed cost. The transfer bucket on memory storage and on file storage;
// the worker's default algorithm, reduce-scatter then all-gather, and the
// one-round direct one. On the 16-core host, pinned like the training
// runs:
//
//	go test -c ./client && GOMAXPROCS=16 ./client.test -test.run x \
//	    -test.bench 'GradExchange/Memory/cnn-4' -test.benchtime 30x
func BenchmarkGradExchange(b *testing.B) {
	models := []struct {
		name  string
		ranks int
		sizes []int // elements of each parameter
	}{
		{"mlp-2", 2, []int{784 * 512, 512, 512 * 512, 512, 512 * 10, 10}},
		{"cnn-4", 4, []int{32 * 9, 32, 64 * 32 * 9, 64, 128 * 9216, 128, 10 * 128, 10}},
	}
	for _, storage := range []jetstream.StorageType{jetstream.MemoryStorage, jetstream.FileStorage} {
		_, c := workers(b, 4, func(c *broker.Config) { c.Provision.XferStorage = storage })
		ctx := context.Background()
		var all []*client.Session
		for r := range 4 {
			all = append(all, open(b, c, fmt.Sprintf("cpu-%d", r)))
		}
		for _, model := range models {
			ss := all[:model.ranks]
			total, train, small := 0, []int(nil), 0
			for _, n := range model.sizes {
				total += n
				if 4*n <= 64<<10 {
					small += n
				} else {
					train = append(train, n)
				}
			}
			if small > 0 {
				train = append(train, small)
			}
			layouts := map[string][]int{"per-param": model.sizes, "train": train, "concatenated": {total}, "scalar": {1}}
			for _, name := range []string{"scalar", "per-param", "train", "concatenated"} {
				var xs [][]*client.Tensor // [param][rank]
				for _, n := range layouts[name] {
					var ranks []*client.Tensor
					for r, s := range ss {
						ranks = append(ranks, s.Full([]int{n}, float64(r+1)))
					}
					xs = append(xs, ranks)
				}
				for _, algo := range []string{"default", "scatter", "direct"} {
					var opts []client.CollectiveOption
					switch algo {
					case "scatter":
						opts = append(opts, client.Scatter())
					case "direct":
						opts = append(opts, client.Direct())
					}
					b.Run(fmt.Sprintf("%s/%s/%s/%s", storage, model.name, name, algo), func(b *testing.B) {
						for b.Loop() {
							var outs []*client.Tensor
							for _, x := range xs {
								out, err := client.AllReduce("sum", x, opts...)
								if err != nil {
									b.Fatal(err)
								}
								outs = append(outs, out...)
							}
							for _, s := range ss {
								if err := s.Sync(ctx); err != nil {
									b.Fatal(err)
								}
							}
							for _, o := range outs {
								o.Free()
							}
						}
						b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/exchange")
					})
				}
			}
		}
	}
}

// BenchmarkCollectiveOverlap is a data-parallel step's tail on four
// devices, one worker each: an all_reduce of a 4.8 MB gradient, then
// compute that does not read it (a chain of 32 matmuls of 256x256), then
// an op that reads it; the sessions synced each step. Two fabrics run the
// same steps: on "in-loop" collectives run to their end before the
// device's next op (Config.SyncCollectives), on "beside-loop" beside the
// device loop (the default on the CPU), so the matmuls overlap the
// exchange. Each iteration runs one step on each fabric, in alternate
// order, so that a load that comes and goes on the host weighs on both
// alike; each fabric's time a step is reported. The all_reduce alone and
// the compute alone are timed too, and "per-param": one all_reduce for each
// parameter of the MNIST CNN (8, 4.8 MB in all, as BenchmarkGradExchange's
// cnn-4 per-param), which beside the loop run at once.
//
//	go test ./client -run x -bench CollectiveOverlap -benchtime 20x
func BenchmarkCollectiveOverlap(b *testing.B) {
	const ranks, grad, dim, chain = 4, 1_200_000, 256, 32
	modes := []string{"in-loop", "beside-loop"}
	params := []int{32 * 9, 32, 64 * 32 * 9, 64, 128 * 9216, 128, 10 * 128, 10}
	type fabric struct {
		ss         []*client.Session
		gs, xs, ws []*client.Tensor
		ps         [][]*client.Tensor // [param][rank]
	}
	fabrics := make([]fabric, len(modes))
	ctx := context.Background()
	for k, mode := range modes {
		_, c := workersWith(b, ranks, func(c *worker.Config) { c.SyncCollectives = mode == "in-loop" },
			func(c *broker.Config) { c.Provision.XferStorage = jetstream.MemoryStorage })
		f := &fabrics[k]
		for r := range ranks {
			s := open(b, c, fmt.Sprintf("cpu-%d", r))
			s.Seed(uint64(r))
			f.ss = append(f.ss, s)
			f.gs = append(f.gs, s.Full([]int{grad}, float64(r+1)))
			f.xs = append(f.xs, s.Uniform([]int{dim, dim}, -1, 1))
			f.ws = append(f.ws, s.Uniform([]int{dim, dim}, -0.1, 0.1))
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
		for _, n := range params {
			var ranks []*client.Tensor
			for r, s := range f.ss {
				ranks = append(ranks, s.Full([]int{n}, float64(r+1)))
			}
			f.ps = append(f.ps, ranks)
		}
	}
	step := func(b *testing.B, f *fabric, work string) {
		var out []*client.Tensor
		if work == "per-param" {
			var outs []*client.Tensor
			for _, p := range f.ps {
				o, err := client.AllReduce("sum", p)
				if err != nil {
					b.Fatal(err)
				}
				outs = append(outs, o...)
			}
			for _, s := range f.ss {
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
			for _, o := range outs {
				o.Free()
			}
			return
		}
		if work != "compute" {
			var err error
			if out, err = client.AllReduce("sum", f.gs); err != nil {
				b.Fatal(err)
			}
		}
		for r, s := range f.ss {
			if work != "all_reduce" {
				h := f.xs[r]
				for range chain {
					next := h.Matmul(f.ws[r])
					if h != f.xs[r] {
						h.Free()
					}
					h = next
				}
				h.Free()
			}
			if out != nil {
				out[r].Sum().Free() // reads the all_reduce: waits for it
				out[r].Free()
			}
			s.Flush()
		}
		for _, s := range f.ss {
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, work := range []string{"all_reduce", "compute", "both", "per-param"} {
		b.Run(work, func(b *testing.B) {
			took := make([]time.Duration, len(modes))
			i := 0
			for b.Loop() {
				for j := range modes {
					k := (i + j) % len(modes)
					t0 := time.Now()
					step(b, &fabrics[k], work)
					took[k] += time.Since(t0)
				}
				i++
			}
			for k, mode := range modes {
				b.ReportMetric(float64(took[k].Microseconds())/1000/float64(i), mode+"-ms/step")
			}
			b.ReportMetric(float64(took[0])/float64(took[1]), "in/beside")
		})
	}
}
