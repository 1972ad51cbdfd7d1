package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels/cpu"
)

// soakConfig is the state soak: sessions that hold a device's memory in
// large tensors, rewrite some of them at a steady pace and read them back,
// first on a worker with no checkpoints and no kills (the reference), then
// on a worker that checkpoints on an interval and is SIGKILLed several
// times with a standby process waiting each time.
type soakConfig struct {
	held     int64         // tensor bytes of all the sessions together
	sessions int           // sessions
	tensor   int64         // bytes of each tensor
	steps    int           // steps of each session
	every    time.Duration // a session's step period
	probes   int           // tiny op + read round trips a step
	ckpt     time.Duration // the killed worker's checkpoint interval
	kills    int           // SIGKILLs of the owner
	leaseTTL time.Duration // the workers' lease TTL (0: the default)
	settle   time.Duration // how long to wait for memory to come back after the sessions are freed
}

func (c soakConfig) check() error {
	switch {
	case c.sessions < 1 || c.sessions > 1000:
		return fmt.Errorf("-soak-sessions %d: want 1 to 1000", c.sessions)
	case c.tensor < 64<<10 || c.tensor%4 != 0:
		return fmt.Errorf("-soak-tensor %d: want at least 64 KiB, a multiple of 4 bytes", c.tensor)
	case c.held < c.tensor*int64(c.sessions):
		return fmt.Errorf("-soak %d bytes: want at least one tensor (%d bytes) a session", c.held, c.tensor)
	case c.steps < 1:
		return fmt.Errorf("-soak-steps %d: want at least 1", c.steps)
	case c.every < 0 || c.probes < 0 || c.kills < 0:
		return errors.New("-soak-step-every, -soak-probes and -soak-kills must not be negative")
	case c.ckpt <= 0:
		return fmt.Errorf("-soak-checkpoint-interval %v: want a positive interval", c.ckpt)
	}
	return nil
}

// perSession is how many tensors each session holds.
func (c soakConfig) perSession() int { return int(c.held / int64(c.sessions) / c.tensor) }

// soakPhase is what one phase measured.
type soakPhase struct {
	Name string `json:"name"`
	// Reads is the bits of every read, by session then step.
	reads [][]uint32
	// Probes: tiny op + read round trips.
	probes []soakProbe
	// Memory, per worker process that held tensors.
	Workers []soakMemory `json:"workers"`
	// Checkpoints committed and their windows.
	Checkpoints int `json:"checkpoints"`
	windows     [][2]time.Time
	// Kills and the stall of each (kill to every session's next answer).
	Stalls       []soakStall `json:"stalls,omitempty"`
	stallWindows [][2]time.Time
	// restoring: when a worker still had restored tensors to read.
	restoring [][2]time.Time
	// freeing: the sessions are being freed; memory samples from then
	// on are not steady state.
	freeing    atomic.Bool
	Seconds    float64 `json:"seconds"`
	HeldBytes  int64   `json:"held_bytes"`
	CkptSecond float64 `json:"checkpoint_seconds_total"`
}

type soakProbe struct {
	at time.Time
	d  time.Duration
}

type soakStall struct {
	First  float64 `json:"first_answer_ms"`
	Median float64 `json:"median_session_ms"`
	Last   float64 `json:"last_session_ms"`
	// Waits: how long each session's first step answered after the kill
	// waited, from the later of the kill and the step's start: the stall
	// its client saw, without the time the session was idle between
	// steps (which the figures above include).
	WaitFirst  float64 `json:"wait_first_ms"`
	WaitMedian float64 `json:"wait_median_ms"`
	WaitLast   float64 `json:"wait_last_ms"`
}

// soakMemory is one worker process's resident memory against the tensor
// bytes it held.
type soakMemory struct {
	ID string `json:"id"`
	// Baseline is the resident memory before it held anything.
	Baseline int64 `json:"baseline_rss"`
	// PeakHeld and the largest RSS/held over the samples with at least
	// half the soak's bytes held (steady state), and the RSS then.
	PeakHeld  int64   `json:"peak_held"`
	MaxRatio  float64 `json:"max_rss_over_held"`
	RatioRSS  int64   `json:"rss_at_max_ratio"`
	RatioHeld int64   `json:"held_at_max_ratio"`
	PeakRSS   int64   `json:"peak_rss"`
	Samples   int     `json:"steady_samples"`
	// After is the resident memory once every session was freed and the
	// worker idled for the settle time; -1 if it was killed before.
	After int64 `json:"rss_after_free"`
}

