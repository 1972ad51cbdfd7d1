package broker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

// operatorMode configures opts from the auth directory: the operator
// trusted, the fabric's and the system account preloaded in a memory
// resolver. Every user then authenticates with a JWT signed by the
// fabric's account: the service user, or a tenant.
func operatorMode(opts *server.Options, d *tenant.Dir) (*server.MemAccResolver, error) {
	res := &server.MemAccResolver{}
	for pub, tok := range d.Accounts {
		if err := res.Store(pub, tok); err != nil {
			return nil, fmt.Errorf("%w: account %s: %v", ErrInvalidConfig, pub, err)
		}
	}
	opts.TrustedOperators = append(opts.TrustedOperators, d.Operator)
	opts.AccountResolver = res
	opts.SystemAccount = d.System
	return res, nil
}

// accountPoll is how often the broker reads the auth directory's account
// JWTs again.
var accountPoll = time.Second

// watchAccount applies the auth directory's account JWTs whenever one
// changes or a new one appears (tenant.Add writes a tenant's, tenant.Revoke
// writes revocations), until stop is closed: the server takes the new
// claims, which closes the connections of revoked users and refuses their
// credentials from then on. A directory whose JWTs do not verify is logged
// and left unapplied; the claims in force stay.
func (b *Broker) watchAccount(stop <-chan struct{}) {
	var refused string
	t := time.NewTicker(accountPoll)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		accounts, err := tenant.Accounts(b.cfg.AuthDir, b.auth.Operator)
		if err == nil {
			_, err = b.applyAccounts(slices.Collect(maps.Values(accounts)))
		}
		if err != nil {
			if msg := err.Error(); msg != refused {
				refused = msg
				b.srv.Warnf("jetfabric: account JWTs of %s not applied: %v", b.cfg.AuthDir, err)
			}
			continue
		}
		refused = ""
	}
}

// applyAccounts applies the account JWTs toks, each signed by the
// operator: an account's JWT that differs from the one in force goes into
// the resolver and the server takes its claims. It returns how many it
// applied; a JWT that is not the operator's is an error, after the others
// are applied.
func (b *Broker) applyAccounts(toks []string) (int, error) {
	b.accMu.Lock()
	defer b.accMu.Unlock()
	n := 0
	var errs []error
	type account struct {
		tok string
		ac  *jwt.AccountClaims
	}
	var accs []account
	for _, tok := range toks {
		ac, err := jwt.DecodeAccountClaims(tok)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		accs = append(accs, account{tok, ac})
	}
	// The accounts that export first: an account put in force before the
	// exports it imports lets its users connect to imports that answer
	// nothing (no responders) until the exporter's turn comes.
	slices.SortStableFunc(accs, func(a, b account) int { return cmp.Compare(len(b.ac.Exports), len(a.ac.Exports)) })
	for _, a := range accs {
		tok, ac := a.tok, a.ac
		if ac.Issuer != b.auth.Operator.Subject {
			errs = append(errs, fmt.Errorf("account %s (%s): not signed by the operator", ac.Name, ac.Subject))
			continue
		}
		pub := ac.Subject
		if b.applied[pub] == tok {
			continue
		}
		if err := b.resolver.Store(pub, tok); err != nil {
			errs = append(errs, fmt.Errorf("account %s: %w", pub, err))
			continue
		}
		acc, err := b.srv.LookupAccount(pub)
		if err != nil {
			errs = append(errs, fmt.Errorf("account %s: %w", pub, err))
			continue
		}
		b.srv.UpdateAccountClaims(acc, ac)
		b.applied[pub] = tok
		b.reloads.Add(1)
		n++
		b.srv.Noticef("jetfabric: account JWT %s (%s) applied: %d revoked keys", ac.Name, pub, len(ac.Revocations))
	}
	return n, errors.Join(errs...)
}

// serveAccounts applies the account JWTs that the service user sends on
// names.ServiceAccounts (jetfabric tenant add --url: one JWT a line), so
// that a tenant added while the broker runs can connect at once instead
// of after the next read of the directory; it answers how many it applied,
// or the error. Every node of a cluster applies them.
func (b *Broker) serveAccounts(nc *nats.Conn) error {
	_, err := nc.Subscribe(b.names.ServiceAccounts(), func(m *nats.Msg) {
		n, err := b.applyAccounts(strings.Fields(string(m.Data)))
		if err != nil {
			h := nats.Header{}
			h.Set("Nats-Service-Error", err.Error())
			h.Set("Nats-Service-Error-Code", "400")
			_ = m.RespondMsg(&nats.Msg{Header: h})
			return
		}
		_ = m.Respond([]byte(strconv.Itoa(n)))
	})
	if err != nil {
		return fmt.Errorf("broker: serve %s: %w", b.names.ServiceAccounts(), err)
	}
	return nil
}

// AccountReloads is how many times the broker has applied a changed or new
// account JWT from its auth directory (see tenant.Add and tenant.Revoke).
func (b *Broker) AccountReloads() uint64 { return b.reloads.Load() }

// violations counts what the server reports of refused clients: its log
// lines for publish and subscribe permission violations and for failed
// authentications, the only place nats-server reports them one by one.
type violations struct {
	inner            server.Logger // the server's own logger, or nil
	pub, sub, authen atomic.Uint64
}

func (v *violations) Noticef(format string, a ...any) {
	if v.inner != nil {
		v.inner.Noticef(format, a...)
	}
}
func (v *violations) Warnf(format string, a ...any) {
	if v.inner != nil {
		v.inner.Warnf(format, a...)
	}
}
func (v *violations) Fatalf(format string, a ...any) {
	if v.inner != nil {
		v.inner.Fatalf(format, a...)
	}
}
func (v *violations) Debugf(format string, a ...any) {
	if v.inner != nil {
		v.inner.Debugf(format, a...)
	}
}
func (v *violations) Tracef(format string, a ...any) {
	if v.inner != nil {
		v.inner.Tracef(format, a...)
	}
}

