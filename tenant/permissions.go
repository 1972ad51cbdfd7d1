package tenant

import (
	"github.com/nats-io/jwt/v2"

	"github.com/jetfabric/jetfabric/subjects"
)

// Permissions are tenant's subject permissions, for names (the fabric's
// prefix). With P the prefix, U its upper-case form and T the tenant, a
// tenant may:
//
// publish to
//   - P.t.T.> : its frames, heartbeats and jobs;
//   - P.svc.*.info, P.svc.*.health : a device's service endpoints;
//   - P.svc.registry : the registry, answered by the broker;
//   - its own object bucket FABRIC_XFER_T: the bucket's chunk and meta
//     subjects $O.U_XFER_T.>, and the JetStream API of its stream only
//     (STREAM.INFO, MSG.GET, MSG.DELETE, PURGE, DIRECT.GET, CONSUMER.CREATE,
//     DELETE, INFO, MSG.NEXT, flow control);
//   - direct gets in subject form of what it may read in shared streams:
//     registry entries ($KV.U_CTRL.device.*), its record
//     ($KV.U_CTRL.tenant.T), its job results and graphs (keys t.T.…), the
//     last frame on its own op subjects;
//   - its graphs ($KV.U_GRAPHS.t.T.*);
//
// subscribe to
//   - _INBOX_P.t.T.> : every reply it gets (its inbox prefix);
//   - P.telemetry.* ;
//   - $O.U_XFER_T.> : its bucket's chunks, to copy a result while it is written.
//
// Nothing else: no STREAM.INFO, MSG.GET, consumer or non-subject direct
// get on a shared stream, no $JS.API.INFO, no $SRV, no other tenant's
// subjects.
func Permissions(names subjects.Names, tenant string) jwt.Permissions {
	tn, _ := names.ForTenant(tenant)
	p := names.Prefix()
	ctrlStream := names.CtrlStream()
	graphs := names.GraphBucket()
	graphStream := "KV_" + graphs
	xfer := tn.XferBucket()
	xferStream := "OBJ_" + xfer
	api := "$JS.API."
	var perms jwt.Permissions
	perms.Pub.Allow.Add(
		p+".t."+tenant+".>",
		p+".svc.*.info",
		p+".svc.*.health",
		names.ServiceRegistry(),
		"$O."+xfer+".>",
		api+"STREAM.INFO."+xferStream,
		api+"STREAM.MSG.GET."+xferStream,
		api+"STREAM.MSG.DELETE."+xferStream,
		api+"STREAM.PURGE."+xferStream,
		api+"DIRECT.GET."+xferStream,
		api+"DIRECT.GET."+xferStream+".>",
		api+"CONSUMER.CREATE."+xferStream+".>",
		api+"CONSUMER.DELETE."+xferStream+".>",
		api+"CONSUMER.INFO."+xferStream+".>",
		api+"CONSUMER.MSG.NEXT."+xferStream+".>",
		"$JS.FC."+xferStream+".>",
		"$JS.ACK."+xferStream+".>",
		subjects.DirectGet(ctrlStream, names.CtrlSubject(subjects.DeviceKeys)),
		subjects.DirectGet(ctrlStream, names.CtrlSubject(subjects.TenantKey(tenant))),
		subjects.DirectGet(ctrlStream, names.CtrlSubject("t."+tenant+".>")),
		subjects.DirectGet(names.OpsStream(), tn.Ops("*", "*")),
		subjects.DirectGet(graphStream, "$KV."+graphs+".t."+tenant+".*"),
		"$KV."+graphs+".t."+tenant+".*",
	)
	perms.Sub.Allow.Add(
		names.TenantInboxPrefix(tenant)+".>",
		names.TelemetryAll(),
		"$O."+xfer+".>",
	)
	return perms
}