// soakProc is a worker process of the soak and what is sampled of it.
type soakProc struct {
	id      string
	cmd     *exec.Cmd
	metrics string
	mu      sync.Mutex
	mem     soakMemory
	dead    bool
	ckpts   float64
	ckptSec float64
}

func benchSoak(ctx context.Context, c soakConfig, asJSON bool, stdout io.Writer, progress func(string, ...any)) error {
	if err := c.check(); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "jetfabric-bench-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var procs []*exec.Cmd
	stopBroker := func() {}
	defer func() { // the workers, then the broker
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGKILL)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
		stopBroker()
	}()
	start := func(args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), demoWorkerEnv...)
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
		return cmd, nil
	}
	cl, url, stop, err := brokerProcess(ctx, exe, demoWorkerEnv, dir)
	if err != nil {
		return err
	}
	stopBroker = stop
	defer cl.Close()
	worker := func(id, device string, ckpt time.Duration) (*soakProc, error) {
		mp := freeLoopbackPort()
		args := []string{"worker", "--url", url, "--devices", device, "--id", id, "--gpus", "none",
			"--idle-timeout", "1h", "--checkpoint-interval", ckpt.String(), "--metrics", fmt.Sprintf("127.0.0.1:%d", mp)}
		if c.leaseTTL > 0 {
			args = append(args, "--lease-ttl", c.leaseTTL.String())
		}
		cmd, err := start(args...)
		if err != nil {
			return nil, err
		}
		return &soakProc{id: id, cmd: cmd, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", mp), mem: soakMemory{ID: id, After: -1}}, nil
	}
	progress("soak: %d sessions x %d tensors of %d MiB = %.2f GiB held; %d steps a session, one every %v; broker %s",
		c.sessions, c.perSession(), c.tensor>>20, float64(int64(c.perSession())*int64(c.sessions)*c.tensor)/(1<<30), c.steps, c.every, url)

	// The reference: no checkpoints, no kills.
	a, err := worker("soak-ref", "cpu-0", 0)
	if err != nil {
		return err
	}
	if err := waitServedBy(ctx, cl, "soak-ref", []string{"cpu-0"}, nil); err != nil {
		return err
	}
	ref, err := soakRun(ctx, cl, c, "cpu-0", "reference (no checkpoints, no kills)", []*soakProc{a}, nil, progress)
	if err != nil {
		return fmt.Errorf("reference run: %w", err)
	}
	_ = a.cmd.Process.Signal(syscall.SIGKILL)

	// The soak: checkpoints on the interval, the owner killed c.kills
	// times with a standby waiting.
	ws := []*soakProc{}
	n := 0
	next := func() (*soakProc, error) {
		n++
		p, err := worker(fmt.Sprintf("soak-%d", n), "cpu-1", c.ckpt)
		if err == nil {
			ws = append(ws, p)
		}
		return p, err
	}
	if _, err := next(); err != nil {
		return err
	}
	if err := waitServedBy(ctx, cl, "soak-1", []string{"cpu-1"}, nil); err != nil {
		return err
	}
	if _, err := next(); err != nil {
		return err
	}
	soak, err := soakRun(ctx, cl, c, "cpu-1", fmt.Sprintf("checkpoints every %v, %d SIGKILLs", c.ckpt, c.kills), ws, next, progress)
	if err != nil {
		return fmt.Errorf("soak run: %w", err)
	}
	return soakReport(c, ref, soak, asJSON, stdout)
}

