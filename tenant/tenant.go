package tenant

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// Errors.
var (
	ErrNoDir  = errors.New("tenant: not an auth directory")
	ErrExists = errors.New("tenant: already exists")
	ErrCreds  = errors.New("tenant: bad credentials")
	ErrNone   = errors.New("tenant: no such tenant")
)

// File names inside an auth directory.
const (
	operatorJWT  = "operator.jwt"
	operatorSeed = "operator.nk"
	accountJWT   = "account.jwt"
	accountSeed  = "account.nk"
	sysJWT       = "sys.jwt"
	sysSeed      = "sys.nk"
	serviceCreds = "service.creds"
	tenantsDir   = "tenants"
)

// ServiceCreds is the path of the service user's creds file in dir.
func ServiceCreds(dir string) string { return filepath.Join(dir, serviceCreds) }

// CredsPath is the path of tenant's creds file in dir.
func CredsPath(dir, name string) string { return filepath.Join(dir, name+".creds") }

// Init makes an operator, the fabric's account, the system account and the
// service user in dir (created if missing). It refuses a directory that
// already has an operator (ErrExists): keys are never replaced.
func Init(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, operatorJWT)); err == nil {
		return fmt.Errorf("%w: %s has an operator already", ErrExists, dir)
	}
	if err := os.MkdirAll(filepath.Join(dir, tenantsDir), 0o700); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	op, err := nkeys.CreateOperator()
	if err != nil {
		return fmt.Errorf("tenant: operator key: %w", err)
	}
	opPub, _ := op.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "jetfabric"
	acc, err := nkeys.CreateAccount()
	if err != nil {
		return fmt.Errorf("tenant: account key: %w", err)
	}
	sys, err := nkeys.CreateAccount()
	if err != nil {
		return fmt.Errorf("tenant: account key: %w", err)
	}
	sysPub, _ := sys.PublicKey()
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(op)
	if err != nil {
		return fmt.Errorf("tenant: operator jwt: %w", err)
	}
	accPub, _ := acc.PublicKey()
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "FABRIC"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	accJWT, err := ac.Encode(op)
	if err != nil {
		return fmt.Errorf("tenant: account jwt: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sJWT, err := sc.Encode(op)
	if err != nil {
		return fmt.Errorf("tenant: system account jwt: %w", err)
	}
	svc, _, err := userCreds(acc, "service", nil, time.Time{})
	if err != nil {
		return err
	}
	files := []struct {
		name   string
		data   []byte
		secret bool
	}{
		{operatorJWT, []byte(opJWT), false},
		{operatorSeed, seedOf(op), true},
		{accountJWT, []byte(accJWT), false},
		{accountSeed, seedOf(acc), true},
		{sysJWT, []byte(sJWT), false},
		{sysSeed, seedOf(sys), true},
		{serviceCreds, svc, true},
	}
	for _, f := range files {
		mode := os.FileMode(0o644)
		if f.secret {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, mode); err != nil {
			return fmt.Errorf("tenant: %w", err)
		}
	}
	return nil
}

func seedOf(kp nkeys.KeyPair) []byte {
	s, _ := kp.Seed()
	return s
}

// userCreds mints a user of account acc with permissions (nil: all) and
// returns its creds file and its public key.
func userCreds(acc nkeys.KeyPair, name string, perms *jwt.Permissions, expires time.Time) ([]byte, string, error) {
	u, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", fmt.Errorf("tenant: user key: %w", err)
	}
	upub, _ := u.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = name
	if perms != nil {
		uc.Permissions = *perms
	}
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	tok, err := uc.Encode(acc)
	if err != nil {
		return nil, "", fmt.Errorf("tenant: user jwt %s: %w", name, err)
	}
	seed, _ := u.Seed()
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		return nil, "", fmt.Errorf("tenant: creds %s: %w", name, err)
	}
	return creds, upub, nil
}

