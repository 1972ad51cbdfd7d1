// Package tenant makes and reads the credentials of a fabric with tenants:
// NATS operator mode, with one account holding the fabric's streams and
// buckets, a service user (workers, the broker's own connection) allowed
// everything in it, and an account per tenant that imports from the
// fabric's account only the tenant's own subjects (Imports, Exports), its
// users' JWTs carrying the same subjects as permissions (Permissions).
// Every answer the server publishes on a reply subject a tenant named goes
// into the tenant's own account. Keys are nkeys; credentials are creds
// files, which the Go client, the Python client and the nats CLI all read.
//
// A directory holds it all:
//
//	operator.jwt  operator.nk   the operator, trusted by the broker
//	account.jwt   account.nk    the fabric's account (JetStream enabled; its exports)
//	sys.jwt       sys.nk        the system account
//	service.creds               the service user
//	<tenant>.creds              a tenant's user
//	tenants/<tenant>.json       a tenant's record (codec.Tenant: quotas)
//	tenants/<tenant>.jwt        the same, signed by the account (SignRecord)
//	tenants/<tenant>.keys       every user key the tenant was given
//	tenants/<tenant>.acc.jwt    the tenant's account (its imports; its revocations)
//	tenants/<tenant>.acc.nk     the tenant's account key, which signs its users
//
// Init makes the first five once; Add makes a tenant (and adds the exports
// to the fabric's account JWT); Revoke revokes a tenant's credentials in
// its account JWT, which a running broker reloads. The .nk files are
// secrets (mode 0600): whoever holds account.nk can mint service users,
// whoever holds a tenant's .acc.nk that tenant's users.
package tenant
