// Package python_test runs the Python package's own tests (python/tests,
// stdlib unittest) against a real fabric: a broker and a worker serving
// cpu-0 and cpu-1 and taking cpu jobs, and a second worker serving idle-0,
// whose sessions are freed after a second without frames or heartbeats,
// a device gone-0 whose worker stopped, and a second fabric whose op
// stream refuses frames over 64 KiB; and tests/test_reconnect.py against
// broker and worker processes of the jetfabric binary built here, which it
// stops and starts itself. It picks python3 from
// JETFABRIC_PYTHON, else the first python3 (on PATH, then /usr/bin) that
// has numpy, else the first there is; without one it skips.
package python_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// interpreter returns the python3 to run, and whether it has numpy.
func interpreter(t *testing.T) (string, bool) {
	t.Helper()
	if p := os.Getenv("JETFABRIC_PYTHON"); p != "" {
		return p, exec.Command(p, "-c", "import numpy").Run() == nil
	}
	var found []string
	if p, err := exec.LookPath("python3"); err == nil {
		found = append(found, p)
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		found = append(found, "/usr/bin/python3")
	}
	if len(found) == 0 {
		t.Skip("python3 is not installed: the Python package's tests are skipped")
	}
	for _, p := range found {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			return p, true
		}
	}
	return found[0], false
}

func TestPythonPackage(t *testing.T) {
	py, numpy := interpreter(t)
	if !numpy {
		t.Logf("%s has no numpy: the numpy tests are skipped", py)
	}
	b := brokertest.Run(t)
	workertest.Run(t, b, workertest.CPUs(2), func(c *worker.Config) {
		c.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New()}}
	})
	workertest.Run(t, b, []worker.Device{{Name: "idle-0", Kind: "cpu", Backend: cpu.New()}}, func(c *worker.Config) {
		c.Heartbeat = 100 * time.Millisecond
		c.IdleTimeout = time.Second
	})
	// gone-0 is registered and no worker serves it: its worker stopped.
	stopGone(t, b)
	// A fabric whose op stream stores frames of at most 64 KiB: larger
	// ones are refused (tests/test_fabric.py's TestRefusedFrames).
	small := brokertest.Run(t, func(c *broker.Config) { c.Provision.OpsMaxMsgSize = 64 << 10 })
	workertest.Run(t, small, workertest.CPUs(1))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Env = append(os.Environ(), "JETFABRIC_URL="+b.ClientURL(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1",
		"JETFABRIC_IDLE_DEVICE=idle-0", "JETFABRIC_GONE_DEVICE=gone-0", "JETFABRIC_SMALL_FRAMES_URL="+small.ClientURL(),
		"JETFABRIC_GO_GRAPH="+goGraphName(t, b.ClientURL()),
		"JETFABRIC_RECONNECT_TESTS=0") // TestPythonReconnect runs them
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest: %v\n%s", py, err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "\nOK") {
		t.Fatalf("unittest did not report OK:\n%s", out)
	}
}

