package broker_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/internal/poll"
)

// devCerts writes an authority and its certificates for 127.0.0.1 and
// localhost into a temporary directory.
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

// plainInfo dials addr without TLS and returns the server's INFO and the
// connection, positioned after it.
func plainInfo(t *testing.T, addr string) (map[string]any, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("first line from %s: %q %v", addr, line, err)
	}
	var info map[string]any
	if err := json.Unmarshal([]byte(line[5:]), &info); err != nil {
		t.Fatal(err)
	}
	return info, conn, r
}

func TestTLSRequired(t *testing.T) {
	f := devCerts(t)
	b := tlsBroker(t, f, false)
	url := b.ClientURL()
	if !strings.HasPrefix(url, "tls://127.0.0.1:") {
		t.Fatalf("client URL %q, want tls://", url)
	}
	addr := strings.TrimPrefix(url, "tls://")

	// A client speaking plain NATS is told TLS is required and gets no
	// answer to its PING: the server takes its CONNECT for a broken
	// handshake and closes the connection.
	info, conn, r := plainInfo(t, addr)
	if info["tls_required"] != true {
		t.Fatalf("INFO without tls_required: %v", info)
	}
	if _, err := fmt.Fprintf(conn, "CONNECT {\"verbose\":false}\r\nPING\r\n"); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break // closed: refused
		}
		if strings.HasPrefix(line, "PONG") {
			t.Fatal("a plain connection got PONG from a broker that requires TLS")
		}
	}

	// The Go client upgrades by itself but must trust the authority.
	for name, opts := range map[string][]nats.Option{
		"system roots": nil,
		"another CA":   {nats.RootCAs(devCerts(t).CA)},
	} {
		nc, err := nats.Connect(url, append(opts, nats.Timeout(20*time.Second))...)
		var unknown x509.UnknownAuthorityError
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected to a broker whose certificate it cannot verify", name)
		} else if !errors.As(err, &unknown) {
			t.Errorf("%s: %v, want an unknown authority", name, err)
		}
	}
	// A host name the certificate does not hold.
	port := addr[strings.LastIndex(addr, ":")+1:]
	if f2, err := certs.Write(t.TempDir(), certs.Options{Hosts: []string{"broker"}}); err != nil {
		t.Fatal(err)
	} else {
		b2 := tlsBroker(t, f2, false)
		_ = port
		nc, err := nats.Connect(b2.ClientURL(), nats.RootCAs(f2.CA), nats.Timeout(20*time.Second))
		var host x509.HostnameError
		if err == nil {
			nc.Close()
			t.Error("connected to 127.0.0.1 with a certificate for broker")
		} else if !errors.As(err, &host) {
			t.Errorf("certificate for another host: %v, want a host name error", err)
		}
	}

	nc, err := nats.Connect(url, nats.RootCAs(f.CA), nats.Timeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if cs, err := nc.TLSConnectionState(); err != nil || !cs.HandshakeComplete {
		t.Fatalf("connection state: %+v %v", cs, err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(context.Background(), "FABRIC_OPS"); err != nil {
		t.Fatal(err)
	}
	// The broker's own connections go in process, without a certificate.
	own, err := b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	own.Close()
}

func TestTLSVerifyClients(t *testing.T) {
	f := devCerts(t)
	b := tlsBroker(t, f, true)
	other := devCerts(t)
	for name, opts := range map[string][]nats.Option{
		"no client certificate":              {nats.RootCAs(f.CA)},
		"a certificate of another authority": {nats.RootCAs(f.CA), nats.ClientCert(other.ClientCert, other.ClientKey)},
	} {
		nc, err := nats.Connect(b.ClientURL(), append(opts, nats.Timeout(20*time.Second), nats.NoReconnect())...)
		if err == nil {
			// TLS 1.3 finishes the client's side of the handshake before
			// the server checks the certificate: the refusal comes with
			// the first answer.
			err = nc.Flush()
			nc.Close()
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	nc, err := nats.Connect(b.ClientURL(), nats.RootCAs(f.CA), nats.ClientCert(f.ClientCert, f.ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func TestTLSBadConfig(t *testing.T) {
	f := devCerts(t)
	for name, c := range map[string]struct {
		edit    func(*broker.Config)
		mention string
	}{
		"cert without key": {func(c *broker.Config) { c.TLS.CertFile = f.ServerCert }, "without its key file"},
		"key without cert": {func(c *broker.Config) { c.TLS.KeyFile = f.ServerKey }, "without a certificate file"},
		"verify without CA": {func(c *broker.Config) {
			c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, Verify: true}
		}, "needs the CA file"},
		"missing certificate": {func(c *broker.Config) { c.TLS = broker.TLSConfig{CertFile: "/nonexistent.pem", KeyFile: f.ServerKey} }, "/nonexistent.pem"},
		"key of another cert": {func(c *broker.Config) { c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ClientKey} }, "private key does not match"},
		"CA not PEM": {func(c *broker.Config) {
			c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.ServerKey}
		}, "holds no PEM certificate"},
		"TLS in process": {func(c *broker.Config) {
			c.InProcess = true
			c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey}
		}, "in-process"},
		"route TLS without CA": {func(c *broker.Config) {
			c.Name = "n1"
			c.Cluster = broker.ClusterConfig{Name: "c", Port: -1, TLS: broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey}}
		}, "routes verify their peers"},
		"route TLS no cluster": {func(c *broker.Config) {
			c.Cluster.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA}
		}, "without a cluster name"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := broker.DefaultConfig()
			cfg.StoreDir = t.TempDir()
			cfg.Port = -1
			c.edit(&cfg)
			_, err := broker.New(cfg)
			if !errors.Is(err, broker.ErrInvalidConfig) || !strings.Contains(err.Error(), c.mention) || !strings.Contains(err.Error(), "TLS") {
				t.Fatalf("got %v, want ErrInvalidConfig about TLS mentioning %q", err, c.mention)
			}
		})
	}
}

