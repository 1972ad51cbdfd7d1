package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/subjects"
)

// demoWorkerEnv is more environment for the worker process the embedded
// demo starts from this binary (tests set what makes their binary run as
// the command).
var demoWorkerEnv []string

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs, os.Getenv("JETFABRIC_URL"))
	device := fs.String("device", "", "device to run on (default: the first live one)")
	chain := fs.Int("chain", 10000, "dependent adds in the chain (each also frees the tensor before it)")
	mnistSteps := fs.Int("mnist-steps", 10, "MNIST training steps, where the data is in the module cache (0: none)")
	logs := fs.Bool("logs", false, "print the embedded workers' logs")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *chain < 1 {
		return fmt.Errorf("-chain %d: want at least 1", *chain)
	}
	if *mnistSteps < 0 {
		return fmt.Errorf("-mnist-steps %d: want 0 or more", *mnistSteps)
	}
	start := time.Now()
	dc := demoConfig{device: *device, chain: *chain, mnistSteps: *mnistSteps}
	if cf.url == "" {
		logw := io.Discard
		if *logs {
			logw = stderr
		}
		f, err := startDemoFabric(ctx, logw)
		if err != nil {
			return err
		}
		defer f.close()
		cf.url = f.b.ClientURL()
		dc.fabric = f
		fmt.Fprintf(stdout, "started an embedded fabric at %s: the broker and worker demo-b (standby) in this process,\n"+
			"worker demo-a (cpu-0, cpu-1 and cpu jobs) in process %d; store %s, removed on exit\n\n", cf.url, f.procA.Process.Pid, f.dir)
	}
	c, err := cf.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "demo: "+format+"\n", a...) }
	if err := demo(ctx, c, dc, stdout, progress); err != nil {
		if dc.fabric != nil {
			fmt.Fprintf(stderr, "demo-a's log:\n%s", dc.fabric.logA.String())
		}
		return err
	}
	fmt.Fprintf(stdout, "\ndemo passed in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// demoFabric is the embedded demo's fabric: a broker and worker demo-b
// (standing by for cpu-0 and cpu-1) in this process, and worker demo-a
// (serving them, and taking cpu jobs) in a process of its own, to be
// killed.
type demoFabric struct {
	*fabric
	dir   string
	procA *exec.Cmd
	logA  *syncBuffer
	doneA chan struct{}
}

func startDemoFabric(ctx context.Context, logw io.Writer) (*demoFabric, error) {
	dir, err := os.MkdirTemp("", "jetfabric-demo-")
	if err != nil {
		return nil, err
	}
	d := &demoFabric{dir: dir, logA: &syncBuffer{}, doneA: make(chan struct{})}
	bf := brokerFlags{listen: "127.0.0.1:-1", store: dir, name: "jetfabric", maxPayload: 8 << 20, replicas: 1, xferStorage: "memory"}
	bcfg, err := bf.brokerConfig()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b, err := startBroker(ctx, bcfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	fail := func(err error) (*demoFabric, error) {
		d.stopA()
		_ = shutdown(b, nil)
		os.RemoveAll(dir)
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	// A short lease, so that the standby takes over soon after the kill.
	common := []string{"--url", b.ClientURL(), "--devices", "cpu-0,cpu-1", "--jobs", "cpu", "--gpus", "none",
		"--lease-ttl", "500ms", "--checkpoint-interval", "2s"}
	d.procA = exec.Command(exe, append([]string{"worker", "--id", "demo-a"}, common...)...)
	d.procA.Env = append(os.Environ(), demoWorkerEnv...)
	d.procA.Stdout, d.procA.Stderr = d.logA, d.logA
	if err := d.procA.Start(); err != nil {
		return fail(fmt.Errorf("start worker demo-a: %w", err))
	}
	go func() { _ = d.procA.Wait(); close(d.doneA) }()
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		return fail(err)
	}
	err = waitServedBy(ctx, c, "demo-a", []string{"cpu-0", "cpu-1"}, d.doneA)
	c.Close()
	if err != nil {
		return fail(fmt.Errorf("worker demo-a: %w\n%s", err, d.logA.String()))
	}
	wf := workerFlags{devices: "cpu-0,cpu-1", id: "demo-b", jobs: "cpu", gpus: "none", idle: 10 * time.Minute,
		leaseTTL: 500 * time.Millisecond, checkpoint: 2 * time.Second, jobAckWait: 10 * time.Second}
	wcfg, err := wf.config(logger(logw, ""))
	if err != nil {
		return fail(err)
	}
	nc, err := b.Connect(nats.Name("jetfabric-worker demo-b"))
	if err != nil {
		return fail(err)
	}
	w, err := newWorker(ctx, nc, wcfg)
	if err != nil {
		nc.Close()
		return fail(err)
	}
	d.fabric = &fabric{b: b, nc: nc, w: w, closeGPUs: func() {}}
	return d, nil
}

// syncBuffer collects a process's output; safe to read while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stopA kills worker demo-a if it still runs and waits for it.
func (d *demoFabric) stopA() {
	if d.procA == nil || d.procA.Process == nil {
		return
	}
	_ = d.procA.Process.Kill()
	<-d.doneA
}

func (d *demoFabric) close() error {
	d.stopA()
	err := d.fabric.close()
	os.RemoveAll(d.dir)
	return err
}

// waitServedBy waits up to a minute until worker serves every device in
// names, or done closes (the worker exited).
func waitServedBy(ctx context.Context, c *client.Client, worker string, names []string, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		devs, err := c.Devices(ctx)
		missing := slices.Clone(names)
		for _, d := range devs {
			if d.Worker == worker && client.Live(d, time.Now()) {
				missing = slices.DeleteFunc(missing, func(n string) bool { return n == d.Name })
			}
		}
		if len(missing) == 0 {
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%v not served by %s after a minute (%v)", missing, worker, err)
		case <-done:
			t.Stop()
			return fmt.Errorf("exited before serving %v", missing)
		case <-t.C:
		}
	}
}

type demoConfig struct {
	device     string
	chain      int
	mnistSteps int
	fabric     *demoFabric // nil: a fabric the demo did not start
}

// demo runs the checked workload, printing results on out and a line on
// progress as each step starts. On a fabric it started itself it also
// kills a worker; elsewhere it shows what the fabric has: a transfer where
// two devices are live, a job where a worker takes jobs.
func demo(ctx context.Context, c *client.Client, dc demoConfig, out io.Writer, progress func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	devs, err := c.Devices(ctx)
	if err != nil {
		return err
	}
	printDevices(out, devs, time.Now())
	var live []string
	for _, d := range devs {
		if client.Live(d, time.Now()) {
			live = append(live, d.Name)
		}
	}
	device := dc.device
	if device == "" {
		if len(live) == 0 {
			return fmt.Errorf("no live device: start a worker (jetfabric worker --url ...)")
		}
		device = live[0]
	}
	var other string // the transfer's target
	for _, d := range live {
		if d != device && other == "" {
			other = d
		}
	}
	jobs, why := jobWorkers(ctx, c)
	train, test, mnistErr := loadDemoMNIST(dc.mnistSteps)

	steps := []struct {
		title string
		run   func() error
	}{}
	add := func(title string, run func() error) {
		steps = append(steps, struct {
			title string
			run   func() error
		}{title, run})
	}
	s, err := c.Open(ctx, device)
	if err != nil {
		return err
	}
	defer s.Close(ctx)
	fmt.Fprintf(out, "\nsession %s on %s\n", s.ID(), device)

	const n = 256
	a, b := make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i] = float32(math.Sin(float64(i))) / 4
		b[i] = float32(math.Cos(float64(i)*0.7)) / 4
	}
	ta, tb := s.FromFloat32([]int{n, n}, a), s.FromFloat32([]int{n, n}, b)
	d := ta.Matmul(tb).Mul(s.Full(nil, 0.5)).Tanh().Add(ta).Relu()
	var gotRows []float32

	// Upload two matrices, multiply, run elementwise ops and reductions,
	// and check against the same maths done here.
	add(fmt.Sprintf("matmul %dx%d, elementwise ops and reductions on %s, checked against a local reference", n, n, device), func() error {
		start := time.Now()
		rows, mean := d.Sum(1), d.Mean()
		var err error
		if gotRows, err = rows.Float32s(ctx); err != nil {
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
		return nil
	})

	// A chain of dependent ops: order is execution order.
	add(fmt.Sprintf("a chain of %d dependent adds, each freeing the tensor before it (%d ops)", dc.chain, 2*dc.chain), func() error {
		start := time.Now()
		x, one := s.Full([]int{1}, 0), s.Full([]int{1}, 1)
		for range dc.chain {
			next := x.Add(one)
			x.Free()
			x = next
		}
		got, err := x.Float32s(ctx)
		if err != nil {
			return err
		}
		if got[0] != float32(dc.chain) {
			return fmt.Errorf("chain of %d adds gave %v", dc.chain, got[0])
		}
		el := time.Since(start)
		fmt.Fprintf(out, "%d dependent adds in order, each freeing the one before (%d ops): result %v in %v, %.0f ops/s\n",
			dc.chain, 2*dc.chain, got[0], el.Round(time.Microsecond), float64(2*dc.chain)/el.Seconds())
		return nil
	})

	// Round trips: one tiny op and a read, waited for each time.
	add("tiny op + read round trips", func() error {
		one := s.Full([]int{1}, 1)
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
		return nil
	})

	// A transfer: the result above moves to another device's session
	// through the object store, and is summed there.
	if other != "" {
		add(fmt.Sprintf("a transfer of the %dx%d result from %s to %s", n, n, device, other), func() error {
			s2, err := c.Open(ctx, other)
			if err != nil {
				return err
			}
			defer s2.Close(ctx)
			start := time.Now()
			moved := d.To(s2)
			got, err := moved.Sum(1).Float32s(ctx)
			if err != nil {
				return err
			}
			want := make([]float64, len(gotRows))
			for i, v := range gotRows {
				want[i] = float64(v)
			}
			if err := closeTo("row sums after the transfer", got, want, 1e-5); err != nil {
				return err
			}
			fmt.Fprintf(out, "transfer %s -> %s: %dx%d f32 (%d KiB) through the object store, summed on %s: the row sums of %s, in %v\n",
				device, other, n, n, n*n*4>>10, other, device, time.Since(start).Round(time.Microsecond))
			return nil
		})
	} else {
		fmt.Fprintf(out, "(no transfer: one live device; a second worker or --cpus 2 gives two)\n")
	}

	// A job through the queue: recorded here, run by whichever worker
	// takes it, its result read from the object store.
	if jobs {
		add("a job through the job queue (FABRIC_JOBS)", func() error { return demoJob(ctx, c, out) })
	} else {
		fmt.Fprintf(out, "(no job: %s)\n", why)
	}

	// Random numbers keyed by seed and tensor id: same program, same bits.
	add("seeded normal draws", func() error {
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
		return nil
	})

	// A mistake is reported on the next read, naming the op.
	add("a bad op, reported on the next read", func() error {
		bad := ta.Add(s.Full([]int{3}, 1))
		if _, err := bad.Float32s(ctx); err == nil {
			return fmt.Errorf("adding shapes [256 256] and [3] did not fail")
		} else {
			fmt.Fprintf(out, "a bad op is reported, and the session goes on: %v\n", err)
		}
		return s.Sync(ctx)
	})

	// A few MNIST training steps, data-parallel over the two devices
	// where there are two.
	switch {
	case dc.mnistSteps == 0:
	case mnistErr != nil:
		fmt.Fprintf(out, "(no MNIST steps: %v)\n", mnistErr)
	default:
		devices := []string{device}
		if other != "" {
			devices = append(devices, other)
		}
		add(fmt.Sprintf("%d MNIST training steps of a small MLP on %s", dc.mnistSteps, strings.Join(devices, " and ")), func() error {
			return demoMNIST(ctx, c, devices, dc.mnistSteps, train, test, out)
		})
	}

	// A worker killed: its standby takes the devices over, restores their
	// last checkpoint, replays the frames after it, and the session goes
	// on with every tensor it had.
	if dc.fabric != nil {
		add("worker demo-a killed (SIGKILL); its standby demo-b carries the session on", func() error {
			return demoFailover(ctx, c, s, dc.fabric, out)
		})
	} else {
		fmt.Fprintf(out, "(no worker killed: the demo kills only a worker it started; run it without --url)\n")
	}

	fmt.Fprintln(out)
	for i, st := range steps {
		progress("%d/%d: %s", i+1, len(steps), st.title)
		if err := st.run(); err != nil {
			return fmt.Errorf("step %d (%s): %w", i+1, st.title, err)
		}
	}
	return nil
}