// stopGone registers device gone-0 on b with a worker of its own, and stops
// that worker: the registry keeps the entry (stopped), and no worker serves it.
func stopGone(t *testing.T, b *broker.Broker) {
	t.Helper()
	w := workertest.Run(t, b, []worker.Device{{Name: "gone-0", Kind: "cpu", Backend: cpu.New()}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPythonTLS runs python/tests/test_tls.py against a broker that
// requires TLS and verifies client certificates (made by internal/certs,
// as jetfabric certs makes them) with a worker, and a plain broker.
func TestPythonTLS(t *testing.T) {
	py, _ := interpreter(t)
	dir, other := t.TempDir(), t.TempDir()
	f, err := certs.Write(dir, certs.Options{Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Write(other, certs.Options{Hosts: []string{"127.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA, Verify: true}
	})
	workertest.Run(t, b, workertest.CPUs(1))
	plain := brokertest.Run(t)
	// A server that starts TLS before INFO (handshake_first), configured
	// by a nats-server configuration file.
	conf := filepath.Join(t.TempDir(), "first.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("tls {\n cert_file: %q\n key_file: %q\n handshake_first: true\n}\n", f.ServerCert, f.ServerKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	first := brokertest.Run(t, func(c *broker.Config) { c.ConfigFile = conf })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "tests.test_tls", "-v")
	cmd.Env = append(os.Environ(), "JETFABRIC_TLS_URL="+b.ClientURL(), "JETFABRIC_TLS_DIR="+dir, "JETFABRIC_TLS_OTHER_DIR="+other,
		"JETFABRIC_PLAIN_URL="+plain.ClientURL(), "JETFABRIC_TLS_FIRST_URL="+first.ClientURL(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest tests.test_tls: %v\n%s", py, err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "skipped") {
		t.Fatalf("unittest did not report OK with nothing skipped:\n%s", out)
	}
}

// TestPythonReconnect runs python/tests/test_reconnect.py: a Python session
// outlives its broker's restart (the broker a process of the jetfabric
// binary, built here, on a file store), its lost acknowledgements and
// answers, and cut connections; bad URLs and a missing broker fail within
// their deadline. The test starts and restarts the processes itself.
func TestPythonReconnect(t *testing.T) {
	py, _ := interpreter(t)
	bin := buildJetfabric(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", "tests.test_reconnect")
	cmd.Env = append(os.Environ(), "JETFABRIC_BIN="+bin, "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	cmd.Env = slices.DeleteFunc(cmd.Env, func(e string) bool { return strings.HasPrefix(e, "JETFABRIC_RECONNECT_TESTS=") })
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest tests.test_reconnect: %v\n%s", py, err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "skipped") {
		t.Fatalf("the reconnect tests did not all run and pass:\n%s", out)
	}
}

// buildJetfabric builds the jetfabric command into a temporary directory
// and returns its path.
func buildJetfabric(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building the jetfabric binary for the Python reconnect tests needs the go tool on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "jetfabric")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-o", bin, "github.com/jetfabric/jetfabric/cmd/jetfabric")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/jetfabric: %v\n%s", err, out)
	}
	return bin
}

// goGraphName is the name the Go client gives the program that
// tests/test_graphs.py's go_program builds: the Python client must encode
// the same definition to the same bytes.
func goGraphName(t *testing.T, url string) string {
	t.Helper()
	c, err := client.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := c.NewGraph()
	x, b := g.Input("f32", []int{2, 3}), g.Input("f32", []int{3})
	sc := g.Scalar(1)
	f := g.Session().Full([]int{2, 3}, 1)
	if err := g.Bind(f, "value", sc); err != nil {
		t.Fatal(err)
	}
	u := g.Session().Uniform([]int{2, 3}, 0, 0.5)
	def, err := g.Build(x.Mul(f).Add(b).Add(u))
	if err != nil {
		t.Fatal(err)
	}
	return def.Name
}

// TestPipInstall builds and installs the package with pip into a fresh
// virtual environment, offline, and imports it from there.
func TestPipInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	py, _ := interpreter(t)
	if exec.Command(py, "-c", "import venv, ensurepip").Run() != nil {
		t.Skipf("%s cannot make a virtual environment with pip", py)
	}
	env := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{py, "-m", "venv", env},
		{env + "/bin/python", "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check", "."},
		{env + "/bin/python", "-c", "import jetfabric, jetfabric.nats, jetfabric.cbor, jetfabric.objectstore; print(jetfabric.__version__)"},
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestPythonTenant runs the Python package's tenant tests against a fabric
// with tenants: a tenant's creds file signs the nonce in pure Python, and
// the signature matches Go's nkeys.
func TestPythonTenant(t *testing.T) {
	py, _ := interpreter(t)
	dir, other := t.TempDir(), t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	if err := tenant.Init(other); err != nil {
		t.Fatal(err)
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "alice"}, false)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tenant.Add(other, subjects.Default(), codec.Tenant{Name: "alice"}, false)
	if err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	workertest.Run(t, b, workertest.CPUs(1))
	stopGone(t, b)
	// A signature by Go's nkeys, for the Python one to match.
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	nonce := "Xq1-nonce-from-the-server"
	sig, _ := kp.Sign([]byte(nonce))
	vector := string(seed) + ":" + nonce + ":" + base64.RawURLEncoding.EncodeToString(sig)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", "tests.test_tenant")
	cmd.Env = append(os.Environ(), "JETFABRIC_TENANT_URL="+b.ClientURL(), "JETFABRIC_TENANT_CREDS="+creds, "JETFABRIC_GONE_DEVICE=gone-0",
		"JETFABRIC_TENANT_FOREIGN="+foreign, "JETFABRIC_NKEY_VECTOR="+vector, "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest: %v\n%s", py, err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "\nOK") || strings.Contains(string(out), "skipped") {
		t.Fatalf("the tenant tests did not all run and pass:\n%s", out)
	}
}