// TestClusterRoutesTLS: three nodes whose routes and client ports require
// TLS form a JetStream cluster, replicate the fabric's stream three times
// and serve clients on every node; the route port refuses plain NATS.
func TestClusterRoutesTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster test: -short")
	}
	f := devCerts(t)
	start := time.Now()
	var routePorts []int
	cluster := brokertest.RunCluster(t, 3, func(c *broker.Config) {
		c.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA}
		c.Cluster.TLS = broker.TLSConfig{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA}
		routePorts = append(routePorts, c.Cluster.Port)
	})
	t.Logf("started in %v", time.Since(start))
	nodes := []*broker.Broker{cluster.Node(0), cluster.Node(1), cluster.Node(2)}
	for i, b := range nodes {
		poll.Until(t, time.Minute, 50*time.Millisecond, func() error {
			if n := b.Server().NumRoutes(); n < 2 {
				return fmt.Errorf("n%d has %d routes, want one to each peer", i+1, n)
			}
			return nil
		})
	}
	// The route port starts with the TLS handshake: a plain client gets
	// no INFO at all.
	plain, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", routePorts[0]))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fmt.Fprintf(plain, "CONNECT {}\r\nPING\r\n")
	_ = plain.SetDeadline(time.Now().Add(time.Minute))
	line, _ := bufio.NewReader(plain).ReadString('\n')
	plain.Close()
	if strings.HasPrefix(line, "INFO ") && !strings.Contains(line, `"tls_required":true`) || strings.HasPrefix(line, "PONG") {
		t.Fatalf("the route port answered a plain client: %q", line)
	}
	t.Logf("formed in %v", time.Since(start))
	// Every node serves the replicated stream to a TLS client.
	for i, b := range nodes {
		nc, err := nats.Connect(b.ClientURL(), nats.RootCAs(f.CA))
		if err != nil {
			t.Fatalf("n%d: %v", i+1, err)
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ack, err := js.Publish(ctx, fmt.Sprintf("fabric.ops.cpu-0.s%d", i), []byte("x"))
		cancel()
		nc.Close()
		if err != nil {
			t.Fatalf("publish through n%d: %v", i+1, err)
		}
		if ack.Stream != "FABRIC_OPS" {
			t.Fatalf("ack %+v", ack)
		}
	}
	nc, err := nats.Connect(nodes[2].ClientURL(), nats.RootCAs(f.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(context.Background(), "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.Replicas != 3 {
		t.Fatalf("stream replicas %d", cfg.Replicas)
	}
	if n := len(s.CachedInfo().Cluster.Replicas); n != 2 {
		t.Fatalf("%d peers beside the leader, want 2: %+v", n, s.CachedInfo().Cluster)
	}
}
