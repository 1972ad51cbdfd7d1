package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// TestComposeTenants: the tenants profile, TLS and tenants together. The
// certificates and an auth directory with tenants alice and bob, made by
// the host binary as make certs and make tenants make them, are mounted
// into a broker that requires TLS and credentials and workers that
// connect with TLS as the service user. Alice and bob each run ops and
// read their results over TLS with their own creds; bob's subscription to
// alice's inbox and his publish into her session are refused by the
// broker, and reach nothing of hers; a plain connection and one without
// credentials are refused.
func TestComposeTenants(t *testing.T) {
	needE2E(t)
	base := t.TempDir()
	tlsDir, auth := filepath.Join(base, "tls"), filepath.Join(base, "auth")
	for _, args := range [][]string{
		{"certs", "--dir", tlsDir, "--hosts", "localhost,127.0.0.1,broker-tenants"},
		{"tenant", "init", "--dir", auth},
		{"tenant", "add", "alice", "--dir", auth},
		{"tenant", "add", "bob", "--dir", auth},
	} {
		if out, err := jetfabric(t, time.Minute, args...); err != nil {
			t.Fatalf("jetfabric %v: %v\n%s", args, err, out)
		}
	}
	// The containers run as uid 65532: let them read what they use, as
	// make certs and make tenants do (development only).
	for f, mode := range map[string]os.FileMode{
		tlsDir:                                  0o755,
		filepath.Join(tlsDir, "server-key.pem"): 0o644,
		auth:                                    0o755,
		filepath.Join(auth, "tenants"):          0o755,
		tenant.ServiceCreds(auth):               0o644,
	} {
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	p := newProject(t)
	p.extra = append(p.extra, "JETFABRIC_TLS_DIR="+tlsDir, "JETFABRIC_AUTH_DIR="+auth)
	p.compose("--profile", "tenants", "up", "-d", "broker-tenants", "worker-tenants")
	hostPort := fmt.Sprintf("127.0.0.1:%d", p.ports["JETFABRIC_TENANTS_PORT"])
	url := "tls://" + hostPort
	ca := filepath.Join(tlsDir, "ca.pem")
	aliceCreds, bobCreds := tenant.CredsPath(auth, "alice"), tenant.CredsPath(auth, "bob")

	connectAs := func(creds string) *client.Client {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			c, err := client.Connect(url, client.WithTLS(ca, "", ""), client.WithCreds(creds))
			if err == nil {
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("connect %s with %s: %v", url, creds, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	alice := connectAs(aliceCreds)
	if alice.Tenant() != "alice" {
		t.Fatalf("alice's client works as tenant %q", alice.Tenant())
	}
	waitLive(t, alice, 1, 2*time.Minute)
	bob := connectAs(bobCreds)
	if bob.Tenant() != "bob" {
		t.Fatalf("bob's client works as tenant %q", bob.Tenant())
	}
	// The README's command: the device list as a tenant, over TLS.
	if out, err := jetfabric(t, time.Minute, "devices", "--url", url, "--tls-ca", ca, "--creds", aliceCreds); err != nil || !strings.Contains(out, "cpu-0") {
		t.Fatalf("devices as alice: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Each runs ops in a session of its own on cpu-0 and reads the result.
	run := func(c *client.Client, a, b float64) (*client.Session, *client.Tensor) {
		t.Helper()
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			t.Fatalf("%s opens cpu-0: %v", c.Tenant(), err)
		}
		y := s.Full([]int{4}, a).Add(s.Full([]int{4}, b))
		if v, err := y.Float32s(ctx); err != nil || len(v) != 4 || v[0] != float32(a+b) || v[3] != float32(a+b) {
			t.Fatalf("%s's %v+%v: %v %v", c.Tenant(), a, b, v, err)
		}
		return s, y
	}
	as, ay := run(alice, 20, 22)
	defer as.Close(ctx)
	bs, _ := run(bob, 2, 3)
	defer bs.Close(ctx)

	// Bob, over TLS with his own creds, subscribes to alice's inbox and
	// publishes a frame into her session: the broker refuses both and says
	// so on his connection, which stays open.
	refused := make(chan error, 16)
	nc, err := nats.Connect(url, nats.RootCAs(ca), nats.UserCredentials(bobCreds),
		nats.CustomInboxPrefix("_INBOX_fabric.t.bob"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select { // never block the connection's goroutine
			case refused <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("bob's own NATS connection: %v", err)
	}
	defer nc.Close()
	got := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe("_INBOX_fabric.t.alice.>", got); err != nil {
		t.Fatal(err)
	}
	names, err := subjects.Default().ForTenant("alice")
	if err != nil {
		t.Fatal(err)
	}
	frame := []byte(`{"v":1,"ops":[{"op":"read","in":[1],"tag":1}]}`)
	msg := &nats.Msg{Subject: names.Ops("cpu-0", as.ID()), Data: frame,
		Header: nats.Header{"Content-Type": {"application/json"}, "Fabric-Reply": {"_INBOX_fabric.t.bob.stolen"}}}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	var sub, pub bool
	deadline := time.After(30 * time.Second)
	for !sub || !pub {
		select {
		case err := <-refused:
			e := err.Error()
			if !strings.Contains(strings.ToLower(e), "permissions violation") {
				t.Fatalf("bob's connection got %v, want permission violations", err)
			}
			sub = sub || strings.Contains(e, "Subscription to \"_INBOX_fabric.t.alice.>\"")
			pub = pub || strings.Contains(e, "Publish to \""+msg.Subject+"\"")
		case <-deadline:
			t.Fatalf("bob's connection was not refused (subscription %v, publish %v)", sub, pub)
		}
	}
	if !nc.IsConnected() {
		t.Errorf("bob's connection closed after the refusals: %v", nc.LastError())
	}
	// Alice reads again: her answer reaches her, nothing of it reaches bob.
	if v, err := ay.Float32s(ctx); err != nil || v[0] != 42 {
		t.Errorf("alice's tensor after bob's attempts: %v %v", v, err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		t.Errorf("bob got a message of alice's on %s", m.Subject)
	default:
	}
	// The broker counted the refusals.
	waitMetric(t, fmt.Sprintf("127.0.0.1:%d", p.ports["JETFABRIC_TENANTS_METRICS_PORT"]), "jetfabric_broker_permission_violations_total{", `kind="subscribe"`)

	// Refused: a client that does not trust the CA (it sees the broker
	// requires TLS), a connection without creds, and a plain connection
	// speaking NATS in clear text with alice's valid credentials.
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"devices", "--url", "nats://" + hostPort, "--creds", aliceCreds}, "requires TLS"},
		{[]string{"devices", "--url", url, "--tls-ca", ca}, "refused the credentials"},
	} {
		out, err := jetfabric(t, time.Minute, c.args...)
		if err == nil || !strings.Contains(out, c.mention) {
			t.Errorf("%v: %v, want a failure mentioning %q:\n%s", c.args, err, c.mention, out)
		}
	}
	if err := plainConnect(hostPort, aliceCreds); err == nil {
		t.Error("a plain-text connection with alice's creds was accepted")
	} else {
		t.Logf("plain-text connection: %v", err)
	}
}

// plainConnect speaks NATS in clear text to addr: it reads INFO, sends
// CONNECT with the creds' JWT and the signed nonce, and PING. It returns
// nil only if the server answers PONG, accepting the connection.
func plainConnect(addr, creds string) error {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("no INFO: %w", err)
	}
	var info struct {
		Nonce       string `json:"nonce"`
		TLSRequired bool   `json:"tls_required"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "INFO ")), &info); err != nil {
		return fmt.Errorf("INFO %q: %w", line, err)
	}
	if !info.TLSRequired {
		return nil // the broker does not even ask for TLS
	}
	b, err := os.ReadFile(creds)
	if err != nil {
		return err
	}
	tok, seed, err := tenant.ParseCreds(b)
	if err != nil {
		return err
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return err
	}
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		return err
	}
	connect, _ := json.Marshal(map[string]any{"verbose": false, "pedantic": false, "headers": true, "protocol": 1,
		"jwt": tok, "sig": base64.RawURLEncoding.EncodeToString(sig)})
	if _, err := fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", connect); err != nil {
		return fmt.Errorf("tls_required, and the server closed before CONNECT: %w", err)
	}
	rest, err := io.ReadAll(r)
	if strings.Contains(string(rest), "PONG") {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("tls_required, no PONG within 30 s: %q", rest)
	}
	return fmt.Errorf("tls_required, and the server closed the connection without PONG (%v): %q", err, rest)
}

// waitMetric waits until addr's /metrics has a line with every one of
// parts and a value other than 0.
func waitMetric(t testing.TB, addr string, parts ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		m := scrapeMetrics(t, addr)
	lines:
		for _, l := range strings.Split(m, "\n") {
			for _, p := range parts {
				if !strings.Contains(l, p) {
					continue lines
				}
			}
			if f := strings.Fields(l); len(f) == 2 && f[1] != "0" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no metric with %v above 0 at %s:\n%s", parts, addr, m)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