// jobWorkers says whether a worker is waiting for cpu jobs, and if not why.
func jobWorkers(ctx context.Context, c *client.Client) (bool, string) {
	js, err := jetstream.New(c.Conn())
	if err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, subjects.Default().JobsStream(), subjects.JobsConsumer("cpu"))
	if err != nil {
		return false, "no worker has taken cpu jobs on this fabric (start one with --jobs cpu)"
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, err.Error()
	}
	if info.NumWaiting == 0 {
		return false, "no worker is waiting for cpu jobs now (start one with --jobs cpu)"
	}
	return true, ""
}

// demoJob submits a 64x64 matmul and row sums as a job and checks its
// output.
func demoJob(ctx context.Context, c *client.Client, out io.Writer) error {
	const n = 64
	x := make([]float32, n*n)
	for i := range x {
		x[i] = float32(i%17-8) / 8
	}
	start := time.Now()
	j := c.NewJob()
	tx := j.FromFloat32([]int{n, n}, x)
	id, err := c.Submit(ctx, "cpu", j, tx.Matmul(tx).Sum(1))
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := c.Wait(wctx, id)
	if err != nil {
		return err
	}
	data, err := res[0].Output(ctx, 0)
	if err != nil {
		return err
	}
	if data.DType != "f32" || len(data.Bytes) != 4*n {
		return fmt.Errorf("job output %s %v, want f32 [%d]", data.DType, data.Shape, n)
	}
	for i := range n {
		var want float64
		for k := range n {
			for jj := range n {
				want += float64(x[i*n+k]) * float64(x[k*n+jj])
			}
		}
		got := math.Float32frombits(binary.LittleEndian.Uint32(data.Bytes[4*i:]))
		if math.Abs(float64(got)-want) > 1e-3*math.Max(1, math.Abs(want)) {
			return fmt.Errorf("job output[%d] = %v, want %v", i, got, want)
		}
	}
	fmt.Fprintf(out, "job %s… through FABRIC_JOBS: taken by worker %s, a %dx%d matmul and row sums, checked; submit to result %v\n",
		id[:8], res[0].Worker, n, n, time.Since(start).Round(time.Microsecond))
	return nil
}

