package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/client"
)

// scaleConfig is the horizontal scaling benchmark: the same set of
// independent jobs through the job queue (FABRIC_JOBS) on more and more
// worker processes, each started with -jobs cpu. A job is a seeded n x n
// matrix, a chain of matmuls with it (tanh between them, to keep the
// values bounded) and its mean as the output. A set's jobs are all
// submitted at once; each worker takes one at a time.
type scaleConfig struct {
	workers []int // worker processes, increasing
	jobs    int
	n       int
	chain   int
	sets    int    // timed sets per step
	cores   int    // GOMAXPROCS of each worker (0: all)
	gpus    string // the workers' -gpus: none unless asked
}

type scaleStep struct {
	Workers  int     `json:"workers"`
	Sets     int     `json:"sets"`
	Jobs     int     `json:"jobs_per_set"`
	Seconds  float64 `json:"seconds"`
	JobsPerS float64 `json:"jobs_per_s"`
	GFLOPs   float64 `json:"gflop_per_s"`
}

type scaleReport struct {
	Machine     string      `json:"machine"`
	WorkerCores string      `json:"worker_cores"`
	Job         string      `json:"job"`
	Steps       []scaleStep `json:"steps"`
}

func parseScale(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-scale %q: want increasing worker counts from 1 to 256, e.g. 1,2,4", s)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("-scale %q: want increasing worker counts, e.g. 1,2,4", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func (c scaleConfig) check() error {
	switch {
	case c.jobs < 1 || c.jobs > 4096:
		return fmt.Errorf("-scale-jobs %d: want 1 to 4096", c.jobs)
	case c.n < 1 || c.n > 4096:
		return fmt.Errorf("-scale-n %d: want 1 to 4096", c.n)
	case c.chain < 1 || c.chain > 1000:
		return fmt.Errorf("-scale-chain %d: want 1 to 1000", c.chain)
	case c.sets < 1:
		return fmt.Errorf("-scale-sets %d: want at least 1", c.sets)
	case c.cores < 0:
		return fmt.Errorf("-worker-cores %d: want 0 (all) or more", c.cores)
	}
	if _, err := (&workerFlags{gpus: c.gpus}).gpuCount(); err != nil {
		return fmt.Errorf("-scale-gpus: %w", err)
	}
	return nil
}

