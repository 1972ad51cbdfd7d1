package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
)

// program runs the same ops every time: a chain over 64-element tensors with
// random draws, frees and reads every readEvery steps. It returns the bits
// of every read. after is called after read k.
func program(ctx context.Context, s *client.Session, steps, readEvery int, after func(k int)) ([]uint32, error) {
	s.Seed(7)
	w := s.Uniform([]int{64}, -1, 1)
	x := s.Normal([]int{64}, 0, 1)
	var bits []uint32
	for i := range steps {
		y := x.Mul(w).Add(s.Uniform([]int{64}, -0.1, 0.1))
		x.Free()
		x = y.Tanh()
		y.Free()
		if (i+1)%readEvery == 0 {
			v, err := x.Sum().Float32s(ctx)
			if err != nil {
				return bits, fmt.Errorf("read %d: %w", len(bits), err)
			}
			bits = append(bits, math.Float32bits(v[0]))
			if after != nil {
				after(len(bits))
			}
		}
	}
	return bits, nil
}

// workers is a set of worker processes serving cpu-0, by id.
type workers struct {
	t    *testing.T
	url  string
	args []string
	mu   sync.Mutex
	proc map[string]*exec.Cmd
	out  map[string]*output
	n    int
}

func (ws *workers) start() string {
	ws.mu.Lock()
	ws.n++
	id := fmt.Sprintf("w%d", ws.n)
	ws.mu.Unlock()
	cmd, out := spawn(ws.t, append([]string{"worker", "--url", ws.url, "--devices", "cpu-0", "--id", id}, ws.args...)...)
	ws.mu.Lock()
	ws.proc[id], ws.out[id] = cmd, out
	ws.mu.Unlock()
	return id
}

// owner is the worker the registry names for cpu-0.
func (ws *workers) owner(c *client.Client) string {
	devs, err := c.Devices(context.Background())
	if err != nil {
		return ""
	}
	for _, d := range devs {
		if d.Name == "cpu-0" && d.State == "serving" {
			return d.Worker
		}
	}
	return ""
}

func (ws *workers) logs() string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var b strings.Builder
	for id, out := range ws.out {
		fmt.Fprintf(&b, "--- %s:\n%s\n", id, out.String())
	}
	return b.String()
}

// TestKilledWorkerLosesNothing: a session runs 100,000 ops with reads along
// the way; its worker is SIGKILLed at random points three times; a standby
// takes over each time; every read returns the bits of a run with no kill.
func TestKilledWorkerLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker processes; skipped in -short")
	}
	b := brokertest.Run(t)
	ws := &workers{t: t, url: b.ClientURL(), proc: map[string]*exec.Cmd{}, out: map[string]*output{},
		args: []string{"--lease-ttl", "500ms", "--checkpoint-interval", "300ms"}}
	ws.start()
	waitDevice(t, b.ClientURL(), "cpu-0")
	ws.start() // standby
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const steps, readEvery = 16667, 100 // 6 ops a step: 100,002 ops, 166 reads
	clean, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	want, err := program(ctx, clean, steps, readEvery, nil)
	if err != nil {
		t.Fatal(err)
	}
	clean.Close(ctx)

	// Kill the owner after three random reads, starting a new standby each time.
	kills := map[int]bool{}
	for len(kills) < 3 {
		kills[10+rand.IntN(140)] = true
	}
	var killed []string
	var failovers []time.Duration
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	var killedAt time.Time
	got, err := program(ctx, s, steps, readEvery, func(k int) {
		if !killedAt.IsZero() {
			failovers = append(failovers, time.Since(killedAt))
			killedAt = time.Time{}
		}
		if !kills[k] {
			return
		}
		id := ws.owner(c)
		ws.mu.Lock()
		p := ws.proc[id]
		ws.mu.Unlock()
		if p == nil {
			t.Errorf("read %d: no owner process for %q", k, id)
			return
		}
		_ = p.Process.Signal(syscall.SIGKILL)
		killedAt = time.Now()
		killed = append(killed, id)
		ws.start()
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, ws.logs())
	}
	// The lease may move on its own before the first kill when a loaded
	// machine misses a renewal, so the first owner killed need not be the
	// first worker started; each kill must still take a distinct owner.
	if len(killed) != 3 || killed[0] == killed[1] || killed[1] == killed[2] || killed[0] == killed[2] {
		t.Fatalf("killed %v, want 3 distinct owners", killed)
	}
	if len(got) != len(want) {
		t.Fatalf("%d reads, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("read %d: bits %08x, the run without kills read %08x\n%s", i, got[i], want[i], ws.logs())
		}
	}
	t.Logf("killed %v; kill to next answered read: %v", killed, failovers)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPausedWorkerStepsDown: a worker paused past its lease is replaced; when