// Add makes tenant rec.Name in dir: its account, its record and its
// creds file. The tenant's account (tenants/<name>.acc.jwt, signed by the
// operator) imports from the fabric's account what Imports(names, name)
// lists, and nothing else; its user's JWT carries Permissions(names, name)
// and expires at rec.Expires (zero: never). The fabric's account JWT gets
// the exports the import needs (Exports), signed again with the operator
// key if it lacked them. Every answer the server sends a tenant's request,
// to whatever reply subject it names, is published in the tenant's own
// account. It returns the creds file's path. A tenant that exists is
// refused (ErrExists) unless replace is set (new credentials and quotas,
// the same account; the old credentials stay valid until they expire).
func Add(dir string, names subjects.Names, rec codec.Tenant, replace bool) (string, error) {
	if err := subjects.ValidateTenant(rec.Name); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	if rec.Sessions < 0 || rec.Bytes < 0 || rec.FPS < 0 {
		return "", fmt.Errorf("tenant: %s: negative quota (sessions %d, bytes %d, fps %g)", rec.Name, rec.Sessions, rec.Bytes, rec.FPS)
	}
	recPath := filepath.Join(dir, tenantsDir, rec.Name+".json")
	if _, err := os.Stat(recPath); err == nil && !replace {
		return "", fmt.Errorf("%w: tenant %s in %s", ErrExists, rec.Name, dir)
	}
	seed, err := os.ReadFile(filepath.Join(dir, accountSeed))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v (run jetfabric tenant init first)", ErrNoDir, dir, err)
	}
	acc, err := nkeys.FromSeed(seed)
	if err != nil {
		return "", fmt.Errorf("tenant: %s: %w", accountSeed, err)
	}
	op, err := operatorKey(dir)
	if err != nil {
		return "", err
	}
	fabric, err := exportsFor(dir, op, names)
	if err != nil {
		return "", err
	}
	tacc, err := tenantAccount(dir, op, names, rec.Name, fabric)
	if err != nil {
		return "", err
	}
	perms := Permissions(names, rec.Name)
	creds, upub, err := userCreds(tacc, rec.Name, &perms, rec.Expires)
	if err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, tenantsDir), 0o700); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	signed, err := SignRecord(acc, rec)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(recPath, b, 0o644); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, tenantsDir, rec.Name+".jwt"), []byte(signed), 0o644); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	// Every user key the tenant was given, for Revoke: kept before its
	// creds file is written, so that no credentials go unlisted.
	kf, err := os.OpenFile(keysPath(dir, rec.Name), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	_, err = fmt.Fprintln(kf, upub)
	if cerr := kf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	path := CredsPath(dir, rec.Name)
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		return "", fmt.Errorf("tenant: %w", err)
	}
	return path, nil
}

func keysPath(dir, name string) string { return filepath.Join(dir, tenantsDir, name+".keys") }

// accountPath is the path of tenant name's account JWT in dir, and of
// its seed with ext ".nk".
func accountPath(dir, name, ext string) string {
	return filepath.Join(dir, tenantsDir, name+".acc"+ext)
}

// operatorKey reads the operator's key pair of dir.
func operatorKey(dir string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(filepath.Join(dir, operatorSeed))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDir, dir, err)
	}
	op, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("tenant: %s: %w", operatorSeed, err)
	}
	return op, nil
}

// exportsFor makes sure the fabric's account JWT of dir exports what the
// tenants' accounts import for names, signing it again with op if it did
// not, and returns the account's public key.
func exportsFor(dir string, op nkeys.KeyPair, names subjects.Names) (string, error) {
	tok, err := readJWT(dir, accountJWT)
	if err != nil {
		return "", err
	}
	ac, err := jwt.DecodeAccountClaims(tok)
	if err != nil {
		return "", fmt.Errorf("tenant: %s: %w", accountJWT, err)
	}
	if hasExports(ac, names) {
		return ac.Subject, nil
	}
	for _, e := range Exports(names) {
		if !slices.ContainsFunc(ac.Exports, func(x *jwt.Export) bool { return x.Subject == e.Subject && x.Type == e.Type }) {
			ac.Exports.Add(e)
		}
	}
	if err := writeAccount(filepath.Join(dir, accountJWT), ac, op); err != nil {
		return "", err
	}
	return ac.Subject, nil
}

// tenantAccount makes or updates tenant name's account in dir: its key
// (kept from an earlier Add) and its JWT, signed by op, importing from the
// fabric's account what Imports lists and keeping the revocations it had.
// It returns the account's key pair, which signs the tenant's users.
func tenantAccount(dir string, op nkeys.KeyPair, names subjects.Names, name, fabric string) (nkeys.KeyPair, error) {
	if err := os.MkdirAll(filepath.Join(dir, tenantsDir), 0o700); err != nil {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	var kp nkeys.KeyPair
	seed, err := os.ReadFile(accountPath(dir, name, ".nk"))
	switch {
	case err == nil:
		if kp, err = nkeys.FromSeed(seed); err != nil {
			return nil, fmt.Errorf("tenant: %s: %w", accountPath(dir, name, ".nk"), err)
		}
	case errors.Is(err, os.ErrNotExist):
		if kp, err = nkeys.CreateAccount(); err != nil {
			return nil, fmt.Errorf("tenant: account key: %w", err)
		}
		if err := os.WriteFile(accountPath(dir, name, ".nk"), seedOf(kp), 0o600); err != nil {
			return nil, fmt.Errorf("tenant: %w", err)
		}
	default:
		return nil, fmt.Errorf("tenant: %w", err)
	}
	pub, _ := kp.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	if b, err := os.ReadFile(accountPath(dir, name, ".jwt")); err == nil {
		if old, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b))); err == nil && old.Subject == pub {
			ac.Revocations = old.Revocations
		}
	}
	ac.Name = name
	ac.Imports = Imports(names, name, fabric)
	if err := writeAccount(accountPath(dir, name, ".jwt"), ac, op); err != nil {
		return nil, err
	}
	return kp, nil
}

