// Package tenant makes and reads the credentials of a fabric with tenants:
// NATS operator mode, with one account holding the fabric's streams and
// buckets, a service user (workers, the broker's own connection) allowed
// everything in it, and one user per tenant whose JWT carries the subject
// permissions that keep the tenant inside its namespace (see
// Permissions). Keys are nkeys; credentials are creds files, which the Go
// client, the Python client and the nats CLI all read.
//
// A directory holds it all:
//
//	operator.jwt  operator.nk   the operator, trusted by the broker
//	account.jwt   account.nk    the fabric's account (JetStream enabled)
//	sys.jwt       sys.nk        the system account
//	service.creds               the service user
//	<tenant>.creds              a tenant's user
//	tenants/<tenant>.json       a tenant's record (codec.Tenant: quotas)
//	tenants/<tenant>.jwt        the same, signed by the account (SignRecord)
//	tenants/<tenant>.keys       every user key the tenant was given
//
// Init makes the first five once; Add makes a tenant; Revoke revokes a
// tenant's credentials in the account JWT, which a running broker reloads. The .nk files are
// secrets (mode 0600): whoever holds account.nk can mint users.
package tenant