// Errorf counts the violations: the server's client logger prefixes
// "cid:N - " and the message begins "Publish Violation", "Subscription
// Violation" or "authentication error".
func (v *violations) Errorf(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	switch {
	case strings.Contains(msg, "Publish Violation"):
		v.pub.Add(1)
	case strings.Contains(msg, "Subscription Violation"):
		v.sub.Add(1)
	case strings.Contains(msg, server.ErrAuthentication.Error()):
		v.authen.Add(1)
	}
	if v.inner != nil {
		v.inner.Errorf("%s", msg)
	}
}

// serveRegistry answers the registry requests of tenants, who may not
// read the control bucket's stream, with every device's entry, until the
// connection closes; the same connection serves the accounts service
// (serveAccounts). The nodes of a cluster share the queue group: one
// answers.
func (b *Broker) serveRegistry() error {
	nc, err := b.Connect(nats.Name("jetfabric-registry"))
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return fmt.Errorf("broker: %w", err)
	}
	_, err = nc.QueueSubscribe(b.names.ServiceRegistry(), "jetfabric-registry", func(m *nats.Msg) {
		if !b.names.Answerable(m.Reply) {
			return // see subjects.Names.Answerable
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		entries, err := registry(ctx, js, b.names)
		if err != nil {
			h := nats.Header{}
			h.Set("Nats-Service-Error", err.Error())
			h.Set("Nats-Service-Error-Code", "503")
			_ = m.RespondMsg(&nats.Msg{Header: h})
			return
		}
		_ = m.Respond(entries)
	})
	if err != nil {
		nc.Close()
		return fmt.Errorf("broker: serve %s: %w", b.names.ServiceRegistry(), err)
	}
	if err := b.serveAccounts(nc); err != nil {
		nc.Close()
		return err
	}
	b.mu.Lock()
	b.registryConn = nc
	b.mu.Unlock()
	return nil
}

// registry is every registry entry, as a JSON array.
func registry(ctx context.Context, js jetstream.JetStream, names subjects.Names) ([]byte, error) {
	kv, err := js.KeyValue(ctx, names.CtrlBucket())
	if err != nil {
		return nil, err
	}
	// A watch reads the entries through a consumer, which the stream's
	// leader serves: a key-value get is a direct get, which any replica
	// answers, perhaps one that has not caught up since it started again.
	w, err := kv.WatchFiltered(ctx, []string{subjects.DeviceKeys}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	entries := []json.RawMessage{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("registry watch ended")
			}
			if e == nil { // the current entries are all in
				return json.Marshal(entries)
			}
			if json.Valid(e.Value()) {
				entries = append(entries, e.Value())
			}
		}
	}
}

// Violations are the refusals counted since the broker started.
type Violations struct {
	Publish, Subscribe, Authentication uint64
}

// Violations reports the permission violations and failed authentications
// the server has refused since start (all zero without an auth directory).
func (b *Broker) Violations() Violations {
	if b.viol == nil {
		return Violations{}
	}
	return Violations{Publish: b.viol.pub.Load(), Subscribe: b.viol.sub.Load(), Authentication: b.viol.authen.Load()}
}

// ServiceOptions are the nats.Options that authenticate a connection to
// this broker as the service user: none without an auth directory.
func (b *Broker) ServiceOptions() []nats.Option {
	if b.auth == nil {
		return nil
	}
	return []nats.Option{ServiceUser(b.auth)}
}

// AccountKey is the public key of the fabric's account ("" without an
// auth directory): workers accept the tenant records it signed.
func (b *Broker) AccountKey() string {
	if b.auth == nil {
		return ""
	}
	return b.auth.Account
}

// Tenants are the tenants of the auth directory as read at New.
func (b *Broker) Tenants() []codec.Tenant {
	if b.auth == nil {
		return nil
	}
	return b.auth.Tenants
}

// ProvisionTenant creates or updates tenant rec's object bucket,
// FABRIC_XFER_<tenant> (its max bytes the tenant's byte quota, or none
// without one; its TTL the transfer bucket's), and writes its signed record (tenant.SignRecord)
// under tenant.<name> in the control bucket, where workers read its
// quotas. Idempotent.
func ProvisionTenant(ctx context.Context, js jetstream.JetStream, names subjects.Names, p Provision, rec codec.Tenant, signed string) error {
	if err := subjects.ValidateTenant(rec.Name); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	bucket := names.TenantXferBucket(rec.Name)
	// A byte quota bounds the bucket (JetStream reserves it in the
	// server's storage); without one the bucket is unbounded, as the
	// tenant is.
	max := int64(-1)
	if rec.Bytes > 0 {
		max = rec.Bytes
	}
	_, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      bucket,
		Description: "jetfabric objects of tenant " + rec.Name + ": uploads and large results",
		TTL:         p.XferTTL,
		MaxBytes:    max,
		Storage:     p.XferStorage,
		Replicas:    p.Replicas,
	})
	if err != nil {
		return fmt.Errorf("broker: provision bucket %s: %w", bucket, err)
	}
	kv, err := js.KeyValue(ctx, names.CtrlBucket())
	if err != nil {
		return fmt.Errorf("broker: bucket %s: %w", names.CtrlBucket(), err)
	}
	if _, err := kv.Put(ctx, subjects.TenantKey(rec.Name), []byte(signed)); err != nil {
		return fmt.Errorf("broker: tenant record %s: %w", rec.Name, err)
	}
	return nil
}
