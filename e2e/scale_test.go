package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// Scale benchmark: the same set of independent jobs through the job queue
// (FABRIC_JOBS) on 1, 2 and 4 worker replicas, each started with --jobs
// cpu. A job is a seeded 256x256 matrix, a chain of matmuls with it (tanh
// between them, to keep the values bounded) and its mean as the output. A
// set's jobs are submitted at once and each replica takes one at a time;
// jobs/s is the set's size over its wall time.
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
					waitLive(b, c, workers, 2*time.Minute)
					if err := scaleSet(c); err != nil { // warm up
						b.Fatal(err)
					}
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						if err := scaleSet(c); err != nil {
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

// scaleSet submits scaleJobs jobs at once and waits for every result,
// checking each.
func scaleSet(c *client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ids := make([]string, scaleJobs)
	for j := range scaleJobs {
		job := c.NewJob()
		job.Seed(uint64(j))
		a := job.Uniform([]int{scaleN, scaleN}, -0.1, 0.1)
		x := a
		for range scaleChain {
			x = x.Matmul(a).Tanh()
		}
		var err error
		if ids[j], err = c.Submit(ctx, "cpu", job, x.Mean()); err != nil {
			return err
		}
	}
	res, err := c.Wait(ctx, ids...)
	if err != nil {
		return err
	}
	for _, r := range res {
		d, err := r.Output(ctx, 0)
		if err != nil {
			return fmt.Errorf("job %s on %s: %w", r.ID, r.Worker, err)
		}
		if len(d.Bytes) != 4 {
			return fmt.Errorf("job %s on %s: output %s %v", r.ID, r.Worker, d.DType, d.Shape)
		}
		v := math.Float32frombits(binary.LittleEndian.Uint32(d.Bytes))
		if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 1 {
			return fmt.Errorf("job %s on %s: mean %v", r.ID, r.Worker, v)
		}
	}
	return nil
}
