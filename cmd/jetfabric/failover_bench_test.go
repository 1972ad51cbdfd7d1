package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
)

// BenchmarkFailover measures the time from SIGKILL of a device's worker to
// the session's next answered read, with a standby process waiting, for
// lease TTLs of 1s (the default) and 500ms.
func BenchmarkFailover(b *testing.B) {
	for _, ttl := range []string{"1s", "500ms"} {
		b.Run("lease-"+ttl, func(b *testing.B) {
			br := brokertest.Run(b)
			var total time.Duration
			n := 0
			for b.Loop() {
				owner := spawnB(b, "worker", "--url", br.ClientURL(), "--devices", "cpu-0", "--lease-ttl", ttl, "--id", fmt.Sprintf("o%d", n))
				waitDeviceB(b, br.ClientURL(), fmt.Sprintf("o%d", n))
				spawnB(b, "worker", "--url", br.ClientURL(), "--devices", "cpu-0", "--lease-ttl", ttl, "--id", fmt.Sprintf("s%d", n))
				c, err := client.Connect(br.ClientURL())
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				s, err := c.Open(ctx, "cpu-0")
				if err != nil {
					b.Fatal(err)
				}
				x := s.Arange(0, 1000, 1)
				if _, err := x.Sum().Float32s(ctx); err != nil {
					b.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // let the standby settle
				_ = owner.Process.Signal(syscall.SIGKILL)
				t0 := time.Now()
				if _, err := x.Mul(x).Sum().Float32s(ctx); err != nil {
					b.Fatal(err)
				}
				total += time.Since(t0)
				n++
				s.Close(ctx)
				c.Close()
				// The standby is the owner now; kill it too so the next
				// round starts with a fresh pair.
				b.StopTimer()
				killAll(b)
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(n), "ms/failover")
		})
	}
}

// BenchmarkFailoverHeld measures the same failover at the default lease
// TTL for a session that holds 1 GiB in 16 tensors of 64 MiB, all in the
// device's last checkpoint: from the SIGKILL to the answer of a read of a
// small tensor (first), of the sum of one large tensor (one), and of the
// sum of all of them (all: every tensor restored). at-commit kills the
// owner as soon as the checkpoint is committed, before the standby can
// have read it ahead; read-ahead once the standby holds its tensors.
func BenchmarkFailoverHeld(b *testing.B) {
	b.Run("at-commit", func(b *testing.B) { failoverHeld(b, false) })
	b.Run("read-ahead", func(b *testing.B) { failoverHeld(b, true) })
}

func failoverHeld(b *testing.B, readAhead bool) {
	const tensors, elems = 16, 16 << 20 // f32: 16 x 64 MiB
	br := brokertest.Run(b)
	nc, err := nats.Connect(br.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), "FABRIC_CTRL")
	if err != nil {
		b.Fatal(err)
	}
	var first, one, all time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		dev := fmt.Sprintf("cpu-%d", n)
		owner := spawnB(b, "worker", "--url", br.ClientURL(), "--devices", dev, "--id", fmt.Sprintf("o%d", n))
		waitServedB(b, br.ClientURL(), dev, fmt.Sprintf("o%d", n))
		metrics := fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort())
		spawnB(b, "worker", "--url", br.ClientURL(), "--devices", dev, "--id", fmt.Sprintf("s%d", n), "--metrics", metrics)
		c, err := client.Connect(br.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		s, err := c.Open(ctx, dev)
		if err != nil {
			b.Fatal(err)
		}
		x := s.Arange(0, 1000, 1)
		held := make([]*client.Tensor, tensors)
		for i := range held {
			held[i] = s.Uniform([]int{elems}, -1, 1)
		}
		total := held[0].Sum()
		for _, t := range held[1:] {
			total = total.Add(t.Sum())
		}
		want, err := total.Float32s(ctx)
		if err != nil {
			b.Fatal(err)
		}
		s.Checkpoint()
		if err := s.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if _, err := kv.Get(ctx, "ckpt."+dev); err == nil {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("no checkpoint committed")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if readAhead {
			warm := &soakProc{id: "standby", metrics: "http://" + metrics + "/metrics"}
			for {
				m, _ := warm.scrape()
				if m["jetfabric_device_standby_warm_bytes"] >= tensors*4*elems {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the standby read %v bytes ahead in 2 minutes", m["jetfabric_device_standby_warm_bytes"])
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		time.Sleep(50 * time.Millisecond) // let the standby settle
		b.StartTimer()
		_ = owner.Process.Signal(syscall.SIGKILL)
		t0 := time.Now()
		if _, err := x.Sum().Float32s(ctx); err != nil {
			b.Fatal(err)
		}
		first += time.Since(t0)
		if _, err := held[tensors/2].Sum().Float32s(ctx); err != nil {
			b.Fatal(err)
		}
		one += time.Since(t0)
		total = held[0].Sum()
		for _, t := range held[1:] {
			total = total.Add(t.Sum())
		}
		got, err := total.Float32s(ctx)
		if err != nil {
			b.Fatal(err)
		}
		all += time.Since(t0)
		b.StopTimer()
		if got[0] != want[0] {
			b.Fatalf("sum after the failover %v, before %v", got[0], want[0])
		}
		n++
		s.Close(ctx)
		c.Close()
		killAll(b)
		b.StartTimer()
	}
	b.ReportMetric(float64(first.Milliseconds())/float64(n), "ms-first")
	b.ReportMetric(float64(one.Milliseconds())/float64(n), "ms-one")
	b.ReportMetric(float64(all.Milliseconds())/float64(n), "ms-all")
}

// waitServedB waits until device is served by worker id.
func waitServedB(b *testing.B, url, device, id string) {
	b.Helper()
	c, err := client.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		devs, _ := c.Devices(context.Background())
		for _, d := range devs {
			if d.Name == device && d.Worker == id && d.State == "serving" {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("%s never served by %s", device, id)
}

// BenchmarkReplay measures takeover by replay alone (no checkpoint): a
// session runs ops, its worker is killed, and a new worker replays them all
// before it answers the read.
func BenchmarkReplay(b *testing.B) {
	const ops = 200000
	for b.Loop() {
		b.StopTimer()
		br := brokertest.Run(b)
		owner := spawnB(b, "worker", "--url", br.ClientURL(), "--devices", "cpu-0", "--checkpoint-interval", "0", "--id", "first")
		waitDeviceB(b, br.ClientURL(), "first")
		c, err := client.Connect(br.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			b.Fatal(err)
		}
		x, one := s.Full([]int{1}, 0), s.Full([]int{1}, 1)
		for range ops {
			x = x.Add(one)
		}
		if _, err := x.Float32s(ctx); err != nil {
			b.Fatal(err)
		}
		_ = owner.Process.Signal(syscall.SIGKILL)
		_ = owner.Wait()
		b.StartTimer()
		t0 := time.Now()
		_, out := spawnOut(b, "worker", "--url", br.ClientURL(), "--devices", "cpu-0", "--checkpoint-interval", "0", "--id", "second")
		if v, err := x.Add(one).Float32s(ctx); err != nil || v[0] != ops+1 {
			b.Fatalf("after replay: %v %v", v, err)
		}
		el := time.Since(t0)
		b.ReportMetric(float64(el.Milliseconds()), "ms-to-read")
		// The worker logs its catch-up: "... in 412ms (485000 ops/s)".
		if m := regexp.MustCompile(`caught up: replayed \d+ frames \((\d+) ops\).* in ([^ ]+) \((\d+) ops/s\)`).FindStringSubmatch(out.String()); m != nil {
			rate, _ := strconv.ParseFloat(m[3], 64)
			b.ReportMetric(rate, "replayed-ops/s")
		} else {
			b.Fatalf("no catch-up line in the worker's log:\n%s", out.String())
		}
		b.StopTimer()
		s.Close(ctx)
		c.Close()
		killAll(b)
		b.StartTimer()
	}
}

var benchProcs []*exec.Cmd

func spawnB(b *testing.B, args ...string) *exec.Cmd {
	cmd, _ := spawnOut(b, args...)
	return cmd
}

func spawnOut(b *testing.B, args ...string) (*exec.Cmd, *output) {
	b.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "JETFABRIC_TEST_MAIN=1")
	out := &output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	benchProcs = append(benchProcs, cmd)
	b.Cleanup(func() { killAll(b) })
	return cmd, out
}

func killAll(b *testing.B) {
	for _, p := range benchProcs {
		_ = p.Process.Signal(syscall.SIGKILL)
		_ = p.Wait()
	}
	benchProcs = nil
}

// waitDeviceB waits until cpu-0 is served by worker id.
func waitDeviceB(b *testing.B, url, id string) {
	b.Helper()
	c, err := client.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		devs, _ := c.Devices(context.Background())
		for _, d := range devs {
			if d.Name == "cpu-0" && d.Worker == id && d.State == "serving" {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatalf("cpu-0 never served by %s", id)
}
