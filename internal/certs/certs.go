// Package certs makes a certificate authority of its own and the
// certificates a fabric with TLS needs, for development, tests and small
// deployments: ECDSA P-256 keys and X.509 certificates in PEM files.
//
// Write puts into one directory
//
//	ca.pem, ca-key.pem          the authority (kept, and reused by a later Write)
//	server.pem, server-key.pem  the brokers' certificate, valid for the hosts
//	                            given, for TLS servers and for cluster routes
//	                            (server and client authentication)
//	client.pem, client-key.pem  a client certificate, for brokers that verify
//	                            their clients (--tls-verify)
//
// Key files are written readable by their owner only.
package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The files Write writes in its directory.
const (
	CAFile         = "ca.pem"
	CAKeyFile      = "ca-key.pem"
	ServerCertFile = "server.pem"
	ServerKeyFile  = "server-key.pem"
	ClientCertFile = "client.pem"
	ClientKeyFile  = "client-key.pem"
)

// Validity limits and defaults.
const (
	// DefaultValidity is how long the server and client certificates
	// are valid by default: a year.
	DefaultValidity = 365 * 24 * time.Hour
	// MaxValidity bounds them: ten years.
	MaxValidity = 10 * 365 * 24 * time.Hour
	// CAValidity is how long a new authority is valid: ten years and a
	// day, so that it outlives every certificate it signs.
	CAValidity = MaxValidity + 24*time.Hour
)

// ErrInvalid wraps every error about the options or the files found.
var ErrInvalid = errors.New("certs: invalid")

// ErrExists: a server or client file exists and Options.Force is off
// (Force replaces them; the authority is kept either way).
var ErrExists = errors.New("certs: exists")

// Options says what to make. Hosts is required.
type Options struct {
	// Hosts are the DNS names and IP addresses the server certificate is
	// valid for: every name clients and cluster peers dial the brokers by
	// (localhost, 127.0.0.1, broker, n1 ...). A name may start with "*.".
	Hosts []string
	// Validity of the server and client certificates (DefaultValidity
	// when 0; at least an hour, at most MaxValidity).
	Validity time.Duration
	// ClientName is the client certificate's common name (default
	// "jetfabric-client").
	ClientName string
	// Force replaces server and client files that exist; without it
	// Write refuses to overwrite them.
	Force bool
}

// Files are the paths Write wrote, and whether it reused an authority it
// found in the directory.
type Files struct {
	CA, CAKey             string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	ReusedCA              bool
	NotAfter              time.Time // of the server and client certificates
}

// Validate reports the first problem with o.
func (o Options) Validate() error {
	if len(o.Hosts) == 0 {
		return fmt.Errorf("%w: no hosts: the server certificate needs the names clients dial it by, e.g. localhost,127.0.0.1", ErrInvalid)
	}
	for _, h := range o.Hosts {
		if err := checkHost(h); err != nil {
			return err
		}
	}
	if o.Validity != 0 && (o.Validity < time.Hour || o.Validity > MaxValidity) {
		return fmt.Errorf("%w: validity %v; want 1h to %v (10 years)", ErrInvalid, o.Validity, MaxValidity)
	}
	if strings.ContainsAny(o.ClientName, "\x00\r\n") {
		return fmt.Errorf("%w: client name %q has a control character", ErrInvalid, o.ClientName)
	}
	return nil
}

// checkHost accepts an IP address or a DNS name (letters, digits, hyphens
// and dots, labels of 1 to 63 characters, an optional leading "*.").
func checkHost(h string) error {
	if net.ParseIP(h) != nil {
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	bad := func(why string) error {
		return fmt.Errorf("%w: host %q: %s; want a DNS name (broker, n1.example.com) or an IP address", ErrInvalid, h, why)
	}
	if name == "" || len(name) > 253 {
		return bad("empty or over 253 characters")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return bad("a label is empty or over 63 characters")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return bad("a label starts or ends with a hyphen")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return bad(fmt.Sprintf("character %q", c))
			}
		}
	}
	return nil
}