// soakRun runs the program on every session of device, sampling the
// worker processes (ws, to which next adds a standby after each kill;
// next nil: no kills), and returns what it measured.
func soakRun(ctx context.Context, cl *client.Client, c soakConfig, device, name string, ws []*soakProc,
	next func() (*soakProc, error), progress func(string, ...any)) (*soakPhase, error) {
	ph := &soakPhase{Name: name, reads: make([][]uint32, c.sessions)}
	var wmu sync.Mutex
	procs := func() []*soakProc {
		wmu.Lock()
		defer wmu.Unlock()
		return slices.Clone(ws)
	}
	// Each worker's baseline, before it holds anything.
	waitLive := time.Now().Add(time.Minute)
	for _, p := range procs() {
		for {
			if _, err := p.scrape(); err == nil {
				break
			}
			if time.Now().After(waitLive) {
				return nil, fmt.Errorf("worker %s: no metrics", p.id)
			}
			time.Sleep(100 * time.Millisecond)
		}
		p.mem.Baseline = rss(p.cmd.Process.Pid)
	}
	steady := c.held / 2
	stopMon := make(chan struct{})
	var mon sync.WaitGroup
	mon.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopMon:
				return
			case <-t.C:
			}
			for _, p := range procs() {
				p.sample(steady, ph)
			}
		}
	})

	sessions := make([]*client.Session, c.sessions)
	for i := range sessions {
		s, err := cl.Open(ctx, device)
		if err != nil {
			return nil, err
		}
		sessions[i] = s
	}
	elems := int(c.tensor / 4)
	k := c.perSession()
	// Every session creates its tensors first.
	held := make([][]*client.Tensor, c.sessions)
	for i, s := range sessions {
		s.Seed(uint64(i + 1))
		held[i] = make([]*client.Tensor, k)
		for j := range held[i] {
			held[i][j] = s.Uniform([]int{elems}, -1, 1)
		}
	}
	for _, s := range sessions {
		if err := s.Sync(ctx); err != nil {
			return nil, err
		}
	}
	progress("%s: %d sessions hold their tensors", name, c.sessions)

	// Kills at spread points of the run, by the count of steps done.
	var (
		mu     sync.Mutex
		done   int
		kills  []time.Time
		killAt []int
		answer = make([][]time.Time, c.sessions)     // after each kill, a session's first answer
		waited = make([][]time.Duration, c.sessions) // and how long that step waited (soakStall)
	)
	total := c.steps * c.sessions
	if next != nil {
		for i := range c.kills {
			// At the latest when every session waits at its last step.
			killAt = append(killAt, min(total*(2*i+1)/(2*c.kills+1)+total/(4*c.kills+2), total-c.sessions))
		}
	}
	// killsDone is closed once every kill is carried out, or one failed: a
	// session's last step waits for it, so that every kill has answers
	// after it however long the kills took.
	killsDone := make(chan struct{})
	var killsOver sync.Once
	if len(killAt) == 0 {
		killsOver.Do(func() { close(killsDone) })
	}
	var (
		killErr error
		killing bool // a session is carrying out the next kill
	)
	owner := func() *soakProc {
		id := ""
		if devs, err := cl.Devices(ctx); err == nil {
			for _, d := range devs {
				if d.Name == device && d.State == "serving" {
					id = d.Worker
				}
			}
		}
		for _, p := range procs() {
			p.mu.Lock()
			dead := p.dead // the registry names it until its lease runs out
			p.mu.Unlock()
			if p.id == id && !dead {
				return p
			}
		}
		return nil
	}
	// kill SIGKILLs the device's owner once it has committed a checkpoint
	// since it took the device (the kill tries the restore of one; at 8
	// GiB the first takes seconds), and starts the next standby. The
	// session that reached the kill point waits for it; the others go on.
	kill := func() error {
		var p *soakProc
		for {
			if p = owner(); p != nil {
				p.mu.Lock()
				ckpts := p.ckpts
				p.mu.Unlock()
				if ckpts > 0 {
					break
				}
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: kill %d: no owner of %s with a committed checkpoint: %w", name, len(kills)+1, device, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		mu.Lock()
		kills = append(kills, time.Now())
		done := done
		mu.Unlock()
		p.mu.Lock()
		p.dead = true
		p.mu.Unlock()
		progress("%s: killed %s after %d of %d steps", name, p.id, done, total)
		np, err := next()
		if err != nil {
			return err
		}
		wmu.Lock()
		ws = append(ws, np)
		wmu.Unlock()
		go func() { // its baseline, standing by
			for range 100 {
				if _, err := np.scrape(); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			np.mu.Lock()
			np.mem.Baseline = rss(np.cmd.Process.Pid)
			np.mu.Unlock()
		}()
		return nil
	}
	stepDone := func(sess int, start, at time.Time) {
		mu.Lock()
		// An answer counts for the kills it came after.
		for len(answer[sess]) < len(kills) && at.After(kills[len(answer[sess])]) {
			k := kills[len(answer[sess])]
			answer[sess] = append(answer[sess], at)
			waited[sess] = append(waited[sess], at.Sub(later(k, start)))
		}
		done++
		// Carry out every kill that is due, here: the other sessions
		// may all be waiting for them at their last steps.
		for killErr == nil && !killing && len(killAt) > len(kills) && done >= killAt[len(kills)] {
			killing = true
			mu.Unlock()
			err := kill()
			mu.Lock()
			killing = false
			if err != nil && killErr == nil {
				killErr = err
			}
		}
		if killErr != nil || len(kills) == len(killAt) {
			killsOver.Do(func() { close(killsDone) })
		}
		mu.Unlock()
	}

	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, c.sessions)
	probes := make([][]soakProbe, c.sessions)
	for i := range sessions {
		wg.Go(func() {
			s := sessions[i]
			one := s.Full(nil, 1)
			tick := time.Now()
			for step := range c.steps {
				if step == c.steps-1 {
					select {
					case <-killsDone:
					case <-ctx.Done():
						errs[i] = fmt.Errorf("session %d: waiting for the kills: %w", i, ctx.Err())
						return
					}
				}
				// Rewrite one tensor and read its sum back.
				start := time.Now()
				j := step % k
				x := held[i][j].Add(one)
				held[i][j].Free()
				held[i][j] = x
				v, err := x.Sum().Float32s(ctx)
				if err != nil {
					errs[i] = fmt.Errorf("session %d step %d: %w", i, step, err)
					return
				}
				ph.reads[i] = append(ph.reads[i], math.Float32bits(v[0]))
				stepDone(i, start, time.Now())
				for p := range c.probes {
					at := time.Now()
					v, err := s.Full([]int{4}, float64(step*c.probes+p)).Float32s(ctx)
					if err != nil {
						errs[i] = fmt.Errorf("session %d step %d probe %d: %w", i, step, p, err)
						return
					}
					probes[i] = append(probes[i], soakProbe{at, time.Since(at)})
					ph.reads[i] = append(ph.reads[i], math.Float32bits(v[0]))
				}
				tick = tick.Add(c.every)
				if d := time.Until(tick); d > 0 {
					time.Sleep(d)
				}
			}
		})
	}
	wg.Wait()
	ph.Seconds = time.Since(t0).Seconds()
	if err := errors.Join(append(errs, killErr)...); err != nil {
		close(stopMon)
		mon.Wait()
		return nil, err
	}
	for i := range probes {
		ph.probes = append(ph.probes, probes[i]...)
	}
	for ki, at := range kills {
		var per, wait []float64
		for i := range answer {
			if ki < len(answer[i]) {
				per = append(per, answer[i][ki].Sub(at).Seconds()*1e3)
				wait = append(wait, waited[i][ki].Seconds()*1e3)
			}
		}
		slices.Sort(per)
		slices.Sort(wait)
		if len(per) > 0 {
			ph.Stalls = append(ph.Stalls, soakStall{First: per[0], Median: per[len(per)/2], Last: per[len(per)-1],
				WaitFirst: wait[0], WaitMedian: wait[len(wait)/2], WaitLast: wait[len(wait)-1]})
			ph.stallWindows = append(ph.stallWindows, [2]time.Time{at, at.Add(time.Duration(per[len(per)-1] * 1e6))})
		}
	}
	ph.HeldBytes = int64(k) * int64(c.sessions) * c.tensor
	progress("%s: %d steps in %.1f s; freeing the sessions", name, total, ph.Seconds)

	// Free every session, then let the worker idle.
	ph.freeing.Store(true)
	for _, s := range sessions {
		if err := s.Close(ctx); err != nil {
			close(stopMon)
			mon.Wait()
			return nil, err
		}
	}
	time.Sleep(c.settle)
	close(stopMon)
	mon.Wait()
	for _, p := range procs() {
		p.mu.Lock()
		if !p.dead {
			p.mem.After = rss(p.cmd.Process.Pid)
		}
		if p.mem.PeakHeld > 0 {
			ph.Workers = append(ph.Workers, p.mem)
		}
		ph.Checkpoints += int(p.ckpts)
		ph.CkptSecond += p.ckptSec
		p.mu.Unlock()
	}
	return ph, nil
}

// scrape reads the worker's metrics: the device's tensor bytes and its
// checkpoint counters.
func (p *soakProc) scrape() (map[string]float64, error) {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get(p.metrics)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "jetfabric_device_") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}