// demoFailover kills worker demo-a while session s holds tensors on its
// device, then goes on with s: the next read is answered once the standby
// took the device over.
func demoFailover(ctx context.Context, c *client.Client, s *client.Session, f *demoFabric, out io.Writer) error {
	x, one := s.Full([]int{1}, 0), s.Full([]int{1}, 1)
	const before, after = 1000, 1000
	for range before {
		x = x.Add(one)
	}
	if v, err := x.Float32s(ctx); err != nil || v[0] != before {
		return fmt.Errorf("before the kill: %v %v", v, err)
	}
	pid := f.procA.Process.Pid
	killed := time.Now()
	if err := f.procA.Process.Kill(); err != nil {
		return fmt.Errorf("kill demo-a: %w", err)
	}
	<-f.doneA
	for range after {
		x = x.Add(one)
	}
	v, err := x.Float32s(ctx)
	if err != nil {
		return fmt.Errorf("after the kill: %w", err)
	}
	if v[0] != before+after {
		return fmt.Errorf("after the kill the value is %v, want %d", v[0], before+after)
	}
	took := time.Since(killed)
	owner := ""
	devs, err := c.Devices(ctx)
	if err != nil {
		return err
	}
	// The registry entry is rewritten once a heartbeat: ask each worker
	// for its own, current view.
	tv := &topView{nc: c.Conn(), names: subjects.Default()}
	for i := range devs {
		tv.refresh(ctx, &devs[i])
		if devs[i].Name == s.Device() {
			owner = devs[i].Worker
		}
	}
	if owner != "demo-b" {
		return fmt.Errorf("after the kill the registry names %q for %s, want demo-b", owner, s.Device())
	}
	fmt.Fprintf(out, "killed worker demo-a (pid %d, SIGKILL) with the session's tensors on %s; demo-b took %s over\n"+
		"(its last checkpoint restored, the frames after it replayed) and answered the next read %v after the kill:\n"+
		"%d adds before the kill and %d after give %v, as they must\n",
		pid, s.Device(), s.Device(), took.Round(time.Millisecond), before, after, v[0])
	printDevices(out, devs, time.Now())
	return nil
}

