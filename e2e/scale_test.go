package e2e

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// Scale benchmark: the same set of independent jobs on 1, 2 and 4 worker
// replicas. A job is one session: a seeded 256x256 matrix, a chain of
// matmuls with it (tanh between them, to keep the values bounded) and a
// read of the mean. Jobs go round robin over the live devices and all run
// at once; jobs/s is the set's size over its wall time.
const (
	scaleJobs  = 32
	scaleN     = 256
	scaleChain = 8
)

func BenchmarkScale(b *testing.B) {
	needE2E(b)
	for _, procs := range []int{0, 1} {
		name := "cores=all"
		if procs > 0 {
			name = fmt.Sprintf("cores=%d", procs)
		}
		b.Run(name, func(b *testing.B) {
			p := newProject(b)
			p.extra = []string{fmt.Sprintf("JETFABRIC_WORKER_GOMAXPROCS=%d", procs)}
			p.compose("up", "-d")
			c := connect(b, p.url())
			for _, workers := range []int{1, 2, 4} {
				b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
					p.t = b
					p.compose("up", "-d", "--scale", fmt.Sprintf("worker=%d", workers))
					devs := waitLive(b, c, workers, 2*time.Minute)
					var names []string
					for _, d := range devs {
						names = append(names, d.Name)
					}
					if err := scaleSet(c, names); err != nil { // warm up
						b.Fatal(err)
					}
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						if err := scaleSet(c, names); err != nil {
							b.Fatal(err)
						}
					}
					el := time.Since(start)
					b.ReportMetric(float64(scaleJobs*b.N)/el.Seconds(), "jobs/s")
					b.ReportMetric(float64(scaleJobs*b.N*scaleChain)*2*scaleN*scaleN*scaleN/el.Seconds()/1e9, "GFLOP/s")
				})
			}
		})
	}
}

// scaleSet runs scaleJobs jobs at once, round robin over devices.
func scaleSet(c *client.Client, devices []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	errs := make(chan error, scaleJobs)
	var wg sync.WaitGroup
	for j := range scaleJobs {
		wg.Go(func() {
			errs <- scaleJob(ctx, c, devices[j%len(devices)], uint64(j))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func scaleJob(ctx context.Context, c *client.Client, device string, seed uint64) error {
	s, err := c.Open(ctx, device)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	s.Seed(seed)
	a := s.Uniform([]int{scaleN, scaleN}, -0.1, 0.1)
	x := a
	for range scaleChain {
		x = x.Matmul(a).Tanh()
	}
	v, err := x.Mean().Float32s(ctx)
	if err != nil {
		return fmt.Errorf("job on %s: %w", device, err)
	}
	if math.IsNaN(float64(v[0])) || math.Abs(float64(v[0])) > 1 {
		return fmt.Errorf("job on %s: mean %v", device, v[0])
	}
	return nil
}
