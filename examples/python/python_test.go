// Package python_test runs the standard-library Python client in this
// directory against a real fabric: a broker and a CPU worker.
package python_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// startFabric runs a broker and a worker serving cpu-0 and returns the
// broker's client URL.
func startFabric(t *testing.T, edit ...func(*broker.Config)) string {
	t.Helper()
	b := brokertest.Run(t, edit...)
	workertest.Run(t, b, workertest.CPUs(1))
	return b.ClientURL()
}

// python runs the client with args and returns its combined output and
// exit code.
func python(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return python3(t, append([]string{"jetfabric_client.py"}, args...)...)
}

// python3 runs python3 with args in this directory.
func python3(t *testing.T, args ...string) (string, int) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, args...).CombinedOutput()
	t.Logf("python3 %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("python3: %v", err)
		}
		return string(out), ee.ExitCode()
	}
	return string(out), 0
}

func TestPythonClient(t *testing.T) {
	url := startFabric(t)
	out, code := python(t, "--url", url)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"device cpu-0", "matches Python", "unknown_op", "all checks passed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestPythonClientFailures(t *testing.T) {
	url := startFabric(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"device not registered", []string{"--url", url, "--device", "gpu-9"}, "device gpu-9 is not live"},
		{"no broker", []string{"--url", "nats://127.0.0.1:1"}, "connect 127.0.0.1:1"},
		{"prefix without a fabric", []string{"--url", url, "--prefix", "other"}, "JetStream STREAM.INFO.KV_OTHER_CTRL: stream not found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, code := python(t, c.args...)
			if code != 1 || !strings.Contains(out, c.want) {
				t.Errorf("exit %d, output %q; want exit 1 and %q", code, out, c.want)
			}
		})
	}
}

// TestPythonRefusals checks that the client reports what JetStream refuses:
// a frame over the stream's message size, and a subject no stream captures.
func TestPythonRefusals(t *testing.T) {
	url := startFabric(t, func(c *broker.Config) { c.Provision.OpsMaxMsgSize = 64 << 10 })
	script := `
import sys, jetfabric_client as j
nc = j.NatsConn(sys.argv[1])
f = j.Fabric(nc)
for name, fab, size in [("too large", f, 100000), ("no stream", j.Fabric(nc, "nostream"), 10)]:
    try:
        fab.publish_frame("cpu-0", "s1", {"v": 1, "ops": [{"op": "upload", "out": [1], "dtype": "u8", "shape": [size], "values": [0] * size}]}, "_INBOX_fabric.s1")
        print(name, "accepted")
    except j.FabricError as e:
        print(name, "refused:", e)
`
	out, code := python3(t, "-c", script, url)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"too large refused: frame to fabric.ops.cpu-0.s1 refused by JetStream: message size exceeds maximum allowed",
		"no stream refused: no responders on nostream.ops.cpu-0.s1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}