// loadDemoMNIST loads the first examples of MNIST from the module cache
// for steps training steps, or says why it cannot.
func loadDemoMNIST(steps int) (train, test *mnist.Set, err error) {
	if steps == 0 {
		return nil, nil, nil
	}
	train, test, err = mnist.Load(mnist.DefaultDir())
	if err != nil {
		if errors.Is(err, mnist.ErrNotFound) {
			return nil, nil, fmt.Errorf("the MNIST data is not in the module cache; %s", mnist.Hint)
		}
		return nil, nil, err
	}
	return train.Head(min(steps*demoBatch, train.N)), test.Head(min(1000, test.N)), nil
}

const demoBatch = 64

// demoMNIST trains jetfabric train's MLP, narrowed to 64 hidden units, for
// a few steps over devices (data-parallel) and reports its loss and test
// accuracy.
func demoMNIST(ctx context.Context, c *client.Client, devices []string, steps int, train, test *mnist.Set, out io.Writer) error {
	f := trainFlags{model: "mlp", devices: devices, epochs: 1, batch: demoBatch, lr: 3e-3, seed: 1,
		limit: train.N, testLimit: test.N, hidden: 64, check: steps}
	if err := f.validate(); err != nil {
		return err
	}
	rep, err := trainMNIST(ctx, c, &f, train, test, io.Discard, nil)
	if err != nil {
		return err
	}
	where := "on " + devices[0]
	if len(devices) > 1 {
		where = "data-parallel on " + strings.Join(devices, " and ")
	}
	fmt.Fprintf(out, "MNIST: %d steps of %d examples, an MLP 784-64-64-10 %s: loss %.3f, test accuracy %.1f%% on %d examples (chance: 10%%), %.0f ms a step\n",
		rep.Steps, demoBatch, where, rep.FinalLoss, 100*rep.TestAccuracy, rep.TestExamples, rep.StepMS)
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