// it resumes its writes are refused and it steps down.
func TestPausedWorkerStepsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses worker processes; skipped in -short")
	}
	b := brokertest.Run(t)
	ws := &workers{t: t, url: b.ClientURL(), proc: map[string]*exec.Cmd{}, out: map[string]*output{},
		// A TTL long enough that a loaded machine does not move the lease
		// on its own while the test watches who holds it.
		args: []string{"--lease-ttl", "2s", "--checkpoint-interval", "200ms"}}
	first := ws.start()
	waitDevice(t, b.ClientURL(), "cpu-0")
	second := ws.start()
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Arange(0, 8, 1)
	if v, err := x.Sum().Float32s(ctx); err != nil || v[0] != 28 {
		t.Fatalf("before the pause: %v %v", v, err)
	}
	p := ws.proc[first]
	_ = p.Process.Signal(syscall.SIGSTOP)
	// The standby takes over; the session carries on.
	y := x.Mul(x)
	if v, err := y.Sum().Float32s(ctx); err != nil || v[0] != 140 {
		t.Fatalf("after the takeover: %v %v\n%s", v, err, ws.logs())
	}
	ownerIs := func(want string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for o := ws.owner(c); o != want; o = ws.owner(c) {
			if time.Now().After(deadline) {
				t.Fatalf("owner %q, want %s\n%s", o, want, ws.logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ownerIs(second)
	_ = p.Process.Signal(syscall.SIGCONT)
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(ws.out[first].String(), "lease lost") {
		if time.Now().After(deadline) {
			t.Fatalf("the resumed worker did not step down:\n%s", ws.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its writes were refused: a second on, the registry and the data are
	// still the successor's.
	time.Sleep(time.Second)
	ownerIs(second)
	if v, err := y.Add(x).Sum().Float32s(ctx); err != nil || v[0] != 168 {
		t.Fatalf("after the old worker resumed: %v %v\n%s", v, err, ws.logs())
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestJobsSurviveAKill: 1,000 jobs across 3 worker processes, one killed
// mid-way; every job completes, once, with the right output.
func TestJobsSurviveAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker processes; skipped in -short")
	}
	b := brokertest.Run(t)
	var procs []*exec.Cmd
	var outs []*output
	for i := range 3 {
		p, out := spawn(t, "worker", "--url", b.ClientURL(), "--cpus", "0", "--jobs", "cpu", "--job-ack-wait", "1s", "--id", fmt.Sprintf("j%d", i))
		procs, outs = append(procs, p), append(outs, out)
	}
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 1000
	ids := make([]string, n)
	for k := range n {
		j := c.NewJob()
		x := j.FromFloat32([]int{4}, []float32{float32(k), 1, 2, 3})
		ids[k], err = c.Submit(ctx, "cpu", j, x.Mul(j.Full(nil, 2)).Sum())
		if err != nil {
			t.Fatal(err)
		}
	}
	// Kill one worker once a third of the jobs are done.
	if _, err := c.Wait(ctx, ids[:n/3]...); err != nil {
		t.Fatal(err)
	}
	_ = procs[0].Process.Signal(syscall.SIGKILL)
	res, err := c.Wait(ctx, ids...)
	if err != nil {
		t.Fatalf("%v\n%s\n%s", err, outs[1].String(), outs[2].String())
	}
	by := map[string]int{}
	redelivered := 0
	for k, r := range res {
		if r.ID != ids[k] {
			t.Fatalf("result %d is of job %s", k, r.ID)
		}
		d, err := r.Output(ctx, 0)
		if err != nil {
			t.Fatalf("job %d: %v", k, err)
		}
		if got, want := math.Float32frombits(uint32(d.Bytes[0])|uint32(d.Bytes[1])<<8|uint32(d.Bytes[2])<<16|uint32(d.Bytes[3])<<24), float32(2*(k+6)); got != want {
			t.Fatalf("job %d: %v, want %v", k, got, want)
		}
		by[r.Worker]++
		if r.Attempt > 1 {
			redelivered++
		}
	}
	if by["j1"] == 0 || by["j2"] == 0 {
		t.Errorf("jobs by worker %v: the survivors took none", by)
	}
	t.Logf("1000 jobs by worker %v, %d completed on a second delivery", by, redelivered)
}

// TestAdoptedDeviceCarriesOn: identical workers claim their slots and
// adopt each other's; one is SIGKILLed mid-stream and its session carries
// on, on a survivor, with the same bits.
func TestAdoptedDeviceCarriesOn(t *testing.T) {
	if testing.Short() {
		t.Skip("kills worker processes; skipped in -short")
	}
	b := brokertest.Run(t)
	args := []string{"worker", "--url", b.ClientURL(), "--claim", "cpu", "--adopt", "--lease-ttl", "500ms", "--checkpoint-interval", "300ms"}
	first, out1 := spawn(t, append(args, "--id", "a1")...)
	waitDevice(t, b.ClientURL(), "cpu-0")
	_, out2 := spawn(t, append(args, "--id", "a2")...)
	waitDevice(t, b.ClientURL(), "cpu-1")
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var device string
	for _, d := range mustDevices(t, c) {
		if d.Worker == "a1" {
			device = d.Name
		}
	}
	clean, err := c.Open(ctx, device)
	if err != nil {
		t.Fatal(err)
	}
	want, err := program(ctx, clean, 3000, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	clean.Close(ctx)
	s, err := c.Open(ctx, device)
	if err != nil {
		t.Fatal(err)
	}
	got, err := program(ctx, s, 3000, 100, func(k int) {
		if k == 10 {
			_ = first.Process.Signal(syscall.SIGKILL)
		}
	})
	if err != nil {
		t.Fatalf("%v\n--- a1:\n%s\n--- a2:\n%s", err, out1.String(), out2.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("read %d differs after the adoption", i)
		}
	}
	if !strings.Contains(out2.String(), device+": adopting") {
		t.Fatalf("a2 did not adopt %s:\n%s", device, out2.String())
	}
	for _, d := range mustDevices(t, c) {
		if d.Name == device && d.Worker != "a2" {
			t.Errorf("%s is served by %q, want a2", device, d.Worker)
		}
	}
}

func mustDevices(t *testing.T, c *client.Client) []client.Device {
	t.Helper()
	devs, err := c.Devices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return devs
}