// benchScale starts a broker process and adds worker processes (each
// claiming a cpu slot, so that the registry shows it live, and taking cpu
// jobs) step by step, timing the job sets at each step.
func benchScale(ctx context.Context, c scaleConfig, asJSON bool, stdout io.Writer, progress func(string, ...any)) error {
	if err := c.check(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "jetfabric-bench-scale-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var procs []*exec.Cmd
	stopBroker := func() {}
	defer func() { // the workers, then the broker they stop through
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
		stopBroker()
	}()
	start := func(env []string, args ...string) error {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
		return nil
	}
	cl, url, stop, err := brokerProcess(ctx, exe, nil, dir)
	if err != nil {
		return err
	}
	stopBroker = stop
	defer cl.Close()
	var env []string
	cores := "all the machine's"
	if c.cores > 0 {
		env = []string{fmt.Sprintf("GOMAXPROCS=%d", c.cores)}
		cores = strconv.Itoa(c.cores)
	}
	rep := scaleReport{
		Machine:     fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
		WorkerCores: cores,
		Job:         fmt.Sprintf("%dx%d f32 uniform, %d x (matmul, tanh), mean", c.n, c.n, c.chain),
	}
	running := 0
	for _, n := range c.workers {
		for ; running < n; running++ {
			if err := start(env, "worker", "--url", url, "--claim", "cpu", "--jobs", "cpu", "--gpus", c.gpus, "--idle-timeout", "1h"); err != nil {
				return err
			}
		}
		if _, err := waitLiveDevices(ctx, cl, n); err != nil {
			return err
		}
		if err := scaleSet(ctx, cl, c); err != nil { // warm up
			return err
		}
		t0 := time.Now()
		for range c.sets {
			if err := scaleSet(ctx, cl, c); err != nil {
				return err
			}
		}
		el := time.Since(t0).Seconds()
		jobs := float64(c.jobs * c.sets)
		st := scaleStep{Workers: n, Sets: c.sets, Jobs: c.jobs, Seconds: el, JobsPerS: jobs / el,
			GFLOPs: jobs * float64(c.chain) * 2 * math.Pow(float64(c.n), 3) / el / 1e9}
		rep.Steps = append(rep.Steps, st)
		progress("%d workers: %.1f jobs/s", n, st.JobsPerS)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(stdout, "horizontal scaling: %d jobs a set, all submitted at once to the job queue, each worker taking one at a time; %s\n", c.jobs, rep.Machine)
	fmt.Fprintf(stdout, "job: %s; worker processes with %s cores each (-gpus %s), the broker in its own process, the client in this one\n", rep.Job, cores, c.gpus)
	base := rep.Steps[0].JobsPerS
	for _, st := range rep.Steps {
		fmt.Fprintf(stdout, "%3d workers  %8.1f jobs/s  %7.2f GFLOP/s  %5.2fx\n", st.Workers, st.JobsPerS, st.GFLOPs, st.JobsPerS/base)
	}
	return nil
}

// brokerProcess starts a broker process of exe (with env added to its
// environment), its store in dir (spawnBroker), and connects a client.
// stop ends the process.
func brokerProcess(ctx context.Context, exe string, env []string, dir string) (cl *client.Client, url string, stop func(), err error) {
	url, stop, err = spawnBroker(ctx, exe, env, "nats://", func(listen string) []string {
		return []string{"broker", "--listen", listen, "--http", "", "--store", dir}
	})
	if err != nil {
		return nil, "", nil, err
	}
	if cl, err = client.Connect(url); err != nil {
		stop()
		return nil, "", nil, err
	}
	return cl, url, stop, nil
}

// spawnBroker starts a broker process of exe with args(listen), listen a
// loopback address whose port the broker chooses itself, so that no other
// process can take it first, and returns the URL it takes connections at
// (scheme, then the address its ready line names) once it does
// (waitConnect, with opts). stop interrupts the process and waits for it.
func spawnBroker(ctx context.Context, exe string, env []string, scheme string, args func(listen string) []string, opts ...nats.Option) (url string, stop func(), err error) {
	cmd := exec.Command(exe, args("127.0.0.1:-1")...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	ready := make(chan string, 1)
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := brokerReady.FindStringSubmatch(sc.Text()); m != nil {
				ready <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // the rest: the broker never blocks on a full pipe
		exited <- cmd.Wait()            // once every read is done, as Wait wants
	}()
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-exited
	}
	select {
	case addr := <-ready:
		url = scheme + addr
		if err := waitConnect(ctx, url, opts...); err != nil {
			stop()
			return "", nil, err
		}
		return url, stop, nil
	case err := <-exited:
		return "", nil, fmt.Errorf("the broker process exited before it was ready: %v", err)
	case <-ctx.Done():
		stop()
		return "", nil, ctx.Err()
	}
}

// brokerReady matches the line a broker process prints once it takes
// connections, and takes its client address.
var brokerReady = regexp.MustCompile(`^jetfabric broker ready: clients [a-z]+://([^,\s]+)`)

func freeLoopbackPort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 24222
	}
	defer l.Close()
	_, p, _ := hostPort(l.Addr().String())
	return p
}

// waitLiveDevices waits up to a minute for n live devices and returns
// their names.
func waitLiveDevices(ctx context.Context, c *client.Client, n int) ([]string, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		devs, err := c.Devices(lctx)
		cancel()
		var names []string
		for _, d := range devs {
			if client.Live(d, time.Now()) {
				names = append(names, d.Name)
			}
		}
		if len(names) >= n {
			return names, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d live devices after a minute, want %d (%v)", len(names), n, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scaleSet submits c.jobs jobs at once to the cpu job queue and waits for
// every result, checking each.
func scaleSet(ctx context.Context, cl *client.Client, c scaleConfig) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	ids := make([]string, c.jobs)
	for j := range c.jobs {
		job := cl.NewJob()
		job.Seed(uint64(j))
		a := job.Uniform([]int{c.n, c.n}, -0.1, 0.1)
		x := a
		for range c.chain {
			x = x.Matmul(a).Tanh()
		}
		var err error
		if ids[j], err = cl.Submit(ctx, "cpu", job, x.Mean()); err != nil {
			return err
		}
	}
	res, err := cl.Wait(ctx, ids...)
	if err != nil {
		return err
	}
	for _, r := range res {
		d, err := r.Output(ctx, 0)
		if err != nil {
			return fmt.Errorf("job %s on %s: %w", r.ID, r.Worker, err)
		}
		if d.DType != "f32" || len(d.Bytes) != 4 {
			return fmt.Errorf("job %s on %s: output %s %v", r.ID, r.Worker, d.DType, d.Shape)
		}
		v := math.Float32frombits(binary.LittleEndian.Uint32(d.Bytes))
		if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 1 {
			return fmt.Errorf("job %s on %s: mean %v", r.ID, r.Worker, v)
		}
	}
	return nil
}