// Write makes what o says in dir (created if missing): an authority, unless
// dir holds one already (ca.pem and ca-key.pem), then the server and client
// certificates signed by it.
func Write(dir string, o Options) (Files, error) {
	if err := o.Validate(); err != nil {
		return Files{}, err
	}
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.ClientName == "" {
		o.ClientName = "jetfabric-client"
	}
	if dir == "" {
		return Files{}, fmt.Errorf("%w: no directory", ErrInvalid)
	}
	f := Files{
		CA: filepath.Join(dir, CAFile), CAKey: filepath.Join(dir, CAKeyFile),
		ServerCert: filepath.Join(dir, ServerCertFile), ServerKey: filepath.Join(dir, ServerKeyFile),
		ClientCert: filepath.Join(dir, ClientCertFile), ClientKey: filepath.Join(dir, ClientKeyFile),
	}
	if !o.Force {
		for _, p := range []string{f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey} {
			if _, err := os.Stat(p); err == nil {
				return Files{}, fmt.Errorf("%w: %s", ErrExists, p)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Files{}, fmt.Errorf("certs: %w", err)
	}
	now := time.Now()
	ca, caKey, reused, err := authority(f.CA, f.CAKey, now)
	if err != nil {
		return Files{}, err
	}
	f.ReusedCA = reused
	f.NotAfter = now.Add(o.Validity)
	if f.NotAfter.After(ca.NotAfter) {
		return Files{}, fmt.Errorf("%w: the authority in %s expires %s, before certificates valid for %v would: remove %s and %s to make a new one",
			ErrInvalid, f.CA, ca.NotAfter.Format(time.DateOnly), o.Validity, CAFile, CAKeyFile)
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: strings.TrimPrefix(o.Hosts[0], "*."), Organization: []string{"jetfabric"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else {
			server.DNSNames = append(server.DNSNames, h)
		}
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: o.ClientName, Organization: []string{"jetfabric"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, leaf := range []struct {
		tmpl      *x509.Certificate
		cert, key string
	}{{server, f.ServerCert, f.ServerKey}, {client, f.ClientCert, f.ClientKey}} {
		if err := issue(leaf.tmpl, ca, caKey, now, f.NotAfter, leaf.cert, leaf.key); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// authority reads the authority in certPath and keyPath, or makes one
// there when neither exists.
func authority(certPath, keyPath string, now time.Time) (*x509.Certificate, crypto.Signer, bool, error) {
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		ca, key, err := readAuthority(certPath, keyPath)
		return ca, key, true, err
	case certErr == nil || keyErr == nil:
		return nil, nil, false, fmt.Errorf("%w: %s and %s must both exist (to reuse the authority) or neither (to make one)", ErrInvalid, certPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "jetfabric CA " + now.UTC().Format("2006-01-02 15:04:05"), Organization: []string{"jetfabric"}},
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	if err := setTimes(tmpl, now, now.Add(CAValidity)); err != nil {
		return nil, nil, false, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: authority: %w", err)
	}
	if err := writePair(certPath, der, keyPath, key); err != nil {
		return nil, nil, false, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: authority: %w", err)
	}
	return ca, key, false, nil
}

func readAuthority(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	cb, err := readPEM(certPath, "CERTIFICATE")
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(cb)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrInvalid, certPath, err)
	}
	if !ca.IsCA {
		return nil, nil, fmt.Errorf("%w: %s is not a CA certificate", ErrInvalid, certPath)
	}
	kb, err := readPEM(keyPath, "EC PRIVATE KEY", "PRIVATE KEY")
	if err != nil {
		return nil, nil, err
	}
	var key crypto.Signer
	if k, err := x509.ParseECPrivateKey(kb); err == nil {
		key = k
	} else if k, err2 := x509.ParsePKCS8PrivateKey(kb); err2 == nil {
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, nil, fmt.Errorf("%w: %s: a %T cannot sign", ErrInvalid, keyPath, k)
		}
		key = s
	} else {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrInvalid, keyPath, err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil || !bytes.Equal(pub, ca.RawSubjectPublicKeyInfo) {
		return nil, nil, fmt.Errorf("%w: %s is not the key of %s", ErrInvalid, keyPath, certPath)
	}
	return ca, key, nil
}

// readPEM returns the first block of one of the types in path.
func readPEM(path string, types ...string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("certs: %w", err)
	}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, fmt.Errorf("%w: %s holds no PEM block of type %s", ErrInvalid, path, strings.Join(types, " or "))
		}
		for _, t := range types {
			if b.Type == t {
				return b.Bytes, nil
			}
		}
	}
}

func issue(tmpl, ca *x509.Certificate, caKey crypto.Signer, now, notAfter time.Time, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := setTimes(tmpl, now, notAfter); err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", certPath, err)
	}
	return writePair(certPath, der, keyPath, key)
}

// setTimes sets a random serial and the validity, starting five minutes
// back for clocks a little behind.
func setTimes(tmpl *x509.Certificate, now, notAfter time.Time) error {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-5 * time.Minute)
	tmpl.NotAfter = notAfter
	return nil
}

func writePair(certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeFile writes data to a temporary file beside path and renames it
// over path, so a reader never sees half a file.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("certs: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
