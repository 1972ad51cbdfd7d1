package worker_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/objectstore"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// metricValue reads one sample of the worker's metrics.
func metricValue(b testing.TB, w *worker.Worker, series string) float64 {
	var buf bytes.Buffer
	if err := w.WriteMetrics(&buf); err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	b.Fatalf("no series %s", series)
	return 0
}

// latencies measures tiny op + read round trips on s until stop, each
// under a read lock of pause.
func latencies(ctx context.Context, s *client.Session, pause *sync.RWMutex, stop <-chan struct{}) ([]time.Duration, error) {
	var l []time.Duration
	for i := 0; ; i++ {
		select {
		case <-stop:
			return l, nil
		default:
		}
		pause.RLock()
		t0 := time.Now()
		_, err := s.Full([]int{4}, float64(i)).Float32s(ctx)
		d := time.Since(t0)
		pause.RUnlock()
		if err != nil {
			return l, err
		}
		l = append(l, d)
	}
}

func quantile(l []time.Duration, q float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	l = slices.Clone(l)
	slices.Sort(l)
	return l[min(len(l)-1, int(q*float64(len(l))))]
}

// benchDevice opens the device of one worker of a checkpoint benchmark:
// each worker gets a backend of its own, since a worker closes its
// backends when it stops.
type benchDevice struct {
	kind string
	open func(testing.TB) worker.Device
}

// benchDevices are the devices the checkpoint benchmarks run on, one
// sub-benchmark each: a CPU device, and a GPU where there is one
// (benchGPU, set by a cgo build).
func benchDevices(b *testing.B) []benchDevice {
	devs := []benchDevice{{"cpu", func(testing.TB) worker.Device { return workertest.CPUs(1)[0] }}}
	if benchGPU != nil {
		if open, ok := benchGPU(b); ok {
			devs = append(devs, benchDevice{"gpu", open})
		}
	}
	return devs
}

// benchGPU returns the opener of GPU 0 for the benchmark b, false where
// there is none.
var benchGPU func(b *testing.B) (func(testing.TB) worker.Device, bool)

// BenchmarkCheckpoint measures what checkpoints cost the sessions of a
// device: the p99 of tiny op + read round trips of one session while
// another session's tensors (tensors of 32 MiB, all new at every
// checkpoint) are checkpointed back to back, beside the p99 with no
// checkpoint; and the checkpoint write throughput beside the object
// store's Put throughput of as many bytes to the same bucket, the two
// taken in turns. One iteration is one checkpoint and one round of Puts
// (with the reads paused). On a CPU device and, where there is one, a GPU.
func BenchmarkCheckpoint(b *testing.B) {
	for _, d := range benchDevices(b) {
		b.Run(d.kind, func(b *testing.B) { benchCheckpoint(b, d.open(b)) })
	}
}

func benchCheckpoint(b *testing.B, dev worker.Device) {
	const tensors, elems = 8, 8 << 20 // f32: 8 x 32 MiB
	br := brokertest.Run(b)
	w := workertest.Run(b, br, []worker.Device{dev}, func(c *worker.Config) {
		c.CheckpointInterval = 0
		c.Logf = nil
	})
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	series := func(name string) string { return name + `{device="` + dev.Name + `"}` }
	big, err := c.Open(ctx, dev.Name)
	if err != nil {
		b.Fatal(err)
	}
	small, err := c.Open(ctx, dev.Name)
	if err != nil {
		b.Fatal(err)
	}
	held := make([]*client.Tensor, tensors)
	for i := range held {
		held[i] = big.Uniform([]int{elems}, -1, 1)
	}
	if err := big.Sync(ctx); err != nil {
		b.Fatal(err)
	}

	// The object store's Put, to the same bucket.
	nc, err := nats.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	store, err := objectstore.New(js, "FABRIC_CKPT")
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 4*elems)
	for i := range data {
		data[i] = byte(i * 7)
	}

	// Round trips with no checkpoint.
	var pause sync.RWMutex
	stop := make(chan struct{})
	timer := time.AfterFunc(2*time.Second, func() { close(stop) })
	base, err := latencies(ctx, small, &pause, stop)
	timer.Stop()
	if err != nil {
		b.Fatal(err)
	}

	// Round trips while checkpoints run back to back.
	stop = make(chan struct{})
	var during []time.Duration
	var derr error
	var wg sync.WaitGroup
	wg.Go(func() { during, derr = latencies(ctx, small, &pause, stop) })
	count := func() float64 { return metricValue(b, w, series("jetfabric_device_checkpoints_total")) }
	secs0 := metricValue(b, w, series("jetfabric_device_checkpoint_seconds_total"))
	snap0 := metricValue(b, w, series("jetfabric_device_checkpoint_snapshot_seconds_total"))
	var written, putSecs float64
	b.ResetTimer()
	for b.Loop() {
		// Every tensor new: the checkpoint writes them all. The reads
		// wait while the device computes them, so that what they measure
		// is the checkpoint.
		pause.Lock()
		one := big.Full(nil, 1)
		for i, t := range held {
			held[i] = t.Add(one)
			t.Free()
		}
		one.Free()
		if err := big.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		pause.Unlock()
		n := count()
		big.Checkpoint()
		if err := big.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		for count() == n {
			time.Sleep(2 * time.Millisecond)
		}
		written += metricValue(b, w, series("jetfabric_device_checkpoint_bytes"))

		pause.Lock()
		t0 := time.Now()
		for i := range tensors {
			data[0]++ // new bytes each time, as the tensors are
			if _, err := store.Put(ctx, fmt.Sprintf("bench-put-%d", i), data, nil); err != nil {
				b.Fatal(err)
			}
		}
		putSecs += time.Since(t0).Seconds()
		pause.Unlock()
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	if derr != nil {
		b.Fatal(derr)
	}
	ckptSecs := metricValue(b, w, series("jetfabric_device_checkpoint_seconds_total")) - secs0
	for i := range tensors {
		_ = store.Delete(ctx, fmt.Sprintf("bench-put-%d", i))
	}

	snapSecs := metricValue(b, w, series("jetfabric_device_checkpoint_snapshot_seconds_total")) - snap0
	b.ReportMetric(snapSecs*1e3/float64(b.N), "snapshot-ms")
	ckptMBs := written / 1e6 / ckptSecs
	putMBs := float64(b.N*tensors*4*elems) / 1e6 / putSecs
	b.ReportMetric(float64(quantile(base, 0.99).Microseconds())/1e3, "p99-ms-idle")
	b.ReportMetric(float64(quantile(during, 0.99).Microseconds())/1e3, "p99-ms-ckpt")
	b.ReportMetric(float64(quantile(base, 0.5).Microseconds())/1e3, "p50-ms-idle")
	b.ReportMetric(float64(quantile(during, 0.5).Microseconds())/1e3, "p50-ms-ckpt")
	b.ReportMetric(ckptMBs, "ckpt-MB/s")
	b.ReportMetric(putMBs, "put-MB/s")
	b.ReportMetric(ckptMBs/putMBs, "ckpt/put")
	b.Logf("%d checkpoints of %d MiB; %d reads idle, %d during checkpoints", b.N, tensors*4*elems>>20, len(base), len(during))
}

