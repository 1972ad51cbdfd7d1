package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jetfabric/jetfabric/internal/certs"
)

func runCerts(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("certs", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory to write the files to (created if missing; required)")
	hosts := fs.String("hosts", "localhost,127.0.0.1", "comma-separated DNS names and IP addresses the server certificate is valid for: every name clients and cluster peers dial the brokers by")
	validity := fs.String("validity", "365d", "how long the server and client certificates are valid: days (90d) or a Go duration (720h); 1h to 3650d")
	clientName := fs.String("client-name", "jetfabric-client", "common name of the client certificate")
	force := fs.Bool("force", false, "replace the server and client files if they exist (the authority is kept)")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *dir == "" {
		return fmt.Errorf("-dir is required: where to write ca.pem and the certificates")
	}
	d, err := parseValidity(*validity)
	if err != nil {
		return err
	}
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	f, err := certs.Write(*dir, certs.Options{Hosts: hs, Validity: d, ClientName: *clientName, Force: *force})
	if errors.Is(err, certs.ErrExists) {
		return fmt.Errorf("%w: pass --force to replace the server and client certificates (ca.pem is kept, so clients that trust it go on trusting the new ones)", err)
	}
	if err != nil {
		return err
	}
	ca := "a new authority"
	if f.ReusedCA {
		ca = "the authority found there"
	}
	fmt.Fprintf(stdout, "jetfabric certs: wrote to %s, signed by %s, valid until %s:\n", *dir, ca, f.NotAfter.UTC().Format(time.DateOnly))
	fmt.Fprintf(stdout, "  %-28s the authority (keep %s private: it signs more certificates)\n", certs.CAFile+", "+certs.CAKeyFile, certs.CAKeyFile)
	fmt.Fprintf(stdout, "  %-28s the brokers' certificate and key, for %s\n", certs.ServerCertFile+", "+certs.ServerKeyFile, strings.Join(hs, ", "))
	fmt.Fprintf(stdout, "  %-28s a client certificate and key (CN %s)\n", certs.ClientCertFile+", "+certs.ClientKeyFile, *clientName)
	fmt.Fprintf(stdout, "Use them:\n  jetfabric broker --tls-cert %s --tls-key %s --tls-ca %s [--tls-verify] ...\n  jetfabric worker --tls-ca %s [--tls-cert %s --tls-key %s] ...\n",
		f.ServerCert, f.ServerKey, f.CA, f.CA, f.ClientCert, f.ClientKey)
	return nil
}

// parseValidity reads -validity: whole days with a d suffix, or a Go
// duration.
func parseValidity(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days <= 0 {
			return 0, fmt.Errorf("-validity %q: want a number of days such as 365d, or a duration such as 720h", s)
		}
		return time.Duration(days) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("-validity %q: want a number of days such as 365d, or a duration such as 720h", s)
	}
	return d, nil
}
