package subjects

import (
	"fmt"
	"strings"
)

// Tenants share the fabric's streams and buckets; what keeps them apart is
// where they may publish and subscribe. Everything a tenant publishes lives
// under fabric.t.<tenant>. followed by the single-user layout, its replies
// under _INBOX_fabric.t.<tenant>, its objects in a bucket of its own.

// ForTenant returns the names a client of tenant uses: Ops, Alive, Jobs,
// InboxPrefix, XferBucket, GraphKey and JobKeyOf move into the tenant's
// namespace; stream and bucket names shared by all tenants stay the same.
// An empty tenant returns the single-user names.
func (n Names) ForTenant(tenant string) (Names, error) {
	if tenant == "" {
		n.tenant = ""
		return n, nil
	}
	if err := ValidateTenant(tenant); err != nil {
		return Names{}, err
	}
	n.tenant = tenant
	return n, nil
}

// Tenant is the tenant of these names, or "" for the single-user layout.
func (n Names) Tenant() string { return n.tenant }

// ValidateTenant validates a tenant name: the rules of a token.
func ValidateTenant(tenant string) error {
	if err := ValidateToken(tenant); err != nil {
		return fmt.Errorf("tenant name: %w", err)
	}
	return nil
}

// TenantOpsAll matches every tenant's op frames: fabric.t.*.ops.*.*. The
// ops stream captures it beside OpsAll when tenants are on.
func (n Names) TenantOpsAll() string { return n.prefix + ".t.*.ops.*.*" }

// TenantOpsDevice matches the frames of every tenant's sessions on one
// device: fabric.t.*.ops.<device>.*.
func (n Names) TenantOpsDevice(device string) string {
	return n.prefix + ".t.*.ops." + device + ".*"
}

// TenantAliveDevice matches the heartbeats of every tenant's sessions on
// one device: fabric.t.*.alive.<device>.*.
func (n Names) TenantAliveDevice(device string) string {
	return n.prefix + ".t.*.alive." + device + ".*"
}

// TenantJobs matches every tenant's jobs for devices of kind:
// fabric.t.*.jobs.<kind>.
func (n Names) TenantJobs(kind string) string { return n.prefix + ".t.*.jobs." + kind }

// JobTenant is the tenant of a job's subject ("" for the single-user
// layout fabric.jobs.<kind>).
func (n Names) JobTenant(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".t.")
	if !ok {
		if !strings.HasPrefix(subject, n.prefix+".jobs.") {
			return "", fmt.Errorf("%w: %q is not a job subject", ErrInvalidSubject, subject)
		}
		return "", nil
	}
	tenant, rest, ok := strings.Cut(rest, ".")
	if !ok || !strings.HasPrefix(rest, "jobs.") || ValidateTenant(tenant) != nil {
		return "", fmt.Errorf("%w: %q is not a job subject", ErrInvalidSubject, subject)
	}
	return tenant, nil
}

// TenantJobsAll matches every tenant's jobs: fabric.t.*.jobs.*.
func (n Names) TenantJobsAll() string { return n.prefix + ".t.*.jobs.*" }

// TenantInboxPrefix is the inbox prefix of tenant: _INBOX_fabric.t.<tenant>.
// A worker answers a tenant's frames only on subjects under it.
func (n Names) TenantInboxPrefix(tenant string) string {
	return "_INBOX_" + n.prefix + ".t." + tenant
}

// InTenantInbox reports whether subject lies under tenant's inbox, where
// NATS lets no one else subscribe: the only place a tenant's frames are
// answered. For the single-user layout (tenant "") every subject does.
func (n Names) InTenantInbox(tenant, subject string) bool {
	return tenant == "" || strings.HasPrefix(subject, n.TenantInboxPrefix(tenant)+".")
}

// TenantXferBucket is tenant's object bucket: FABRIC_XFER_<tenant>.
func (n Names) TenantXferBucket(tenant string) string { return n.upper + "_XFER_" + tenant }

// ParseFrame splits the subject of a frame into its tenant ("" for the
// single-user layout), device and session tokens. It accepts both
// fabric.ops.<device>.<session> and fabric.t.<tenant>.ops.<device>.<session>.
func (n Names) ParseFrame(subject string) (tenant, device, session string, err error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".t.")
	if !ok {
		device, session, err = n.ParseOps(subject)
		return "", device, session, err
	}
	tenant, rest, ok = strings.Cut(rest, ".")
	if !ok {
		return "", "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
	}
	if err := ValidateTenant(tenant); err != nil {
		return "", "", "", err
	}
	device, session, err = n.ParseOps(n.prefix + "." + rest)
	if err != nil {
		return "", "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
	}
	return tenant, device, session, nil
}

