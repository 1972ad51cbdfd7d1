// Package python_test runs the Python package's own tests (python/tests,
// stdlib unittest) against a real fabric: a broker and a worker serving
// cpu-0 and cpu-1 and taking cpu jobs. It picks python3 from
// JETFABRIC_PYTHON, else the first python3 (on PATH, then /usr/bin) that
// has numpy, else the first there is; without one it skips.
package python_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/kernels/cpu"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v")
	cmd.Env = append(os.Environ(), "JETFABRIC_URL="+b.ClientURL(), "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -m unittest: %v\n%s", py, err, out)
	}
	t.Logf("%s", out)
	if !strings.Contains(string(out), "\nOK") {
		t.Fatalf("unittest did not report OK:\n%s", out)
	}
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
