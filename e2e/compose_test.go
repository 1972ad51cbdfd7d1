// Package e2e runs jetfabric in containers with docker compose: the image
// that `make images` builds, the repository's docker-compose.yml, a compose
// project of its own per test, always removed with its volumes afterwards.
//
// The tests run only with JETFABRIC_E2E=1 (make test-e2e); plain `go test
// ./...` skips them. They need docker, docker compose (the v2 plugin or
// docker-compose v1), the image (JETFABRIC_IMAGE, default jetfabric:latest)
// and the static binary bin/jetfabric on the host (JETFABRIC_BIN), which
// the tests run as the client.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

const skipMsg = "container tests: set JETFABRIC_E2E=1 to run them (make test-e2e builds the image first; needs docker and docker compose)"

var (
	root    string   // repository root
	compose []string // "docker compose" or "docker-compose"
	image   string
	jfBin   string // the jetfabric binary on the host
)

func TestMain(m *testing.M) {
	if os.Getenv("JETFABRIC_E2E") == "1" {
		if err := setup(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func setup() error {
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root = filepath.Dir(wd)
	if err := exec.Command("docker", "compose", "version").Run(); err == nil {
		compose = []string{"docker", "compose"}
	} else if p, err := exec.LookPath("docker-compose"); err == nil {
		compose = []string{p}
	} else {
		return fmt.Errorf("neither `docker compose` nor docker-compose is installed")
	}
	image = envOr("JETFABRIC_IMAGE", "jetfabric:latest")
	if out, err := exec.Command("docker", "image", "inspect", "--format", "{{.Id}}", image).CombinedOutput(); err != nil {
		return fmt.Errorf("image %s: %v: %s(build it with make images)", image, err, out)
	}
	jfBin = envOr("JETFABRIC_BIN", filepath.Join(root, "bin", "jetfabric"))
	if _, err := os.Stat(jfBin); err != nil {
		return fmt.Errorf("client binary: %v (make build writes it)", err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func needE2E(t testing.TB) {
	t.Helper()
	if os.Getenv("JETFABRIC_E2E") != "1" {
		t.Skip(skipMsg)
	}
}

// project is one compose project: its own containers, network, volumes
// and host ports.
type project struct {
	t     testing.TB
	name  string
	ports map[string]int // env var -> host port
	extra []string       // more environment for compose
}

// newProject names a fresh project and removes everything it creates when
// the test ends, failed or not.
func newProject(t testing.TB) *project {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	p := &project{t: t, name: "jetfabric-e2e-" + hex.EncodeToString(b[:]), ports: map[string]int{}}
	for _, env := range []string{"JETFABRIC_PORT", "JETFABRIC_HTTP_PORT", "JETFABRIC_METRICS_PORT",
		"JETFABRIC_N1_PORT", "JETFABRIC_N2_PORT", "JETFABRIC_N3_PORT",
		"JETFABRIC_N1_HTTP_PORT", "JETFABRIC_N2_HTTP_PORT", "JETFABRIC_N3_HTTP_PORT",
		"JETFABRIC_N1_METRICS_PORT", "JETFABRIC_N2_METRICS_PORT", "JETFABRIC_N3_METRICS_PORT",
		"JETFABRIC_TLS_PORT", "JETFABRIC_TLS_HTTP_PORT", "JETFABRIC_TLS_METRICS_PORT",
		"JETFABRIC_TENANTS_PORT", "JETFABRIC_TENANTS_HTTP_PORT", "JETFABRIC_TENANTS_METRICS_PORT"} {
		p.ports[env] = freePort(t)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := p.composeOut("--profile", "cluster", "--profile", "tls", "--profile", "tenants", "logs", "--no-color", "--tail", "40")
			t.Logf("logs of %s:\n%s", p.name, out)
		}
		if out, err := p.composeOut("--profile", "cluster", "--profile", "tls", "--profile", "tenants", "down", "-v", "--remove-orphans", "-t", "5"); err != nil {
			t.Errorf("compose down %s: %v\n%s", p.name, err, out)
		}
	})
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (p *project) env() []string {
	env := append(os.Environ(), "JETFABRIC_IMAGE="+image, "JETFABRIC_WORKER_CPUS=1")
	env = append(env, p.extra...)
	for k, v := range p.ports {
		env = append(env, fmt.Sprintf("%s=%d", k, v))
	}
	return env
}

func (p *project) composeOut(args ...string) (string, error) {
	full := append(append(compose[1:len(compose):len(compose)], "-p", p.name, "-f", filepath.Join(root, "docker-compose.yml")), args...)
	cmd := exec.Command(compose[0], full...)
	cmd.Dir = root
	cmd.Env = p.env()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// compose runs a compose command and fails the test if it fails.
func (p *project) compose(args ...string) string {
	p.t.Helper()
	out, err := p.composeOut(args...)
	if err != nil {
		p.t.Fatalf("compose %v: %v\n%s", args, err, out)
	}
	return out
}

// containers lists the container ids of a service.
func (p *project) containers(service string) []string {
	p.t.Helper()
	return strings.Fields(p.compose("ps", "-q", service))
}

// url is the client URL of the single-broker deployment.
func (p *project) url() string {
	return fmt.Sprintf("nats://127.0.0.1:%d", p.ports["JETFABRIC_PORT"])
}

// clusterURL lists the three cluster nodes.
func (p *project) clusterURL() string {
	return fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d",
		p.ports["JETFABRIC_N1_PORT"], p.ports["JETFABRIC_N2_PORT"], p.ports["JETFABRIC_N3_PORT"])
}

// jetfabric runs the host binary.
func jetfabric(t testing.TB, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, jfBin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// waitLive waits until at least n devices are live, and returns them.
func waitLive(t testing.TB, c *client.Client, n int, within time.Duration) []client.Device {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		devs, err := c.Devices(ctx)
		cancel()
		var live []client.Device
		for _, d := range devs {
			if client.Live(d, time.Now()) {
				live = append(live, d)
			}
		}
		if len(live) >= n {
			return live
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d live devices after %v, want %d (%v): %+v", len(live), within, n, err, devs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// connect dials url, retrying while the published port comes up.
func connect(t testing.TB, url string) *client.Client {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := client.Connect(url)
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestComposeDemo: the default deployment (a broker and one worker) comes
// up healthy, and the demo passes against it from the host.
func TestComposeDemo(t *testing.T) {
	needE2E(t)
	p := newProject(t)
	start := time.Now()
	p.compose("up", "-d")
	c := connect(t, p.url())
	waitLive(t, c, 1, time.Minute)
	t.Logf("broker healthy and a worker live in %v", time.Since(start).Round(time.Millisecond))
	out, err := jetfabric(t, 3*time.Minute, "demo", "--url", p.url(), "--chain", "2000")
	if err != nil || !strings.Contains(out, "demo passed") {
		t.Fatalf("demo against %s: %v\n%s", p.url(), err, out)
	}
	t.Logf("demo:\n%s", out)
	// The broker reports healthy through the image's own health check.
	if out := p.compose("ps"); !strings.Contains(out, "healthy") {
		t.Errorf("broker not reported healthy:\n%s", out)
	}
	// The demo ran a job through the queue: the worker takes jobs.
	if !strings.Contains(out, "through FABRIC_JOBS: taken by worker") {
		t.Errorf("the demo ran no job:\n%s", out)
	}
	// /metrics of the broker on its published loopback port, and of the
	// worker on the port Docker picked, job-queue series included.
	broker := scrapeMetrics(t, fmt.Sprintf("127.0.0.1:%d", p.ports["JETFABRIC_METRICS_PORT"]))
	for _, want := range []string{`jetfabric_stream_messages{stream="FABRIC_JOBS"}`, "jetfabric_broker_connections{"} {
		if !strings.Contains(broker, want) {
			t.Errorf("broker metrics lack %s", want)
		}
	}
	addr := strings.TrimSpace(p.compose("port", "worker", "9090"))
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("worker metrics published on %q, want 127.0.0.1:PORT", addr)
	}
	worker := scrapeMetrics(t, addr)
	for _, want := range []string{`jetfabric_jobs_total{kind="cpu",outcome="ok"} 1`, `jetfabric_device_checkpoints_total{device="cpu-0"}`} {
		if !strings.Contains(worker, want) {
			t.Errorf("worker metrics lack %s:\n%s", want, worker)
		}
	}
}

// scrapeMetrics GETs http://addr/metrics, retrying while the port comes up.
func scrapeMetrics(t testing.TB, addr string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			err = fmt.Errorf("%s: %v", resp.Status, rerr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET http://%s/metrics: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stream runs a chain of dependent adds on session s, checking the value
// every few ops, until stop closes or an error. It returns the ops applied
// and checked, and the error that ended it.
func stream(s *client.Session, stop <-chan struct{}, progress func(int)) (int, error) {
	one := s.Full([]int{1}, 1)
	x := s.Full([]int{1}, 0)
	n := 0
	for {
		for range 20 {
			next := x.Add(one)
			x.Free()
			x = next
			n++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		v, err := x.Float32s(ctx)
		cancel()
		if err != nil {
			return n, err
		}
		if int(v[0]) != n {
			return n, fmt.Errorf("after %d adds the value is %v", n, v[0])
		}
		if progress != nil {
			progress(n)
		}
		select {
		case <-stop:
			return n, nil
		default:
		}
	}
}

// TestComposeScale: three worker replicas claim cpu-0..cpu-2; killing one
// container mid-stream leaves the sessions on the other two untouched, and
// its own session carries on: a surviving replica adopts the device,
// restores its checkpoint and replays its frames.
func TestComposeScale(t *testing.T) {
	needE2E(t)
	p := newProject(t)
	p.compose("up", "-d", "--scale", "worker=3")
	c := connect(t, p.url())
	live := waitLive(t, c, 3, time.Minute)
	out, err := jetfabric(t, 30*time.Second, "devices", "--url", p.url())
	if err != nil || strings.Count(out, "serving") != 3 {
		t.Fatalf("jetfabric devices: %v\n%s", err, out)
	}
	t.Logf("three replicas:\n%s", out)
	hosts := map[string]string{} // device -> container hostname
	for _, d := range live {
		hosts[d.Name] = d.Host
	}
	for _, name := range []string{"cpu-0", "cpu-1", "cpu-2"} {
		if hosts[name] == "" {
			t.Fatalf("%s not live: %+v", name, live)
		}
	}
	if hosts["cpu-0"] == hosts["cpu-1"] || hosts["cpu-1"] == hosts["cpu-2"] || hosts["cpu-0"] == hosts["cpu-2"] {
		t.Fatalf("replicas share devices: %v", hosts)
	}
	// The container serving cpu-1: its hostname is its short id.
	var victim string
	for _, id := range p.containers("worker") {
		if strings.HasPrefix(id, hosts["cpu-1"]) {
			victim = id
		}
	}
	if victim == "" {
		t.Fatalf("no worker container for host %s", hosts["cpu-1"])
	}

	type res struct {
		device string
		n      int
		err    error
	}
	stop := make(chan struct{})
	results := make(chan res, 3)
	started := make(chan struct{}, 3)
	var mu sync.Mutex
	progress := map[string]int{}
	for _, name := range []string{"cpu-0", "cpu-1", "cpu-2"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := c.Open(ctx, name)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			var once bool
			n, err := stream(s, stop, func(n int) {
				mu.Lock()
				progress[name] = n
				mu.Unlock()
				if !once {
					once = true
					started <- struct{}{}
				}
			})
			results <- res{device: name, n: n, err: err}
		}()
	}
	for range 3 {
		select {
		case <-started:
		case r := <-results:
			t.Fatalf("%s ended before the container stopped: %d ops, %v", r.device, r.n, r.err)
		case <-time.After(30 * time.Second):
			t.Fatal("sessions did not start streaming")
		}
	}
	time.Sleep(time.Second)
	killed := time.Now()
	if out, err := exec.Command("docker", "kill", victim).CombinedOutput(); err != nil {
		t.Fatalf("docker kill %s: %v\n%s", victim, err, out)
	}
	mu.Lock()
	atKill := progress["cpu-1"]
	mu.Unlock()
	t.Logf("killed the worker container of cpu-1 (%s) after %d ops on it", victim[:12], atKill)
	// cpu-1's session goes on once a survivor adopted the device.
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		n := progress["cpu-1"]
		mu.Unlock()
		if n > atKill+1000 {
			t.Logf("cpu-1 carried on %v after the kill: %d ops", time.Since(killed).Round(time.Millisecond), n)
			break
		}
		select {
		case r := <-results:
			t.Fatalf("%s ended after the kill: %d ops, %v", r.device, r.n, r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("cpu-1 made no progress in %v after its worker was killed (%d ops)", time.Since(killed), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	for range 3 {
		r := <-results
		if r.err != nil {
			t.Errorf("%s: %d ops, then %v", r.device, r.n, r.err)
		} else {
			t.Logf("%s: %d ops checked, no error", r.device, r.n)
		}
	}
	// The registry shows the three devices live, cpu-1 on another replica.
	deadline = time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		devs, err := c.Devices(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var wrong []string
		for _, d := range devs {
			if !client.Live(d, time.Now()) {
				wrong = append(wrong, fmt.Sprintf("%s: not live (%+v)", d.Name, d))
			}
			if d.Name == "cpu-1" && d.Host == hosts["cpu-1"] {
				wrong = append(wrong, fmt.Sprintf("cpu-1 still names the killed container %s", d.Host))
			}
		}
		if len(wrong) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry after the adoption:\n%s", strings.Join(wrong, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