// sample takes one sample of the process: its resident memory beside the
// tensor bytes it holds, and any checkpoint committed since the last one.
func (p *soakProc) sample(steady int64, ph *soakPhase) {
	p.mu.Lock()
	dead := p.dead
	p.mu.Unlock()
	if dead {
		return
	}
	m, err := p.scrape()
	if err != nil {
		return
	}
	r := rss(p.cmd.Process.Pid)
	held := int64(m["jetfabric_device_tensor_bytes"])
	p.mu.Lock()
	defer p.mu.Unlock()
	mem := &p.mem
	mem.PeakHeld = max(mem.PeakHeld, held)
	mem.PeakRSS = max(mem.PeakRSS, r)
	if held >= steady && r > 0 && !ph.freeing.Load() {
		mem.Samples++
		if ratio := float64(r) / float64(held); ratio > mem.MaxRatio {
			mem.MaxRatio, mem.RatioRSS, mem.RatioHeld = ratio, r, held
		}
	}
	if m["jetfabric_device_restore_pending_bytes"] > 0 {
		ph.addRestoring(time.Now())
	}
	if n := m["jetfabric_device_checkpoints_total"]; n > p.ckpts {
		end := time.Unix(0, int64(m["jetfabric_device_checkpoint_timestamp_seconds"]*1e9))
		dur := time.Duration(m["jetfabric_device_checkpoint_last_seconds"] * 1e9)
		ph.addWindow(end.Add(-dur), end)
		p.ckpts = n
		p.ckptSec = m["jetfabric_device_checkpoint_seconds_total"]
	}
}