// writeAccount signs ac with op and writes it to path: whole, then renamed
// over the old file, so that a broker polling the file never reads half of
// it.
func writeAccount(path string, ac *jwt.AccountClaims, op nkeys.KeyPair) error {
	tok, err := ac.Encode(op)
	if err != nil {
		return fmt.Errorf("tenant: account jwt %s: %w", filepath.Base(path), err)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(tok), 0o644); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("tenant: %w", err)
	}
	return nil
}

// Revoke revokes every credential Add has made for tenant name in dir up
// to now: their user keys go into the revocations of the tenant's account
// (and of the fabric's, which signed the users of directories made before
// tenants had accounts of their own), whose JWTs are signed again with the
// operator key. A broker serving dir reads the new JWTs within a second
// (it polls the files), closes the
// tenant's connections and refuses those credentials from then on; the
// tenant's record, bucket and sessions stay (its sessions are freed once
// idle), and Add with replace gives it new credentials. It returns how
// many keys it revoked.
func Revoke(dir, name string) (int, error) {
	if err := subjects.ValidateTenant(name); err != nil {
		return 0, fmt.Errorf("tenant: %w", err)
	}
	d, err := Load(dir)
	if err != nil {
		return 0, err
	}
	var keys []string
	if b, err := os.ReadFile(keysPath(dir, name)); err == nil {
		keys = strings.Fields(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("tenant: %w", err)
	}
	// The creds file in place, for a directory older than the keys file.
	if b, err := os.ReadFile(CredsPath(dir, name)); err == nil {
		tok, _, err := ParseCreds(b)
		if err != nil {
			return 0, fmt.Errorf("tenant: %s: %w", CredsPath(dir, name), err)
		}
		uc, err := jwt.DecodeUserClaims(tok)
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %v", ErrCreds, CredsPath(dir, name), err)
		}
		if uc.Name != name {
			return 0, fmt.Errorf("%w: %s holds the credentials of %q", ErrCreds, CredsPath(dir, name), uc.Name)
		}
		if !slices.Contains(keys, uc.Subject) {
			keys = append(keys, uc.Subject)
		}
	}
	if len(keys) == 0 {
		return 0, fmt.Errorf("%w: %s has no credentials of tenant %s", ErrNone, dir, name)
	}
	op, err := operatorKey(dir)
	if err != nil {
		return 0, err
	}
	for _, k := range keys {
		if !nkeys.IsValidPublicUserKey(k) {
			return 0, fmt.Errorf("tenant: %s: %q is not a user key", keysPath(dir, name), k)
		}
	}
	// The tenant's account signs its users; the fabric's account signed
	// those of a directory made before tenants had accounts of their own.
	paths := []string{filepath.Join(dir, accountJWT)}
	if _, err := os.Stat(accountPath(dir, name, ".jwt")); err == nil {
		paths = append(paths, accountPath(dir, name, ".jwt"))
	}
	now := time.Now()
	for _, path := range paths {
		_, ac, err := readAccount(filepath.Dir(path), filepath.Base(path), d.Operator)
		if err != nil {
			return 0, err
		}
		for _, k := range keys {
			ac.RevokeAt(k, now)
		}
		if err := writeAccount(path, ac, op); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

// Accounts reads every account JWT of dir (the fabric's, the system
// account's, each tenant's), each checked to be signed by operator, and
// returns them by public key.
func Accounts(dir string, operator *jwt.OperatorClaims) (map[string]string, error) {
	files := []string{accountJWT, sysJWT}
	entries, err := os.ReadDir(filepath.Join(dir, tenantsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".acc.jwt") {
			files = append(files, filepath.Join(tenantsDir, e.Name()))
		}
	}
	accounts := map[string]string{}
	for _, f := range files {
		tok, ac, err := readAccount(dir, f, operator)
		if err != nil {
			return nil, err
		}
		accounts[ac.Subject] = tok
	}
	return accounts, nil
}

// readJWT reads the JWT in file name of auth directory dir.
func readJWT(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v (make one with jetfabric tenant init)", ErrNoDir, dir, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// readAccount reads the account JWT in file name of dir, checked to be
// signed by operator.
func readAccount(dir, name string, operator *jwt.OperatorClaims) (string, *jwt.AccountClaims, error) {
	tok, err := readJWT(dir, name)
	if err != nil {
		return "", nil, err
	}
	ac, err := jwt.DecodeAccountClaims(tok)
	if err != nil {
		return "", nil, fmt.Errorf("tenant: %s: %w", name, err)
	}
	if ac.Issuer != operator.Subject {
		return "", nil, fmt.Errorf("tenant: %s is not signed by the operator of %s", name, operatorJWT)
	}
	return tok, ac, nil
}

// Dir is an auth directory as the broker reads it.
type Dir struct {
	// Operator is the operator's JWT, decoded.
	Operator *jwt.OperatorClaims
	// Accounts maps account public keys to their JWTs (the fabric's, the
	// system account's and the tenants'), for a memory resolver.
	Accounts map[string]string
	// Account and System are the public keys of the fabric's account and
	// the system account.
	Account, System string
	// ServiceJWT and ServiceSeed are the service user's credentials.
	ServiceJWT  string
	ServiceSeed []byte
	// Tenants are the tenants' records, sorted by name, and Signed the
	// same records signed by the account (see SignRecord), by name.
	Tenants []codec.Tenant
	Signed  map[string]string
}

// Load reads an auth directory made by Init and Add.
func Load(dir string) (*Dir, error) {
	opTok, err := readJWT(dir, operatorJWT)
	if err != nil {
		return nil, err
	}
	op, err := jwt.DecodeOperatorClaims(opTok)
	if err != nil {
		return nil, fmt.Errorf("tenant: %s: %w", operatorJWT, err)
	}
	d := &Dir{Operator: op, Signed: map[string]string{}}
	for _, f := range []struct {
		name string
		pub  *string
	}{{accountJWT, &d.Account}, {sysJWT, &d.System}} {
		_, ac, err := readAccount(dir, f.name, op)
		if err != nil {
			return nil, err
		}
		*f.pub = ac.Subject
	}
	if d.Accounts, err = Accounts(dir, op); err != nil {
		return nil, err
	}
	creds, err := os.ReadFile(ServiceCreds(dir))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoDir, dir, err)
	}
	if d.ServiceJWT, d.ServiceSeed, err = ParseCreds(creds); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(dir, tenantsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tenant: %w", err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, tenantsDir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("tenant: %w", err)
		}
		var rec codec.Tenant
		if err := json.Unmarshal(b, &rec); err != nil || rec.Name != name {
			return nil, fmt.Errorf("tenant: record %s: not a record of tenant %s (%v)", e.Name(), name, err)
		}
		signed, err := os.ReadFile(filepath.Join(dir, tenantsDir, name+".jwt"))
		if err != nil {
			return nil, fmt.Errorf("tenant: signed record of %s: %w", name, err)
		}
		if _, _, err := VerifyRecord(signed, d.Account, name); err != nil {
			return nil, fmt.Errorf("tenant: %s: %w", name, err)
		}
		d.Tenants = append(d.Tenants, rec)
		d.Signed[name] = strings.TrimSpace(string(signed))
	}
	slices.SortFunc(d.Tenants, func(a, b codec.Tenant) int { return strings.Compare(a.Name, b.Name) })
	return d, nil
}

// ParseCreds returns the JWT and the seed of a creds file.
func ParseCreds(creds []byte) (token string, seed []byte, err error) {
	if token, err = jwt.ParseDecoratedJWT(creds); err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrCreds, err)
	}
	kp, err := jwt.ParseDecoratedNKey(creds)
	if err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrCreds, err)
	}
	if seed, err = kp.Seed(); err != nil {
		return "", nil, fmt.Errorf("%w: %v", ErrCreds, err)
	}
	return token, seed, nil
}

// NameOf is the tenant a creds file is for ("" for the service user), as
// its JWT names it, and when the JWT expires (zero: never).
func NameOf(creds []byte) (name string, expires time.Time, err error) {
	tok, _, err := ParseCreds(creds)
	if err != nil {
		return "", time.Time{}, err
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %v", ErrCreds, err)
	}
	if uc.Expires > 0 {
		expires = time.Unix(uc.Expires, 0)
	}
	if uc.Name == "service" && uc.Permissions.Pub.Empty() {
		return "", expires, nil
	}
	return uc.Name, expires, nil
}