// BenchmarkCheckpointSnapshot measures what a checkpoint of a session
// with many small tensors stops the device loop for (the snapshot, in
// which tensors of up to 64 KiB are copied) beside the whole checkpoint.
// One iteration is one checkpoint.
func BenchmarkCheckpointSnapshot(b *testing.B) {
	for _, n := range []int{10_000, 150_000} {
		b.Run(fmt.Sprintf("tensors=%d", n), func(b *testing.B) {
			br := brokertest.Run(b)
			w := workertest.Run(b, br, workertest.CPUs(1), func(c *worker.Config) {
				c.CheckpointInterval = 0
				c.Logf = nil
			})
			c, err := client.Connect(br.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			s, err := c.Open(ctx, "cpu-0")
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				s.Full([]int{4}, float64(i))
			}
			if err := s.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			count := func() float64 { return metricValue(b, w, `jetfabric_device_checkpoints_total{device="cpu-0"}`) }
			snap0 := metricValue(b, w, `jetfabric_device_checkpoint_snapshot_seconds_total{device="cpu-0"}`)
			ckpt0 := metricValue(b, w, `jetfabric_device_checkpoint_seconds_total{device="cpu-0"}`)
			b.ResetTimer()
			for b.Loop() {
				s.Full([]int{4}, 1)
				k := count()
				s.Checkpoint()
				if err := s.Sync(ctx); err != nil {
					b.Fatal(err)
				}
				for count() == k {
					time.Sleep(time.Millisecond)
				}
			}
			snap := metricValue(b, w, `jetfabric_device_checkpoint_snapshot_seconds_total{device="cpu-0"}`) - snap0
			ckpt := metricValue(b, w, `jetfabric_device_checkpoint_seconds_total{device="cpu-0"}`) - ckpt0
			b.ReportMetric(snap*1e3/float64(b.N), "snapshot-ms")
			b.ReportMetric(ckpt*1e3/float64(b.N), "ckpt-ms")
		})
	}
}

// BenchmarkRestore measures a takeover's restore of a device whose
// checkpoint holds 8 tensors of 32 MiB: from a worker's Start to the sums
// of all its tensors read (a device serves once it has read the manifest,
// and reads the tensors after; the sums wait for them). One iteration is
// one worker started and stopped. On a CPU device and, where there is
// one, a GPU.
func BenchmarkRestore(b *testing.B) {
	for _, d := range benchDevices(b) {
		b.Run(d.kind, func(b *testing.B) { benchRestore(b, d) })
	}
}

func benchRestore(b *testing.B, bd benchDevice) {
	const tensors, elems = 8, 8 << 20
	br := brokertest.Run(b)
	quiet := func(c *worker.Config) {
		c.CheckpointInterval = 0
		c.Logf = nil
	}
	dev := bd.open(b)
	first := workertest.Run(b, br, []worker.Device{dev}, quiet)
	c, err := client.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	s, err := c.Open(ctx, dev.Name)
	if err != nil {
		b.Fatal(err)
	}
	held := make([]*client.Tensor, tensors)
	for i := range held {
		held[i] = s.Uniform([]int{elems}, -1, 1)
	}
	if err := s.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	if err := first.Stop(ctx); err != nil { // writes the checkpoint
		b.Fatal(err)
	}
	b.SetBytes(tensors * 4 * elems)
	for b.Loop() {
		b.StopTimer()
		dev := bd.open(b)
		b.StartTimer()
		nc, err := nats.Connect(br.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		cfg := worker.DefaultConfig()
		cfg.Devices = []worker.Device{dev}
		quiet(&cfg)
		w, err := worker.New(nc, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			b.Fatal(err)
		}
		sums := make([]*client.Tensor, tensors)
		for i, t := range held {
			sums[i] = t.Sum()
		}
		for _, t := range sums {
			if _, err := t.Float32s(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		for _, t := range sums {
			t.Free()
		}
		if err := s.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		if err := w.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		nc.Close()
		b.StartTimer()
	}
}
