package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// TestComposeTLS: the tls profile. Certificates made by the host binary's
// jetfabric certs (as make certs makes them) are mounted into a broker
// that requires TLS and workers that connect with it; the demo passes over
// TLS from the host; a client without the CA is refused and told so.
func TestComposeTLS(t *testing.T) {
	needE2E(t)
	dir := filepath.Join(t.TempDir(), "tls")
	if out, err := jetfabric(t, time.Minute, "certs", "--dir", dir, "--hosts", "localhost,127.0.0.1,broker-tls"); err != nil {
		t.Fatalf("certs: %v\n%s", err, out)
	}
	// The containers run as uid 65532: let them read the directory and
	// the keys they use, as make certs does.
	for _, f := range []string{dir, filepath.Join(dir, "server-key.pem"), filepath.Join(dir, "client-key.pem")} {
		if err := os.Chmod(f, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Chmod(filepath.Dir(dir), 0o755)
	p := newProject(t)
	p.extra = append(p.extra, "JETFABRIC_TLS_DIR="+dir, "JETFABRIC_TLS_VERIFY=true")
	p.compose("--profile", "tls", "up", "-d", "--scale", "worker-tls=2", "broker-tls", "worker-tls")
	url := fmt.Sprintf("tls://127.0.0.1:%d", p.ports["JETFABRIC_TLS_PORT"])
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")

	var c *client.Client
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		if c, err = client.Connect(url, client.WithTLS(ca, cert, key)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connect %s: %v", url, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer c.Close()
	waitLive(t, c, 2, 2*time.Minute)

	out, err := jetfabric(t, 3*time.Minute, "demo", "--url", url, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, "--chain", "1000")
	if err != nil || !strings.Contains(out, "demo passed") || !strings.Contains(out, "through FABRIC_JOBS") {
		t.Fatalf("demo over TLS: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"devices", "--url", strings.Replace(url, "tls://", "nats://", 1)}, "requires TLS"},
		{[]string{"devices", "--url", url, "--tls-ca", ca}, "requires a client certificate"},
	} {
		out, err := jetfabric(t, time.Minute, c.args...)
		if err == nil || !strings.Contains(out, c.mention) {
			t.Errorf("%v: %v, want a failure mentioning %q:\n%s", c.args, err, c.mention, out)
		}
	}
}
