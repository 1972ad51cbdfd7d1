package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// runTenant makes the credentials of a fabric with tenants: init once,
// then add a tenant at a time.
func runTenant(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		h := helps["tenant"]
		fmt.Fprintf(stderr, "jetfabric tenant: %s\n\nExamples:\n", h.what)
		for _, e := range h.examples {
			fmt.Fprintf(stderr, "  %s\n", e)
		}
		fmt.Fprintf(stderr, "\nUsage:\n  jetfabric tenant init --dir DIR\n  jetfabric tenant add NAME --dir DIR [--sessions N --bytes SIZE --fps F --expires DUR --url URL]\n  jetfabric tenant list --dir DIR\n  jetfabric tenant revoke NAME --dir DIR\n")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return flag.ErrHelp
		}
		return errUsage
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("tenant "+sub, flag.ContinueOnError)
	dir := fs.String("dir", os.Getenv("JETFABRIC_AUTH"), "auth directory (env JETFABRIC_AUTH)")
	switch sub {
	case "init":
		if err := parse(fs, args, stderr); err != nil {
			return err
		}
		if *dir == "" {
			return errors.New("--dir is required")
		}
		if err := tenant.Init(*dir); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "auth directory %s: operator, account and %s; start the broker with --auth %s, workers with --creds %s\n",
			*dir, tenant.ServiceCreds(*dir), *dir, tenant.ServiceCreds(*dir))
		return nil
	case "list":
		if err := parse(fs, args, stderr); err != nil {
			return err
		}
		d, err := tenant.Load(*dir)
		if err != nil {
			return err
		}
		for _, t := range d.Tenants {
			exp := "never"
			if !t.Expires.IsZero() {
				exp = t.Expires.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(stdout, "%s\tsessions %d\tbytes %d\tfps %g\texpires %s\n", t.Name, t.Sessions, t.Bytes, t.FPS, exp)
		}
		return nil
	case "revoke":
		var name string
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			name, args = args[0], args[1:]
		}
		if err := parse(fs, args, stderr); err != nil {
			return err
		}
		if name == "" || *dir == "" || fs.NArg() > 0 {
			return errors.New("usage: jetfabric tenant revoke NAME --dir DIR")
		}
		n, err := tenant.Revoke(*dir, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "tenant %s: %d credentials revoked in %s; a broker serving it closes their connections within a second (new ones: jetfabric tenant add %s --replace)\n", name, n, *dir, name)
		return nil
	case "add":
	default:
		fmt.Fprintf(stderr, "jetfabric tenant: unknown subcommand %q (init, add, list, revoke)\n", sub)
		return errUsage
	}
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	sessions := fs.Int("sessions", 0, "live sessions of the tenant on all devices together (0: no quota)")
	size := fs.String("bytes", "", "tensor bytes the tenant may hold on all devices together, and the size of its object bucket, e.g. 4GiB (empty: no quota)")
	fps := fs.Float64("fps", 0, "frames per second of all the tenant's sessions on all devices together (0: no quota)")
	expires := fs.Duration("expires", 0, "the credentials expire this long from now (0: never)")
	prefix := fs.String("prefix", subjects.DefaultPrefix, "the fabric's subject prefix")
	replace := fs.Bool("replace", false, "replace an existing tenant's credentials and quotas")
	url := fs.String("url", "", "a running broker to provision the tenant on now (its bucket and record), as the service user; without it the broker provisions the tenants of --auth when it starts")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if name == "" || *dir == "" {
		return errors.New("usage: jetfabric tenant add NAME --dir DIR")
	}
	names, err := subjects.New(*prefix)
	if err != nil {
		return err
	}
	rec := codec.Tenant{Name: name, Sessions: *sessions, FPS: *fps}
	if *size != "" {
		if rec.Bytes, _, err = parseBudget(*size); err != nil || strings.HasSuffix(*size, "%") {
			return fmt.Errorf("--bytes %q: a size such as 4GiB", *size)
		}
	}
	if *expires < 0 {
		return fmt.Errorf("--expires %v: negative", *expires)
	}
	if *expires > 0 {
		rec.Expires = time.Now().Add(*expires).UTC().Truncate(time.Second)
	}
	path, err := tenant.Add(*dir, names, rec, *replace)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s: credentials in %s\n", name, path)
	if *url == "" {
		return nil
	}
	d, err := tenant.Load(*dir)
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*url, broker.ServiceUser(d), nats.Name("jetfabric-tenant"))
	if err != nil {
		return fmt.Errorf("provision on %s: %w", *url, connectError(*url, err))
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The tenant's account, and the fabric's with its exports, in force
	// on the broker now: its credentials work at once.
	resp, err := nc.RequestWithContext(pctx, names.ServiceAccounts(), []byte(strings.Join(slices.Collect(maps.Values(d.Accounts)), "\n")))
	if err == nil {
		if msg := resp.Header.Get("Nats-Service-Error"); msg != "" {
			err = errors.New(msg)
		}
	}
	if err != nil {
		return fmt.Errorf("provision on %s: the accounts: %w", *url, err)
	}
	p := broker.DefaultProvision()
	if err := broker.ProvisionTenant(pctx, js, names, p, rec, d.Signed[name]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tenant %s: provisioned on %s (bucket %s)\n", name, *url, names.TenantXferBucket(name))
	return nil
}
