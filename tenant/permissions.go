package tenant

import (
	"slices"

	"github.com/nats-io/jwt/v2"

	"github.com/jetfabric/jetfabric/subjects"
)

// grant is one thing a tenant may use in the fabric's account: a subject
// its clients publish to (a service the tenant's account imports) or
// receive on (a stream it imports). The same subject is the user's
// permission and the import's, on both sides of the import: a tenant's
// clients use the single-account names, unchanged.
type grant struct {
	subject string // the tenant's own subject (wildcards allowed)
	export  string // the fabric account's export that covers it
	stream  bool   // received (a stream import), not published
	many    bool   // a service answered by several messages
}

// grants are what tenant may use, for names (the fabric's prefix). With P
// the prefix, U its upper-case form and T the tenant, a tenant may
//
// publish to
//   - P.t.T.> : its frames, heartbeats and jobs;
//   - P.svc.*.info, P.svc.*.health : a device's service endpoints;
//   - P.svc.registry : the registry, answered by the broker;
//   - its own object bucket FABRIC_XFER_T: the bucket's chunk and meta
//     subjects $O.U_XFER_T.>, and the JetStream API of its stream only
//     (STREAM.INFO, MSG.GET, MSG.DELETE, PURGE, DIRECT.GET, CONSUMER.CREATE,
//     DELETE, INFO, MSG.NEXT, flow control, acks);
//   - direct gets in subject form of what it may read in shared streams:
//     registry entries ($KV.U_CTRL.device.*), its record
//     ($KV.U_CTRL.tenant.T), its job results and graphs (keys t.T.…), the
//     last frame on its own op subjects;
//   - its graphs ($KV.U_GRAPHS.t.T.*);
//
// and receive
//   - _INBOX_P.t.T.> : every reply it gets (its inbox prefix);
//   - P.telemetry.* ;
//   - $O.U_XFER_T.> : its bucket's chunks, to copy a result while it is written.
//
// Nothing else: no STREAM.INFO, MSG.GET, consumer or non-subject direct
// get on a shared stream, no $JS.API.INFO, no $SRV, no other tenant's
// subjects.
func grants(names subjects.Names, tenant string) []grant {
	tn, _ := names.ForTenant(tenant)
	p := names.Prefix()
	ctrlStream := names.CtrlStream()
	graphs := names.GraphBucket()
	graphStream := "KV_" + graphs
	xfer := tn.XferBucket()
	xferStream := "OBJ_" + xfer
	api := "$JS.API."
	svc := func(subject, export string) grant { return grant{subject: subject, export: export} }
	directGet := grant{export: api + "DIRECT.GET.>", many: true}
	g := []grant{
		svc(p+".t."+tenant+".>", p+".t.*.>"),
		svc(p+".svc.*.info", p+".svc.*.info"),
		svc(p+".svc.*.health", p+".svc.*.health"),
		svc(names.ServiceRegistry(), names.ServiceRegistry()),
		svc("$O."+xfer+".>", "$O.*.>"),
		svc(api+"STREAM.INFO."+xferStream, api+"STREAM.INFO.*"),
		svc(api+"STREAM.MSG.GET."+xferStream, api+"STREAM.MSG.GET.*"),
		svc(api+"STREAM.MSG.DELETE."+xferStream, api+"STREAM.MSG.DELETE.*"),
		svc(api+"STREAM.PURGE."+xferStream, api+"STREAM.PURGE.*"),
		svc(api+"CONSUMER.CREATE."+xferStream+".>", api+"CONSUMER.CREATE.*.>"),
		svc(api+"CONSUMER.DELETE."+xferStream+".>", api+"CONSUMER.DELETE.*.>"),
		svc(api+"CONSUMER.INFO."+xferStream+".>", api+"CONSUMER.INFO.*.>"),
		{subject: api + "CONSUMER.MSG.NEXT." + xferStream + ".>", export: api + "CONSUMER.MSG.NEXT.*.>", many: true},
		svc("$JS.FC."+xferStream+".>", "$JS.FC.*.>"),
		svc("$JS.ACK."+xferStream+".>", "$JS.ACK.*.>"),
		svc("$KV."+graphs+".t."+tenant+".*", "$KV."+graphs+".t.*.*"),
		{subject: names.TenantInboxPrefix(tenant) + ".>", export: names.TenantInboxPrefix("*") + ".>", stream: true},
		{subject: names.TelemetryAll(), export: names.TelemetryAll(), stream: true},
		{subject: "$O." + xfer + ".>", export: "$O.*.>", stream: true},
	}
	for _, s := range []string{
		api + "DIRECT.GET." + xferStream,
		api + "DIRECT.GET." + xferStream + ".>",
		subjects.DirectGet(ctrlStream, names.CtrlSubject(subjects.DeviceKeys)),
		subjects.DirectGet(ctrlStream, names.CtrlSubject(subjects.TenantKey(tenant))),
		subjects.DirectGet(ctrlStream, names.CtrlSubject("t."+tenant+".>")),
		subjects.DirectGet(names.OpsStream(), tn.Ops("*", "*")),
		subjects.DirectGet(graphStream, "$KV."+graphs+".t."+tenant+".*"),
	} {
		d := directGet
		d.subject = s
		g = append(g, d)
	}
	return g
}