var soakWindowMu sync.Mutex

// addRestoring notes that a restore was reading tensors at t.
func (ph *soakPhase) addRestoring(t time.Time) {
	soakWindowMu.Lock()
	defer soakWindowMu.Unlock()
	if n := len(ph.restoring); n > 0 && t.Sub(ph.restoring[n-1][1]) < time.Second {
		ph.restoring[n-1][1] = t
		return
	}
	ph.restoring = append(ph.restoring, [2]time.Time{t.Add(-200 * time.Millisecond), t})
}

func (ph *soakPhase) addWindow(from, to time.Time) {
	soakWindowMu.Lock()
	defer soakWindowMu.Unlock()
	ph.windows = append(ph.windows, [2]time.Time{from, to})
}

// rss is a process's resident memory from /proc (0 where unknown).
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// soakReport compares the soak with the reference and prints the figures.
func soakReport(c soakConfig, ref, soak *soakPhase, asJSON bool, stdout io.Writer) error {
	mismatch := 0
	first := ""
	for i := range ref.reads {
		for j := range ref.reads[i] {
			if j >= len(soak.reads[i]) || soak.reads[i][j] != ref.reads[i][j] {
				if mismatch == 0 {
					first = fmt.Sprintf("session %d read %d", i, j)
				}
				mismatch++
			}
		}
	}
	reads := 0
	for i := range ref.reads {
		reads += len(ref.reads[i])
	}
	// Probes of the soak that overlap a committed checkpoint and no
	// recovery (from a kill to the last session's first answer, and while
	// a restore still reads tensors), beside the reference's (no
	// checkpoints at all).
	inRecovery := func(p soakProbe) bool {
		end := p.at.Add(p.d)
		for _, w := range append(slices.Clone(soak.stallWindows), soak.restoring...) {
			if p.at.Before(w[1]) && end.After(w[0]) {
				return true
			}
		}
		return false
	}
	var during, outside, base, recovery []time.Duration
	for _, p := range soak.probes {
		if inRecovery(p) {
			recovery = append(recovery, p.d)
			continue
		}
		end := p.at.Add(p.d)
		in := false
		for _, w := range soak.windows {
			if p.at.Before(w[1]) && end.After(w[0]) {
				in = true
				break
			}
		}
		if in {
			during = append(during, p.d)
		} else {
			outside = append(outside, p.d)
		}
	}
	for _, p := range ref.probes {
		base = append(base, p.d)
	}
	ms := func(l []time.Duration, q float64) millis {
		if len(l) == 0 {
			return millis(math.NaN())
		}
		l = slices.Clone(l)
		slices.Sort(l)
		return millis(l[min(len(l)-1, int(q*float64(len(l))))].Microseconds()) / 1e3
	}
	type report struct {
		Machine        string       `json:"machine"`
		Sessions       int          `json:"sessions"`
		HeldBytes      int64        `json:"held_bytes"`
		TensorBytes    int64        `json:"tensor_bytes"`
		Reads          int          `json:"reads"`
		Mismatches     int          `json:"mismatched_reads"`
		P99Base        millis       `json:"p99_ms_no_checkpoints"`
		P99During      millis       `json:"p99_ms_during_checkpoints"`
		P99Outside     millis       `json:"p99_ms_soak_outside_checkpoints"`
		P50Base        millis       `json:"p50_ms_no_checkpoints"`
		P50During      millis       `json:"p50_ms_during_checkpoints"`
		P99Recovery    millis       `json:"p99_ms_recovering"`
		ProbesRecovery int          `json:"probes_recovering"`
		ProbesDuring   int          `json:"probes_during_checkpoints"`
		CacheBytes     int64        `json:"configured_cache_bytes"`
		Phases         []*soakPhase `json:"phases"`
	}
	r := report{
		Machine:  fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
		Sessions: c.sessions, HeldBytes: soak.HeldBytes, TensorBytes: c.tensor, Reads: reads, Mismatches: mismatch,
		P99Base: ms(base, 0.99), P99During: ms(during, 0.99), P99Outside: ms(outside, 0.99),
		P50Base: ms(base, 0.5), P50During: ms(during, 0.5), ProbesDuring: len(during),
		P99Recovery: ms(recovery, 0.99), ProbesRecovery: len(recovery),
		CacheBytes: cpu.DefaultCache, Phases: []*soakPhase{ref, soak},
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		gib := func(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }
		mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
		fmt.Fprintf(stdout, "state soak: %d sessions holding %s in tensors of %s; %s\n", c.sessions, gib(soak.HeldBytes), mib(c.tensor), r.Machine)
		fmt.Fprintf(stdout, "reads identical to the run without kills: %d of %d", reads-mismatch, reads)
		if mismatch > 0 {
			fmt.Fprintf(stdout, " (first difference: %s)", first)
		}
		fmt.Fprintln(stdout)
		fmt.Fprintf(stdout, "read p99: %.1f ms with no checkpoints; %.1f ms during checkpoints (%d reads, %d checkpoints); %.1f ms otherwise in the soak (+%.1f ms during; target +50 ms)\n",
			r.P99Base, r.P99During, len(during), soak.Checkpoints, r.P99Outside, r.P99During-r.P99Base)
		fmt.Fprintf(stdout, "read p50: %.2f ms with no checkpoints; %.2f ms during checkpoints\n", r.P50Base, r.P50During)
		fmt.Fprintf(stdout, "read p99 while recovering (a kill to every session's next answer, and while a restore still read tensors): %.1f ms (%d reads, left out above)\n", r.P99Recovery, len(recovery))
		for i, s := range soak.Stalls {
			fmt.Fprintf(stdout, "kill %d: first session answered after %.0f ms, median session %.0f ms, last %.0f ms; their steps waited %.0f / %.0f / %.0f ms (from the later of the kill and the step's start; target < 2 s)\n",
				i+1, s.First, s.Median, s.Last, s.WaitFirst, s.WaitMedian, s.WaitLast)
		}
		for _, ph := range []*soakPhase{ref, soak} {
			fmt.Fprintf(stdout, "%s: %.0f s\n", ph.Name, ph.Seconds)
			for _, m := range ph.Workers {
				after := "killed"
				if m.After >= 0 {
					after = fmt.Sprintf("%s after the sessions were freed (baseline %s + cache %s: %.2fx of baseline+cache)", mib(m.After), mib(m.Baseline), mib(cpu.DefaultCache), float64(m.After)/float64(m.Baseline+cpu.DefaultCache))
				}
				fmt.Fprintf(stdout, "  worker %s: RSS at most %.3fx held in steady state (%s at %s held; %d samples), peak RSS %s, peak held %s; %s\n",
					m.ID, m.MaxRatio, mib(m.RatioRSS), mib(m.RatioHeld), m.Samples, mib(m.PeakRSS), mib(m.PeakHeld), after)
			}
		}
	}
	if mismatch > 0 {
		return fmt.Errorf("soak: %d of %d reads differ from the run without kills (first: %s)", mismatch, reads, first)
	}
	return nil
}

// millis is a latency in milliseconds; NaN (no reads to take it from)
// is null in JSON.
type millis float64

func (m millis) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(m)) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(m), 'f', 3, 64), nil
}

// parseSize reads a size in bytes with an optional unit (KiB, MiB, GiB,
// TiB; KB, MB, GB, TB).
func parseSize(v string) (int64, error) {
	if strings.HasSuffix(strings.TrimSpace(v), "%") {
		return 0, fmt.Errorf("%q: want a size such as 3GiB", v)
	}
	n, _, err := parseBudget(v)
	if err != nil {
		return 0, fmt.Errorf("%q: want a size such as 3GiB", v)
	}
	return n, nil
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
