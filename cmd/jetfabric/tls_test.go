package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/internal/poll"
)

// TestTLSWorkerProcess: a broker that requires TLS and verifies client
// certificates; a worker process and the demo connect with the
// certificates jetfabric certs wrote; without them each is refused and
// says which flag it lacks.
func TestTLSWorkerProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"certs", "--dir", dir, "--hosts", "localhost,127.0.0.1", "--validity", "2d"}, &stdout, &stderr); code != 0 {
		t.Fatalf("certs exited %d: %s%s", code, stdout.String(), stderr.String())
	}
	ca, cert, key := filepath.Join(dir, certs.CAFile), filepath.Join(dir, certs.ClientCertFile), filepath.Join(dir, certs.ClientKeyFile)
	b := brokertest.Run(t, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{CertFile: filepath.Join(dir, certs.ServerCertFile), KeyFile: filepath.Join(dir, certs.ServerKeyFile), CAFile: ca, Verify: true}
	})
	url := b.ClientURL()
	tlsFlags := []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key}

	// Without a client certificate the worker process stops at once and
	// says which flags it lacks.
	w, out := spawn(t, "worker", "--url", url, "--cpus", "1", "--tls-ca", ca)
	if err := w.Wait(); err == nil || !strings.Contains(out.String(), "requires a client certificate") || !strings.Contains(out.String(), "-tls-cert") {
		t.Fatalf("worker without a client certificate: %v\n%s", err, out.String())
	}

	w, out = spawn(t, append([]string{"worker", "--url", url, "--cpus", "2"}, tlsFlags...)...)
	poll.Until(t, 2*time.Minute, 50*time.Millisecond, func() error {
		stdout.Reset()
		stderr.Reset()
		if code := run(context.Background(), append([]string{"devices", "--url", url}, tlsFlags...), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "cpu-1") {
			return &waitErr{"devices: " + stdout.String() + stderr.String() + "\nworker:\n" + out.String()}
		}
		return nil
	})
	stdout.Reset()
	stderr.Reset()
	if code := run(context.Background(), append([]string{"demo", "--url", url, "--chain", "500", "--mnist-steps", "0"}, tlsFlags...), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "demo passed") {
		t.Fatalf("demo over TLS exited %d\n%s\n%s\nworker:\n%s", code, stdout.String(), stderr.String(), out.String())
	}

	t.Logf("demo over TLS:\n%s\nworker:\n%s", stdout.String(), out.String())
	// Each missing piece is named.
	other := filepath.Join(t.TempDir(), "other")
	if code := run(context.Background(), []string{"certs", "--dir", other}, &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	for _, c := range []struct {
		args     []string
		mentions []string
	}{
		{[]string{"devices", "--url", url}, []string{"requires TLS", "-tls-ca"}},
		{[]string{"devices", "--url", strings.Replace(url, "tls://", "nats://", 1)}, []string{"requires TLS", "-tls-ca"}},
		{[]string{"devices", "--url", url, "--tls-ca", filepath.Join(other, certs.CAFile)}, []string{"does not trust", "-tls-ca"}},
		{[]string{"devices", "--url", url, "--tls-ca", ca}, []string{"requires a client certificate", "-tls-cert and -tls-key"}},
		{[]string{"devices", "--url", strings.Replace(url, "127.0.0.1", "localhost", 1), "--tls-ca", filepath.Join(other, certs.CAFile)}, []string{"does not trust"}},
	} {
		stdout.Reset()
		stderr.Reset()
		code := run(context.Background(), c.args, &stdout, &stderr)
		for _, m := range c.mentions {
			if code != 1 || !strings.Contains(stderr.String(), m) {
				t.Errorf("%v: exit %d, want 1 mentioning %q:\n%s", c.args, code, m, stderr.String())
			}
		}
	}
	_ = w.Process.Signal(syscall.SIGTERM)
	if err := w.Wait(); err != nil {
		t.Fatalf("worker exit: %v\n%s", err, out.String())
	}
}

type waitErr struct{ s string }

func (e *waitErr) Error() string { return e.s }

func TestTLSBadCommandLines(t *testing.T) {
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"certs", "--dir", dir}, &stdout, &stderr); code != 0 {
		t.Fatal(stderr.String())
	}
	if !strings.Contains(stdout.String(), "--tls-cert "+filepath.Join(dir, "server.pem")) {
		t.Errorf("certs does not say how to use the files:\n%s", stdout.String())
	}
	notPEM := filepath.Join(dir, "not.pem")
	_ = os.WriteFile(notPEM, []byte("x"), 0o600)
	cert, key, ca := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "ca.pem")
	for _, c := range []struct {
		args    []string
		code    int
		mention string
	}{
		{[]string{"certs"}, 1, "-dir is required"},
		{[]string{"certs", "--dir", dir}, 1, "pass --force"},
		{[]string{"certs", "--dir", t.TempDir(), "--hosts", "nats://broker:4222"}, 1, "want a DNS name"},
		{[]string{"certs", "--dir", t.TempDir(), "--hosts", ","}, 1, "no hosts"},
		{[]string{"certs", "--dir", t.TempDir(), "--validity", "3y"}, 1, "want a number of days"},
		{[]string{"certs", "--dir", t.TempDir(), "--validity", "5000d"}, 1, "validity"},
		{[]string{"broker", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--tls-cert", cert}, 1, "without its key file"},
		{[]string{"broker", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--tls-verify"}, 1, "needs the CA file"},
		{[]string{"broker", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--tls-cert", notPEM, "--tls-key", key}, 1, "client TLS: certificate"},
		{[]string{"broker", "--store", t.TempDir(), "--tls-cert", cert, "--tls-key", key, "--cluster", "c", "--routes", "nats://n1:6222"}, 1, "verify their peers by -tls-ca"},
		{[]string{"worker", "--url", "tls://127.0.0.1:1", "--tls-ca", notPEM}, 1, "holds no PEM certificate"},
		{[]string{"devices", "--url", "tls://127.0.0.1:1", "--tls-cert", cert}, 1, "both its certificate file and its key file"},
		{[]string{"up", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--tls-key", key}, 1, "without a certificate file"},
		{[]string{"devices", "--url", "tls://127.0.0.1:1", "--tls-ca", ca}, 1, "nothing listens"}, // a worker waits for its broker instead
	} {
		stdout.Reset()
		stderr.Reset()
		code := run(context.Background(), c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String()+stderr.String(), c.mention) {
			t.Errorf("%v: exit %d, want %d mentioning %q:\n%s%s", c.args, code, c.code, c.mention, stdout.String(), stderr.String())
		}
	}
}
