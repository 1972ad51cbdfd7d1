package certs_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/internal/certs"
)

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		t.Fatalf("%s: no certificate", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	data, _ := os.ReadFile(path)
	if !p.AppendCertsFromPEM(data) {
		t.Fatalf("%s: no CA", path)
	}
	return p
}

func TestWriteVerifies(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	f, err := certs.Write(dir, certs.Options{Hosts: []string{"localhost", "127.0.0.1", "broker", "n1", "*.fabric.test", "::1"}, Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if f.ReusedCA {
		t.Error("reused an authority in an empty directory")
	}
	roots := pool(t, f.CA)
	server := parseCert(t, f.ServerCert)
	for _, host := range []string{"localhost", "127.0.0.1", "broker", "n1", "a.fabric.test", "::1"} {
		if _, err := server.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	for _, host := range []string{"n2", "10.0.0.1", "fabric.test"} {
		if _, err := server.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err == nil {
			t.Errorf("server certificate valid for %s, which it was not made for", host)
		}
	}
	// Routes: the server certificate also authenticates a client.
	if _, err := server.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("server certificate as a route client: %v", err)
	}
	client := parseCert(t, f.ClientCert)
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"}); err == nil {
		t.Error("the client certificate serves as a server's")
	}
	if d := time.Until(server.NotAfter); d < 47*time.Hour || d > 49*time.Hour {
		t.Errorf("server certificate valid for %v more, want about 48h", d)
	}
	for _, p := range []string{f.CAKey, f.ServerKey, f.ClientKey} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", p, st.Mode().Perm(), err)
		}
	}
	// The files serve a real handshake, the client verified by the server.
	serverPair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	clientPair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("ok"))
			c.Close()
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{clientPair}})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "ok" {
		t.Fatalf("read over TLS: %q %v", buf, err)
	}
	conn.Close()
}

func TestWriteReusesAuthority(t *testing.T) {
	dir := t.TempDir()
	f, err := certs.Write(dir, certs.Options{Hosts: []string{"localhost"}})
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(f.CA)
	oldServer, _ := os.ReadFile(f.ServerCert)
	if _, err := certs.Write(dir, certs.Options{Hosts: []string{"localhost", "n2"}}); !errors.Is(err, certs.ErrExists) || !strings.Contains(err.Error(), "server.pem") {
		t.Fatalf("second write without Force: %v", err)
	}
	f2, err := certs.Write(dir, certs.Options{Hosts: []string{"localhost", "n2"}, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	ca2, _ := os.ReadFile(f2.CA)
	newServer, _ := os.ReadFile(f2.ServerCert)
	if !f2.ReusedCA || !bytes.Equal(ca, ca2) {
		t.Fatal("the authority was not reused")
	}
	if bytes.Equal(oldServer, newServer) {
		t.Fatal("the server certificate was not replaced")
	}
	if _, err := parseCert(t, f2.ServerCert).Verify(x509.VerifyOptions{DNSName: "n2", Roots: pool(t, f.CA)}); err != nil {
		t.Fatalf("new server certificate under the old authority: %v", err)
	}
}

func TestWriteRefusesBadInput(t *testing.T) {
	good := certs.Options{Hosts: []string{"localhost"}}
	for name, c := range map[string]struct {
		o       certs.Options
		prepare func(dir string)
		mention string
	}{
		"no hosts":       {o: certs.Options{}, mention: "no hosts"},
		"bad host":       {o: certs.Options{Hosts: []string{"local host"}}, mention: `host "local host"`},
		"url as host":    {o: certs.Options{Hosts: []string{"nats://broker:4222"}}, mention: "DNS name"},
		"empty label":    {o: certs.Options{Hosts: []string{"a..b"}}, mention: "label"},
		"hyphen label":   {o: certs.Options{Hosts: []string{"-a"}}, mention: "hyphen"},
		"short validity": {o: certs.Options{Hosts: []string{"a"}, Validity: time.Minute}, mention: "validity"},
		"long validity":  {o: certs.Options{Hosts: []string{"a"}, Validity: 20 * 365 * 24 * time.Hour}, mention: "validity"},
		"client name":    {o: certs.Options{Hosts: []string{"a"}, ClientName: "a\nb"}, mention: "control character"},
		"ca without key": {o: good, prepare: func(dir string) { _ = os.WriteFile(filepath.Join(dir, certs.CAFile), []byte("x"), 0o644) }, mention: "must both exist"},
		"ca not pem": {o: good, prepare: func(dir string) {
			_ = os.WriteFile(filepath.Join(dir, certs.CAFile), []byte("x"), 0o644)
			_ = os.WriteFile(filepath.Join(dir, certs.CAKeyFile), []byte("y"), 0o600)
		}, mention: "no PEM block"},
		"key of other ca": {o: good, prepare: mismatchedAuthority, mention: "is not the key of"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if c.prepare != nil {
				c.prepare(dir)
			}
			_, err := certs.Write(dir, c.o)
			if !errors.Is(err, certs.ErrInvalid) || !strings.Contains(err.Error(), c.mention) || !strings.HasPrefix(err.Error(), "certs: ") {
				t.Fatalf("got %v, want ErrInvalid mentioning %q", err, c.mention)
			}
			if _, err := os.Stat(filepath.Join(dir, certs.ServerCertFile)); err == nil {
				t.Error("a server certificate was written after all")
			}
		})
	}
}

// mismatchedAuthority puts one authority's certificate beside another's key.
func mismatchedAuthority(dir string) {
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if _, err := certs.Write(a, certs.Options{Hosts: []string{"x"}}); err != nil {
		panic(err)
	}
	if _, err := certs.Write(b, certs.Options{Hosts: []string{"x"}}); err != nil {
		panic(err)
	}
	_ = os.Rename(filepath.Join(a, certs.CAFile), filepath.Join(dir, certs.CAFile))
	_ = os.Rename(filepath.Join(b, certs.CAKeyFile), filepath.Join(dir, certs.CAKeyFile))
}
