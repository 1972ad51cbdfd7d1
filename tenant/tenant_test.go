package tenant_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
)

func TestDirectory(t *testing.T) {
	dir := t.TempDir()
	if _, err := tenant.Load(dir); !errors.Is(err, tenant.ErrNoDir) {
		t.Errorf("load of an empty directory: %v", err)
	}
	if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "a"}, false); !errors.Is(err, tenant.ErrNoDir) {
		t.Errorf("add before init: %v", err)
	}
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	if err := tenant.Init(dir); !errors.Is(err, tenant.ErrExists) {
		t.Errorf("second init: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "account.nk")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("account seed: %v %v", fi.Mode(), err)
	}
	for _, bad := range []codec.Tenant{{Name: ""}, {Name: "a.b"}, {Name: "a>"}, {Name: "x", Sessions: -1}, {Name: "x", Bytes: -1}, {Name: "x", FPS: -1}} {
		if _, err := tenant.Add(dir, subjects.Default(), bad, false); err == nil {
			t.Errorf("tenant %+v accepted", bad)
		}
	}
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	path, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme", Sessions: 3, Expires: exp}, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, false); !errors.Is(err, tenant.ErrExists) {
		t.Errorf("second add: %v", err)
	}
	if _, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme", Sessions: 4}, true); err != nil {
		t.Errorf("replace: %v", err)
	}
	creds, _ := os.ReadFile(path)
	name, _, err := tenant.NameOf(creds)
	if err != nil || name != "acme" {
		t.Errorf("name of acme's creds: %q %v", name, err)
	}
	svc, _ := os.ReadFile(tenant.ServiceCreds(dir))
	if name, exp, err := tenant.NameOf(svc); err != nil || name != "" || !exp.IsZero() {
		t.Errorf("name of the service creds: %q %v %v", name, exp, err)
	}
	if _, _, err := tenant.NameOf([]byte("junk")); !errors.Is(err, tenant.ErrCreds) {
		t.Errorf("junk creds: %v", err)
	}
	d, err := tenant.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Tenants) != 1 || d.Tenants[0].Sessions != 4 || d.Signed["acme"] == "" {
		t.Errorf("loaded tenants %+v", d.Tenants)
	}
	// acme's user is signed by an account of its own, which the operator
	// signed and which imports acme's subjects from the fabric's account,
	// nobody else's; the fabric's account exports them.
	issuer, err := tenant.Issuer(creds)
	if err != nil || issuer == d.Account || d.Accounts[issuer] == "" {
		t.Fatalf("issuer %s of acme's creds (fabric %s, accounts %v): %v", issuer, d.Account, d.Accounts, err)
	}
	ac, err := jwt.DecodeAccountClaims(d.Accounts[issuer])
	if err != nil || ac.Issuer != d.Operator.Subject || ac.Name != "acme" || len(ac.Imports) == 0 {
		t.Fatalf("acme's account %+v: %v", ac, err)
	}
	for _, im := range ac.Imports {
		if im.Account != d.Account || !strings.Contains(string(im.Subject), "acme") && !strings.Contains(string(im.Subject), "device") &&
			!strings.HasPrefix(string(im.Subject), "fabric.svc.") && string(im.Subject) != "fabric.telemetry.*" {
			t.Errorf("acme imports %s from %s", im.Subject, im.Account)
		}
	}
	fc, err := jwt.DecodeAccountClaims(d.Accounts[d.Account])
	if err != nil {
		t.Fatal(err)
	}
	var vr jwt.ValidationResults
	fc.Validate(&vr)
	ac.Validate(&vr)
	if len(vr.Issues) != 0 {
		t.Errorf("account JWTs: %v", vr.Issues)
	}
	for _, im := range ac.Imports {
		if !slices.ContainsFunc(fc.Exports, func(e *jwt.Export) bool { return e.Type == im.Type && im.Subject.IsContainedIn(e.Subject) }) {
			t.Errorf("acme imports %s %s, which the fabric's account does not export", im.Type, im.Subject)
		}
	}
	if rec, _, err := tenant.VerifyRecord([]byte(d.Signed["acme"]), d.Account, "acme"); err != nil || rec.Sessions != 4 {
		t.Errorf("acme's signed record: %+v %v", rec, err)
	}
	// A record signed by another key is not the fabric's.
	other, _ := nkeys.CreateAccount()
	forged, err := tenant.SignRecord(other, codec.Tenant{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := tenant.VerifyRecord([]byte(forged), d.Account, "acme"); !errors.Is(err, tenant.ErrRecord) {
		t.Errorf("a record signed by another account: %v", err)
	}
	// A tampered record file stops the directory from loading.
	if err := os.WriteFile(filepath.Join(dir, "tenants", "acme.jwt"), []byte(forged), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.Load(dir); err == nil {
		t.Error("a directory with a forged record loaded")
	}
}

func TestPermissions(t *testing.T) {
	p := tenant.Permissions(subjects.Default(), "acme")
	for _, want := range []string{"fabric.t.acme.>", "$O.FABRIC_XFER_acme.>", "fabric.svc.registry"} {
		if !slices.Contains(p.Pub.Allow, want) {
			t.Errorf("acme may not publish to %s", want)
		}
	}
	if !slices.Contains(p.Sub.Allow, "_INBOX_fabric.t.acme.>") {
		t.Error("acme may not subscribe to its inbox")
	}
	// Nothing wider than the tenant's own namespace: no bare wildcard, no
	// other tenant's subjects, no consumer on a shared stream.
	for _, s := range append(slices.Clone(p.Pub.Allow), p.Sub.Allow...) {
		if s == ">" || strings.HasPrefix(s, "$JS.API.>") || strings.Contains(s, ".t.*.") || strings.HasPrefix(s, "$SRV") {
			t.Errorf("permission %q is too wide", s)
		}
		if strings.HasPrefix(s, "$JS.API.CONSUMER.") && !strings.Contains(s, "OBJ_FABRIC_XFER_acme") {
			t.Errorf("a consumer on a stream acme does not own: %q", s)
		}
	}
}

// TestRevoke: Revoke puts every key a tenant was given into the account
// JWT's revocations, and nobody else's; bad input changes nothing.
func TestRevoke(t *testing.T) {
	dir := t.TempDir()
	if _, err := tenant.Revoke(dir, "acme"); !errors.Is(err, tenant.ErrNoDir) {
		t.Errorf("revoke before init: %v", err)
	}
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	var acme []string
	for _, replace := range []bool{false, true} {
		path, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, replace)
		if err != nil {
			t.Fatal(err)
		}
		acme = append(acme, userOf(t, path).Subject)
	}
	bobPath, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "bob"}, false)
	if err != nil {
		t.Fatal(err)
	}
	bob := userOf(t, bobPath).Subject
	d0, err := tenant.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "a.b", "nobody"} {
		if _, err := tenant.Revoke(dir, bad); err == nil {
			t.Errorf("revoke of %q succeeded", bad)
		}
	}
	if _, err := tenant.Revoke(dir, "nobody"); !errors.Is(err, tenant.ErrNone) {
		t.Errorf("revoke of an unknown tenant: %v", err)
	}
	if n, err := tenant.Revoke(dir, "acme"); err != nil || n != 2 {
		t.Fatalf("revoke acme: %d keys, %v", n, err)
	}
	accounts, err := tenant.Accounts(dir, d0.Operator)
	if err != nil {
		t.Fatal(err)
	}
	// acme's users are signed by acme's own account, which keeps its key
	// when its credentials are replaced; the fabric's account revokes the
	// keys too (it signed the users of older directories).
	acmeAcc, bobAcc := userOf(t, tenant.CredsPath(dir, "acme")).Issuer, userOf(t, tenant.CredsPath(dir, "bob")).Issuer
	if acmeAcc == d0.Account || acmeAcc == bobAcc {
		t.Fatalf("acme's users are signed by %s (fabric %s, bob %s)", acmeAcc, d0.Account, bobAcc)
	}
	for _, acc := range []string{acmeAcc, d0.Account} {
		if accounts[acc] == d0.Accounts[acc] {
			t.Errorf("the JWT of account %s did not change", acc)
		}
		ac, err := jwt.DecodeAccountClaims(accounts[acc])
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range acme {
			if _, ok := ac.Revocations[k]; !ok {
				t.Errorf("acme's key %s is not revoked by %s: %v", k, acc, ac.Revocations)
			}
		}
		if _, ok := ac.Revocations[bob]; ok || len(ac.Revocations) != 2 {
			t.Errorf("revocations %v: want acme's two keys only", ac.Revocations)
		}
	}
	if accounts[bobAcc] != d0.Accounts[bobAcc] {
		t.Error("bob's account JWT changed")
	}
	// The directory still loads, and Accounts refuses a JWT that is not
	// signed by the operator.
	d, err := tenant.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(accounts[acmeAcc])
	if err != nil {
		t.Fatal(err)
	}
	op, _ := nkeys.CreateOperator()
	forged, err := ac.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"account.jwt", "tenants/acme.acc.jwt"} {
		for _, bad := range []string{"junk", forged} {
			path := filepath.Join(dir, f)
			good, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := tenant.Accounts(dir, d.Operator); err == nil {
				t.Errorf("Accounts took %.20q in %s", bad, f)
			}
			if err := os.WriteFile(path, good, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// userOf is the user JWT's claims of the creds file at path.
func userOf(t *testing.T, path string) *jwt.UserClaims {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := tenant.ParseCreds(b)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}
