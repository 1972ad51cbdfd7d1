package broker

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// tlsTimeout bounds a TLS handshake on the client port and on routes, in
// seconds (nats-server's default is 2 s; a loaded machine needs longer).
const tlsTimeout = 5.0

// serverTLS reads t's files into the tls.Config of a listener. On a route
// (mutual TLS) the CAs verify the peer both when it dials in and when this
// node dials it.
func (t TLSConfig) serverTLS(what string, route bool) (*tls.Config, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s TLS: %s", ErrInvalidConfig, what, fmt.Sprintf(format, a...))
	}
	pair, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, bad("certificate %s with key %s: %v", t.CertFile, t.KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, bad("certificate %s: %v", t.CertFile, err)
	}
	if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return nil, bad("certificate %s is valid from %s to %s, not now", t.CertFile, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	pair.Leaf = leaf
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if t.CAFile != "" {
		pool, err := readCAs(t.CAFile)
		if err != nil {
			return nil, bad("%v", err)
		}
		c.ClientCAs = pool
	}
	if t.Verify || route {
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if route {
		c.RootCAs = c.ClientCAs
	}
	return c, nil
}

// readCAs reads a PEM file of CA certificates.
func readCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}
