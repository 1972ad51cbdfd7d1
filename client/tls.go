package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// TLSConfig reads the files of a TLS connection to a broker: caFile holds
// the PEM certificates of the authorities to trust ("": the system's),
// certFile and keyFile a client certificate and its key, for a broker that
// verifies its clients (both or neither). Errors wrap ErrInvalidOption.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		data, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS CA file: %v", ErrInvalidOption, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("%w: TLS CA file %s holds no PEM certificate", ErrInvalidOption, caFile)
		}
		c.RootCAs = pool
	}
	switch {
	case certFile == "" && keyFile == "":
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("%w: a TLS client certificate needs both its certificate file and its key file (got %q and %q)", ErrInvalidOption, certFile, keyFile)
	default:
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: TLS client certificate %s with key %s: %v", ErrInvalidOption, certFile, keyFile, err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("%w: TLS client certificate %s: %v", ErrInvalidOption, certFile, err)
		}
		if now := time.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
			return nil, fmt.Errorf("%w: TLS client certificate %s is valid from %s to %s, not now", ErrInvalidOption, certFile,
				leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
		}
		pair.Leaf = leaf
		c.Certificates = []tls.Certificate{pair}
	}
	return c, nil
}

// WithTLS connects over TLS, trusting the authorities in caFile ("": the
// system's) and presenting the client certificate in certFile and keyFile
// when given (see TLSConfig). Without it the client still meets a broker
// that requires TLS with TLS, trusting the system's authorities only.
func WithTLS(caFile, certFile, keyFile string) Option {
	return func(o *options) error {
		c, err := TLSConfig(caFile, certFile, keyFile)
		if err != nil {
			return err
		}
		o.natsOpts = append(o.natsOpts, nats.Secure(c))
		return nil
	}
}

// What a failed connection most likely means, found by errors.Is on the
// error Connect returns (a *ConnectError).
var (
	// ErrTLSUnknownAuthority: the broker requires TLS and an authority
	// this client does not trust signed its certificate.
	ErrTLSUnknownAuthority = errors.New("client: the broker requires TLS and its certificate is signed by an authority this client does not trust")
	// ErrTLSHost: the broker's certificate is not valid for the host
	// name or address dialled.
	ErrTLSHost = errors.New("client: the broker's certificate is not valid for the host dialled")
	// ErrTLSExpired: the broker's certificate has expired or is not
	// valid yet.
	ErrTLSExpired = errors.New("client: the broker's certificate has expired or is not valid yet")
	// ErrTLSClientCert: the broker verifies client certificates and
	// refused this client's, or its lack of one.
	ErrTLSClientCert = errors.New("client: the broker requires a client certificate signed by an authority it trusts")
	// ErrTLSNotOffered: TLS was asked for, but the broker does not
	// offer it.
	ErrTLSNotOffered = errors.New("client: TLS was asked for but the broker does not offer it")
)

// ConnectError is a failed connection: the URL, what the failure most
// likely means (Cause, one of the ErrTLS… errors, or nil) and the error
// of the NATS client. errors.Is matches both.
type ConnectError struct {
	URL   string
	Cause error
	Err   error
}

func (e *ConnectError) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("client: connect %s: %v", e.URL, e.Err)
	}
	return fmt.Sprintf("client: connect %s: %s (%s): %v", e.URL, strings.TrimPrefix(e.Cause.Error(), "client: "), connectHints[e.Cause], e.Err)
}

// Unwrap returns the cause and the NATS client's error.
func (e *ConnectError) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Cause, e.Err}
}

var connectHints = map[error]string{
	ErrTLSUnknownAuthority: "give the CA certificate that signed it: WithTLS(caFile, ...)",
	ErrTLSHost:             "dial a name the certificate holds, or make one that holds this name",
	ErrTLSExpired:          "renew it, or check the clocks",
	ErrTLSClientCert:       "give a client certificate and key: WithTLS(caFile, certFile, keyFile)",
	ErrTLSNotOffered:       "dial nats:// without TLS options, or start the broker with a certificate",
}

// NewConnectError explains err, the failure of a NATS connection to url
// (of nats.Connect as much as of Connect).
func NewConnectError(url string, err error) *ConnectError {
	var ce *ConnectError
	if errors.As(err, &ce) {
		return ce
	}
	return &ConnectError{URL: url, Cause: connectCause(err), Err: err}
}

func connectCause(err error) error {
	var (
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	msg := err.Error()
	switch {
	case errors.As(err, &unknown):
		return ErrTLSUnknownAuthority
	case errors.As(err, &host):
		return ErrTLSHost
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return ErrTLSExpired
	case errors.Is(err, nats.ErrSecureConnWanted):
		return ErrTLSNotOffered
	// The broker's refusal of a client certificate comes as a TLS alert
	// (TLS 1.2), or, in TLS 1.3, where the client's side of the handshake
	// ends first, as the connection closed right after it.
	case strings.Contains(msg, "tls: certificate required"),
		strings.Contains(msg, "tls: unknown certificate authority"),
		strings.Contains(msg, "tls: bad certificate"),
		strings.Contains(msg, "closed by remote after TLS handshake"):
		return ErrTLSClientCert
	}
	return nil
}
