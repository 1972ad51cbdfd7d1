package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs, os.Getenv("JETFABRIC_URL"))
	device := fs.String("device", "", "device to run on (default: the first live one)")
	chain := fs.Int("chain", 10000, "length of the dependent op chain")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if cf.url == "" {
		dir, err := os.MkdirTemp("", "jetfabric-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bf := brokerFlags{listen: "127.0.0.1:-1", store: dir, name: "jetfabric", maxPayload: 8 << 20, replicas: 1}
		f, err := startFabric(ctx, bf, workerFlags{cpus: 1, idle: 10 * time.Minute}, stderr)
		if err != nil {
			return err
		}
		defer f.close()
		cf.url = f.b.ClientURL()
		fmt.Fprintf(stdout, "started an embedded fabric at %s (broker and one CPU worker in this process; store %s, removed on exit)\n", cf.url, dir)
	}
	c, err := cf.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "demo: "+format+"\n", a...) }
	return demo(ctx, c, *device, *chain, stdout, progress)
}

// demo runs the checked workload, printing results on out and a line on
// progress as each step starts.
func demo(ctx context.Context, c *client.Client, device string, chain int, out io.Writer, progress func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	devs, err := c.Devices(ctx)
	if err != nil {
		return err
	}
	printDevices(out, devs, time.Now())
	if device == "" {
		for _, d := range devs {
			if client.Live(d, time.Now()) {
				device = d.Name
				break
			}
		}
		if device == "" {
			return fmt.Errorf("no live device: start a worker")
		}
	}
	s, err := c.Open(ctx, device)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	fmt.Fprintf(out, "\nsession %s on %s\n", s.ID(), device)

	// 1. Upload two matrices, multiply, run a chain of elementwise ops and
	// reductions, and check against the same maths done here.
	const n = 256
	progress("1/5: matmul %dx%d, elementwise ops and reductions, checked against a local reference", n, n)
	a, b := make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i] = float32(math.Sin(float64(i))) / 4
		b[i] = float32(math.Cos(float64(i)*0.7)) / 4
	}
	start := time.Now()
	ta, tb := s.FromFloat32([]int{n, n}, a), s.FromFloat32([]int{n, n}, b)
	d := ta.Matmul(tb).Mul(s.Full(nil, 0.5)).Tanh().Add(ta).Relu()
	rows := d.Sum(1)
	mean := d.Mean()
	gotRows, err := rows.Float32s(ctx)
	if err != nil {
		return err
	}
	gotMean, err := mean.Float32s(ctx)
	if err != nil {
		return err
	}
	wantRows, wantMean := demoReference(a, b, n)
	if err := closeTo("row sums", gotRows, wantRows, 1e-3); err != nil {
		return err
	}
	if err := closeTo("mean", gotMean, []float64{wantMean}, 1e-4); err != nil {
		return err
	}
	fmt.Fprintf(out, "matmul %dx%d, tanh, add, relu, sum, mean: checked against a local reference (mean %.6f) in %v\n", n, n, gotMean[0], time.Since(start).Round(time.Microsecond))

	// 2. A chain of dependent ops: order is execution order.
	progress("2/5: a chain of %d dependent ops", 2*chain)
	start = time.Now()
	x, one := s.Full([]int{1}, 0), s.Full([]int{1}, 1)
	for range chain {
		next := x.Add(one)
		x.Free()
		x = next
	}
	got, err := x.Float32s(ctx)
	if err != nil {
		return err
	}
	if got[0] != float32(chain) {
		return fmt.Errorf("chain of %d adds gave %v", chain, got[0])
	}
	el := time.Since(start)
	fmt.Fprintf(out, "%d dependent ops (add, free) in order: result %v, %v, %.0f ops/s\n", chain, got[0], el.Round(time.Microsecond), float64(2*chain)/el.Seconds())

	// 3. Round trips: one tiny op and a read, waited for each time.
	progress("3/5: tiny op + read round trips")
	lat := make([]time.Duration, 200)
	for i := range lat {
		t0 := time.Now()
		y := one.Add(one)
		if _, err := y.Float32s(ctx); err != nil {
			return err
		}
		lat[i] = time.Since(t0)
		y.Free()
	}
	slices.Sort(lat)
	fmt.Fprintf(out, "tiny op + read round trip: p50 %v, p99 %v over %d\n", lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond), len(lat))

	// 4. Random numbers keyed by seed and tensor id: same program, same bits.
	progress("4/5: seeded normal draws")
	s.Seed(42)
	r := s.Normal([]int{100000}, 0, 1)
	m, sd := r.Mean(), r.Mul(r).Mean().Sqrt()
	mv, err := m.Float32s(ctx)
	if err != nil {
		return err
	}
	sv, err := sd.Float32s(ctx)
	if err != nil {
		return err
	}
	if math.Abs(float64(mv[0])) > 0.02 || math.Abs(float64(sv[0])-1) > 0.02 {
		return fmt.Errorf("normal(0,1) sample has mean %v and rms %v", mv[0], sv[0])
	}
	fmt.Fprintf(out, "100000 normal draws (seed 42): mean %.4f, rms %.4f\n", mv[0], sv[0])

	// 5. A mistake is reported on the next read, naming the op.
	progress("5/5: a bad op, reported on the next read")
	bad := ta.Add(s.Full([]int{3}, 1))
	if _, err := bad.Float32s(ctx); err == nil {
		return fmt.Errorf("adding shapes [256 256] and [3] did not fail")
	} else {
		fmt.Fprintf(out, "a bad op is reported, and the session goes on: %v\n", err)
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "\ndemo passed\n")
	return nil
}

func demoReference(a, b []float32, n int) ([]float64, float64) {
	rows := make([]float64, n)
	total := 0.0
	for i := range n {
		for j := range n {
			var acc float64
			for k := range n {
				acc += float64(a[i*n+k]) * float64(b[k*n+j])
			}
			v := math.Max(math.Tanh(acc*0.5)+float64(a[i*n+j]), 0)
			rows[i] += v
			total += v
		}
	}
	return rows, total / float64(n*n)
}

func closeTo(what string, got []float32, want []float64, tol float64) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); d > tol*math.Max(1, math.Abs(want[i])) {
			return fmt.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
	return nil
}