// ParseAlive splits a heartbeat subject into its tenant ("" for the
// single-user layout), device and session tokens.
func (n Names) ParseAlive(subject string) (tenant, device, session string, err error) {
	rest := subject
	if r, ok := strings.CutPrefix(subject, n.prefix+".t."); ok {
		if tenant, rest, ok = strings.Cut(r, "."); !ok || ValidateTenant(tenant) != nil {
			return "", "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
		}
		rest = n.prefix + "." + rest
	}
	rest, ok := strings.CutPrefix(rest, n.prefix+".alive.")
	if !ok {
		return "", "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
	}
	device, session, ok = strings.Cut(rest, ".")
	if !ok || ValidateDevice(device) != nil || ValidateSession(session) != nil {
		return "", "", "", fmt.Errorf("%w: %q", ErrInvalidSubject, subject)
	}
	return tenant, device, session, nil
}

// QuotaViewToken is the session token of the subject QuotaView.
const QuotaViewToken = "_quota-view"

// QuotaView is the subject a worker publishes a device's view of the
// tenants' use of the other devices on (codec.QuotaView):
// fabric.ops.<device>._quota-view, one of the device's own frame subjects,
// which with tenants only the fabric's own users can publish on.
func (n Names) QuotaView(device string) string {
	return n.prefix + ".ops." + device + "." + QuotaViewToken
}

// SessionKey names a session inside a worker: its token, or
// <tenant>.<session> for a tenant's session, so that equal tokens of two
// tenants are two sessions.
func SessionKey(tenant, session string) string {
	if tenant == "" {
		return session
	}
	return tenant + "." + session
}

// SessionTenant is the tenant of a session key ("" for none).
func SessionTenant(key string) string {
	t, _, ok := strings.Cut(key, ".")
	if !ok {
		return ""
	}
	return t
}

// TenantKey is the FABRIC_CTRL key of a tenant's record (its quotas):
// tenant.<tenant>.
func TenantKey(tenant string) string { return "tenant." + tenant }

// TenantKeys matches every tenant record.
const TenantKeys = "tenant.*"

// GraphKey is the FABRIC_GRAPHS key of the graph named name: the name
// itself, or t.<tenant>.<name> for a tenant's names.
func (n Names) GraphKey(name string) string { return TenantGraphKey(n.tenant, name) }

// TenantGraphKey is GraphKey for tenant ("" for the single-user layout).
func TenantGraphKey(tenant, name string) string {
	if tenant == "" {
		return name
	}
	return "t." + tenant + "." + name
}

// JobKeyOf is the FABRIC_CTRL key of a job's result: job.<id>, or
// t.<tenant>.job.<id> for a tenant's names.
func (n Names) JobKeyOf(id string) string { return TenantJobKey(n.tenant, id) }

// TenantJobKey is JobKeyOf for tenant ("" for the single-user layout).
func TenantJobKey(tenant, id string) string {
	if tenant == "" {
		return JobKey(id)
	}
	return "t." + tenant + "." + JobKey(id)
}

// TenantObject names an object of tenant in the shared transfer bucket
// (transfers, collectives): the name prefixed by t.<tenant>., so that one
// tenant cannot import another's transfer id.
func TenantObject(tenant, name string) string {
	if tenant == "" {
		return name
	}
	return "t." + tenant + "." + name
}

// ServiceRegistry is the request subject answered, on a fabric with
// tenants, by the broker with every device's registry entry (a JSON
// array): fabric.svc.registry. Tenants list the devices this way, as they
// may not read the control bucket's stream.
func (n Names) ServiceRegistry() string { return n.prefix + ".svc.registry" }

// ServiceAccounts is the request subject on which the broker of a fabric
// with tenants takes account JWTs from the service user and applies them
// at once (a tenant added while it runs): fabric.svc.accounts.
func (n Names) ServiceAccounts() string { return n.prefix + ".svc.accounts" }

// DirectGet is the subject of a JetStream direct get of the last message
// on subject in stream, in the form whose subject permissions can check:
// $JS.API.DIRECT.GET.<stream>.<subject>.
func DirectGet(stream, subject string) string { return "$JS.API.DIRECT.GET." + stream + "." + subject }

// SubjectTenant is the tenant token of a subject in a tenant's namespace
// (fabric.t.<tenant>. ...), unchecked, or "" for any other subject: where
// a subject that does not parse came from, so that its answer goes only
// where that tenant may read.
func (n Names) SubjectTenant(subject string) string {
	rest, ok := strings.CutPrefix(subject, n.prefix+".t.")
	if !ok {
		return ""
	}
	tenant, _, _ := strings.Cut(rest, ".")
	return tenant
}
