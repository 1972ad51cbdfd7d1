package tenant

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/codec"
)

// ErrRecord: a tenant record that is not one the fabric's account signed.
var ErrRecord = errors.New("tenant: not a valid tenant record")

// A tenant's record travels signed: a JWT issued by the fabric's account
// key, its subject the tenant's name, its claim "nats" holding the record
// under "tenant". Workers accept only records the account signed, so a
// value written into the control bucket by anyone else changes nothing:
// tenants cannot write there (their accounts import nothing of it, and the
// server's answers to their requests stay in their accounts), and a
// directory made before tenants had accounts of their own let them.

// SignRecord signs rec with the account key pair acc.
func SignRecord(acc nkeys.KeyPair, rec codec.Tenant) (string, error) {
	b, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	gc := jwt.NewGenericClaims(rec.Name)
	gc.Data["tenant"] = m
	tok, err := gc.Encode(acc)
	if err != nil {
		return "", fmt.Errorf("tenant: sign record %s: %w", rec.Name, err)
	}
	return tok, nil
}

// VerifyRecord checks that token is a record of tenant name signed by the
// account whose public key is issuer, and returns it with the time it was
// signed.
func VerifyRecord(token []byte, issuer, name string) (codec.Tenant, time.Time, error) {
	gc, err := jwt.DecodeGeneric(string(token))
	if err != nil {
		return codec.Tenant{}, time.Time{}, fmt.Errorf("%w: %v", ErrRecord, err)
	}
	if gc.Issuer != issuer {
		return codec.Tenant{}, time.Time{}, fmt.Errorf("%w: signed by %s, not by the fabric's account %s", ErrRecord, gc.Issuer, issuer)
	}
	if gc.Subject != name {
		return codec.Tenant{}, time.Time{}, fmt.Errorf("%w: a record of %q under the key of %q", ErrRecord, gc.Subject, name)
	}
	b, err := json.Marshal(gc.Data["tenant"])
	if err != nil {
		return codec.Tenant{}, time.Time{}, fmt.Errorf("%w: %v", ErrRecord, err)
	}
	var rec codec.Tenant
	if err := json.Unmarshal(b, &rec); err != nil || rec.Name != name {
		return codec.Tenant{}, time.Time{}, fmt.Errorf("%w: its tenant is %q, not %q (%v)", ErrRecord, rec.Name, name, err)
	}
	return rec, time.Unix(gc.IssuedAt, 0), nil
}

// Issuer is the public key of the account that issued the user of a creds
// file: the key that signs the fabric's tenant records.
func Issuer(creds []byte) (string, error) {
	tok, _, err := ParseCreds(creds)
	if err != nil {
		return "", err
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrCreds, err)
	}
	return uc.Issuer, nil
}
