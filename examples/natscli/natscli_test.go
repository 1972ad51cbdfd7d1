// Package natscli_test runs the README's nats CLI block, exactly as
// written, against a real fabric: a broker and a CPU worker. It skips when
// no nats binary is on PATH (make tools installs one).
package natscli_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

const (
	marker     = "<!-- natscli:"
	readmeURL  = "nats://127.0.0.1:4222"
	readmePath = "../../README.md"
)

// readmeBlock returns the sh block that follows the marker in the README.
func readmeBlock(t *testing.T) string { return readmeBlockAt(t, marker) }

// readmeBlockAt returns the sh block that follows marker in the README.
func readmeBlockAt(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("%s has no %q marker", readmePath, marker)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatalf("%s: no sh block after the marker", readmePath)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: unterminated sh block", readmePath)
	}
	if !strings.Contains(block, readmeURL) {
		t.Fatalf("the README block does not name %s", readmeURL)
	}
	return block
}

func startFabric(t *testing.T) string {
	t.Helper()
	b := brokertest.Run(t)
	nc, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.DefaultConfig()
	cfg.Devices = []worker.Device{{Name: "cpu-0", Kind: "cpu", Backend: cpu.New()}}
	cfg.Logf = t.Logf
	w, err := worker.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
		nc.Close()
	})
	return b.ClientURL()
}

// runBlock runs the block with bash, the README's URL replaced by url,
// in a scratch HOME so no saved nats context applies.
func runBlock(t *testing.T, block, url string) string { return runBlockIn(t, block, url, "") }

// runBlockIn is runBlock in directory dir ("": the test's).
func runBlockIn(t *testing.T, block, url, dir string) string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not on PATH")
	}
	script := filepath.Join(t.TempDir(), "readme.sh")
	body := "set -euo pipefail\n" + strings.ReplaceAll(block, readmeURL, url)
	if err := os.WriteFile(script, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bash, script)
	cmd.Dir = dir
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "NO_COLOR=1")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("README block against %s:\n%s", url, out)
	if err != nil {
		t.Fatalf("README block: %v", err)
	}
	return string(out)
}

func TestREADMENatsCLI(t *testing.T) {
	if _, err := exec.LookPath("nats"); err != nil {
		t.Skip("nats CLI not on PATH (make tools installs it into $(go env GOPATH)/bin)")
	}
	block := readmeBlock(t)
	url := startFabric(t)
	// Twice: the block closes its session, so it runs again on the same fabric.
	for run := range 2 {
		out := runBlock(t, block, url)
		for _, want := range []string{
			`"values":[7,10,15,22]`,                 // nats sub: the result of the read
			"Stored in Stream: FABRIC_OPS Sequence", // nats pub --jetstream: the stream's ack
			"Information for Stream FABRIC_OPS",     // nats stream info
			"device.cpu-0",                          // nats kv ls
			`"state":"serving"`,                     // nats kv get
			"jetfabric-worker",                      // nats micro list, info
			"fabric.svc.cpu-0.health",               // nats micro info
			`"status":"ok"`,                         // nats req fabric.svc.cpu-0.health
		} {
			if !strings.Contains(out, want) {
				t.Errorf("run %d: output lacks %q", run+1, want)
			}
		}
		if strings.Contains(out, `"errors"`) {
			t.Errorf("run %d: the result reports errors", run+1)
		}
	}
}

// TestREADMENatsCLITenant runs the README's tenant block: the nats CLI
// with a tenant's creds file and inbox prefix runs a session in the
// tenant's namespace and is refused outside it.
func TestREADMENatsCLITenant(t *testing.T) {
	if _, err := exec.LookPath("nats"); err != nil {
		t.Skip("nats CLI not on PATH (make tools installs it into $(go env GOPATH)/bin)")
	}
	block := readmeBlockAt(t, "<!-- natscli-tenant:")
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	if err := tenant.Init(auth); err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Add(auth, subjects.Default(), codec.Tenant{Name: "acme"}, false); err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = auth })
	workertest.Run(t, b, workertest.CPUs(1))
	v0 := b.Violations().Subscribe
	out := runBlockIn(t, block, b.ClientURL(), dir)
	for _, want := range []string{
		`"values":[7,10,15,22]`,                 // the read's result, on the tenant's inbox
		"Stored in Stream: FABRIC_OPS Sequence", // the frame stored
		`"status":"ok"`,                         // the device's health
		"Permissions Violation for Subscription to \"fabric.>\"",
		"refused: acme sees only its own namespace",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if b.Violations().Subscribe == v0 {
			return errors.New("the refused subscription was not counted")
		}
		return nil
	})
}
