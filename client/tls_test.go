package client_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

func devCerts(t *testing.T) certs.Files {
	t.Helper()
	f, err := certs.Write(t.TempDir(), certs.Options{Hosts: []string{"127.0.0.1", "localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func tlsBroker(t *testing.T, f certs.Files, verify bool) *broker.Broker {
	t.Helper()
	return brokertest.Run(t, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA, Verify: verify}
	})
}

// TestTLSRoundTrip: ops, a read and a large upload through the object
// store, over a connection the broker verified by its client certificate.
func TestTLSRoundTrip(t *testing.T) {
	f := devCerts(t)
	b := tlsBroker(t, f, true)
	workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
	c, err := client.Connect(b.ClientURL(), client.WithTLS(f.CA, f.ClientCert, f.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if cs, err := c.Conn().TLSConnectionState(); err != nil || !cs.HandshakeComplete || len(cs.PeerCertificates) == 0 {
		t.Fatalf("not over TLS: %+v %v", cs, err)
	}
	s := open(t, c, "cpu-0")
	x := s.FromFloat32([]int{2}, []float32{1, 2})
	expect(t, "x*x+x", read(t, x.Mul(x).Add(x)), 2, 6)
	big := make([]byte, 6<<20) // over the inline limit: through the object store
	for i := range big {
		big[i] = byte(i)
	}
	u, err := s.Upload(context.Background(), "u8", []int{len(big)}, big)
	if err != nil {
		t.Fatal(err)
	}
	got, err := u.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Bytes) != string(big) {
		t.Fatal("the large upload came back different")
	}
}

// TestTLSConnectErrors: each way a TLS connection fails is told apart and
// says what to do.
func TestTLSConnectErrors(t *testing.T) {
	f := devCerts(t)
	tb := tlsBroker(t, f, false)
	vb := tlsBroker(t, f, true)
	plain := brokertest.Run(t)
	other := devCerts(t)
	named, err := certs.Write(t.TempDir(), certs.Options{Hosts: []string{"broker"}})
	if err != nil {
		t.Fatal(err)
	}
	nb := tlsBroker(t, named, false)
	for name, c := range map[string]struct {
		url      string
		opts     []client.Option
		cause    error
		mentions []string
	}{
		"no CA":        {tb.ClientURL(), nil, client.ErrTLSUnknownAuthority, []string{"requires TLS", "does not trust", "WithTLS"}},
		"nats:// URL":  {strings.Replace(tb.ClientURL(), "tls://", "nats://", 1), nil, client.ErrTLSUnknownAuthority, []string{"requires TLS"}},
		"another CA":   {tb.ClientURL(), []client.Option{client.WithTLS(other.CA, "", "")}, client.ErrTLSUnknownAuthority, []string{"does not trust"}},
		"host":         {nb.ClientURL(), []client.Option{client.WithTLS(named.CA, "", "")}, client.ErrTLSHost, []string{"not valid for the host"}},
		"no cert":      {vb.ClientURL(), []client.Option{client.WithTLS(f.CA, "", "")}, client.ErrTLSClientCert, []string{"requires a client certificate", "certFile"}},
		"foreign cert": {vb.ClientURL(), []client.Option{client.WithTLS(f.CA, other.ClientCert, other.ClientKey)}, client.ErrTLSClientCert, []string{"client certificate"}},
		"TLS to plain": {plain.ClientURL(), []client.Option{client.WithTLS(f.CA, "", "")}, client.ErrTLSNotOffered, []string{"does not offer it"}},
	} {
		t.Run(name, func(t *testing.T) {
			opts := append(c.opts, client.WithNATSOptions(nats.Timeout(20*time.Second), nats.MaxReconnects(0)))
			cl, err := client.Connect(c.url, opts...)
			if err == nil {
				cl.Close()
				t.Fatal("connected")
			}
			var ce *client.ConnectError
			if !errors.Is(err, c.cause) || !errors.As(err, &ce) || ce.URL != c.url {
				t.Fatalf("got %v, want %v", err, c.cause)
			}
			t.Logf("%v", err)
			for _, m := range c.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not mention %q", err, m)
				}
			}
		})
	}
	// Bad files are refused before any connection is tried.
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	_ = os.WriteFile(notPEM, []byte("not a certificate"), 0o600)
	for name, c := range map[string]struct {
		opt     client.Option
		mention string
	}{
		"missing CA":       {client.WithTLS("/nonexistent/ca.pem", "", ""), "/nonexistent/ca.pem"},
		"CA not PEM":       {client.WithTLS(notPEM, "", ""), "holds no PEM certificate"},
		"cert without key": {client.WithTLS(f.CA, f.ClientCert, ""), "both its certificate file and its key file"},
		"key of another":   {client.WithTLS(f.CA, f.ClientCert, other.ClientKey), "private key does not match"},
	} {
		_, err := client.Connect(tb.ClientURL(), c.opt)
		if !errors.Is(err, client.ErrInvalidOption) || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%s: got %v, want ErrInvalidOption mentioning %q", name, err, c.mention)
		}
	}
}