// Permissions are tenant's subject permissions, for names: it may publish
// to the services of grants and subscribe to their streams, nothing else.
func Permissions(names subjects.Names, tenant string) jwt.Permissions {
	var perms jwt.Permissions
	for _, g := range grants(names, tenant) {
		if g.stream {
			perms.Sub.Allow.Add(g.subject)
		} else {
			perms.Pub.Allow.Add(g.subject)
		}
	}
	return perms
}

// Exports are what the fabric's account exports to the tenants' accounts:
// the wildcard forms of every grant, each tenant's account importing only
// its own part (see Imports). They are public: only accounts the operator
// signs can import them, and the operator signs tenants' accounts only.
func Exports(names subjects.Names) jwt.Exports {
	var ex jwt.Exports
	seen := map[string]bool{}
	for _, g := range grants(names, "T") {
		key := g.export
		if g.stream {
			key = "stream " + key
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		e := &jwt.Export{Name: g.export, Subject: jwt.Subject(g.export), Type: jwt.Service}
		if g.stream {
			e.Type = jwt.Stream
		} else if g.many {
			e.ResponseType = jwt.ResponseTypeStream
		}
		ex.Add(e)
	}
	ex.Add(&jwt.Export{Name: "no JetStream info", Subject: jwt.Subject(noInfo(names)), Type: jwt.Service})
	return ex
}

// noInfo is the subject of the fabric's account that a tenant's
// $JS.API.INFO is imported from, where nothing answers. An account without
// JetStream of its own gets from the server an import of the whole
// JetStream API that answers "not enabled" to every request, beside the
// tenant's own imports, unless it imports $JS.API.INFO itself: this import
// is that, and no one may publish on it (see Permissions).
func noInfo(names subjects.Names) string { return names.Prefix() + ".svc.no-js-info" }

// Imports are what tenant's account imports from the fabric's account
// (public key fabric): every grant, under the same subject on both sides.
func Imports(names subjects.Names, tenant, fabric string) jwt.Imports {
	var im jwt.Imports
	for _, g := range grants(names, tenant) {
		i := &jwt.Import{Name: g.subject, Account: fabric, Subject: jwt.Subject(g.subject), Type: jwt.Service}
		if g.stream {
			i.Type = jwt.Stream
		}
		im.Add(i)
	}
	im.Add(&jwt.Import{Name: "no JetStream info", Account: fabric, Subject: jwt.Subject(noInfo(names)),
		LocalSubject: "$JS.API.INFO", Type: jwt.Service})
	return im
}

// hasExports reports whether ac exports everything Exports(names) does.
func hasExports(ac *jwt.AccountClaims, names subjects.Names) bool {
	for _, want := range Exports(names) {
		if !slices.ContainsFunc(ac.Exports, func(e *jwt.Export) bool {
			return e.Subject == want.Subject && e.Type == want.Type && e.ResponseType == want.ResponseType
		}) {
			return false
		}
	}
	return true
}
