package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// elsewhere is tenant q's use of the devices other than device as device's
// quota view on w holds it (0 when the view names no use of q).
func elsewhere(t *testing.T, w *worker.Worker, device, quota string) float64 {
	t.Helper()
	v, _ := workertest.Sample(t, w, `jetfabric_tenant_use_elsewhere{device="`+device+`",tenant="q",quota="`+quota+`"}`)
	return v
}

// waitElsewhere waits until device's view on w counts want of quota for q.
func waitElsewhere(t *testing.T, w *worker.Worker, device, quota string, want float64) {
	t.Helper()
	poll.Until(t, time.Minute, 20*time.Millisecond, func() error {
		if got := elsewhere(t, w, device, quota); got != want {
			return fmt.Errorf("%s's view counts %g %s of q elsewhere, want %g", device, got, quota, want)
		}
		return nil
	})
}

// storeSyncs stores a frame with a sync in the stream for each session
// of tenant on cpu-0, in order, through c's connection, and returns the
// subscription their answers will come on.
func storeSyncs(ctx context.Context, t *testing.T, c *client.Client, tenant string, sessions ...string) *nats.Subscription {
	t.Helper()
	js, err := jetstream.New(c.Conn())
	if err != nil {
		t.Fatal(err)
	}
	inbox := c.Conn().NewRespInbox()
	answers, err := c.Conn().SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	for _, sid := range sessions {
		m := nats.NewMsg("fabric.t." + tenant + ".ops.cpu-0." + sid)
		m.Data = []byte(`{"v":1,"ops":[{"op":"sync","tag":1}]}`)
		m.Header.Set(subjects.HeaderReply, inbox)
		m.Header.Set(subjects.HeaderContentType, "application/json")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	return answers
}

func isQuota(err error, text string) bool {
	var e *codec.Error
	return errors.As(err, &e) && e.Code == codec.CodeQuota && strings.Contains(e.Message, text)
}

// TestQuotasAcrossDevices: a tenant's sessions and bytes on one device count
// against its quotas on another (served by another worker) once that
// device's heartbeat has reported them; a view frame that is not a view
// changes nothing; and a replay after a takeover decides the tenant's
// frames with the view its checkpoint kept, as the first run would have.
func TestQuotasAcrossDevices(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "q", Sessions: 2, Bytes: 1 << 20}, false)
	if err != nil {
		t.Fatal(err)
	}
	rcreds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "r", FPS: 0.01}, false)
	if err != nil {
		t.Fatal(err)
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	fast := func(c *worker.Config) { c.Heartbeat = 100 * time.Millisecond; c.CheckpointInterval = 0 }
	cpu1 := workertest.CPUs(2)[1:]
	w1 := workertest.Run(t, b, cpu1, fast, func(c *worker.Config) {
		c.ID = "w1"
		c.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New()}}
	})
	w0 := workertest.Run(t, b, workertest.CPUs(1), fast, func(c *worker.Config) { c.ID = "w0" })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q, err := client.Connect(b.ClientURL(), client.WithCreds(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	open := func(device string) (*client.Session, error) {
		t.Helper()
		s, err := q.Open(ctx, device)
		if err != nil {
			t.Fatal(err)
		}
		return s, s.Sync(ctx)
	}

	// Sessions: one on each device; a third on cpu-0 passes the quota of 2
	// once cpu-0 counts cpu-1's.
	s0, err := open("cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	s1, err := open("cpu-1")
	if err != nil {
		t.Fatal(err)
	}
	waitElsewhere(t, w0, "cpu-0", "sessions", 1)
	waitElsewhere(t, w1, "cpu-1", "sessions", 1)
	if _, err := open("cpu-0"); !isQuota(err, "session quota of 2: 1 live on device cpu-0 and 1 on others") {
		t.Fatalf("a third session across two devices: %v", err)
	}

	// Bytes: 512 KiB on cpu-0 leave cpu-1 512 KiB of the 1 MiB.
	a := s0.Full([]int{128 << 10}, 1)
	if err := s0.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	waitElsewhere(t, w1, "cpu-1", "bytes", 512<<10)
	if _, err := s1.Full([]int{192 << 10}, 1).Read(ctx); !isQuota(err, "byte quota: 0 bytes held on device cpu-1 and 524288 on others, 786432 more asked") {
		t.Fatalf("768 KiB on cpu-1 beside 512 KiB on cpu-0: %v", err)
	}
	// A job of q counts them too (w1 takes the jobs, and has seen them).
	job := q.NewJob()
	jid, err := q.Submit(ctx, "cpu", job, job.Full([]int{192 << 10}, 1))
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.Wait(ctx, jid)
	if err != nil {
		t.Fatal(err)
	}
	if e := res[0].Errors; len(e) == 0 || e[0].Code != codec.CodeQuota || !strings.Contains(e[0].Message, "524288 on others, 786432 more asked") {
		t.Fatalf("a job of 768 KiB beside 512 KiB on cpu-0: %+v", res[0])
	}
	a.Free()
	if err := s0.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	waitElsewhere(t, w1, "cpu-1", "bytes", 0)
	c := s1.Full([]int{192 << 10}, 1)
	if _, err := c.Read(ctx); err != nil {
		t.Fatalf("768 KiB on cpu-1 once cpu-0's are freed: %v", err)
	}

	// Bad views, as only the fabric's own users can publish them: logged
	// and ignored, the view in effect stays.
	svc, err := nats.Connect(b.ClientURL(), nats.UserCredentials(tenant.ServiceCreds(dir)))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	views := workertest.Metric(t, w0, "jetfabric_device_quota_views_total", "cpu-0")
	for _, bad := range []string{`not json`, `{"tenants":{"q":{"sessions":-1}}}`, `{"tenants":{"a.b":{"sessions":1}}}`, `{"tenants":{"q":{"fps":1e999}}}`} {
		if _, err := js.Publish(ctx, "fabric.ops.cpu-0."+subjects.QuotaViewToken, []byte(bad)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s0.Sync(ctx); err != nil { // after the bad views in the stream
		t.Fatal(err)
	}
	if got := workertest.Metric(t, w0, "jetfabric_device_quota_views_total", "cpu-0"); got != views {
		t.Errorf("bad views taken: %g views, %g before", got, views)
	}
	if got := elsewhere(t, w0, "cpu-0", "sessions"); got != 1 {
		t.Errorf("after the bad views, cpu-0 counts %g sessions of q elsewhere, want 1", got)
	}
	// A tenant cannot publish a view (the broker refuses the publish).
	if err := q.Conn().Publish("fabric.ops.cpu-0."+subjects.QuotaViewToken, []byte(`{"tenants":{}}`)); err != nil {
		t.Fatal(err)
	}
	if err := s0.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := elsewhere(t, w0, "cpu-0", "sessions"); got != 1 {
		t.Errorf("a tenant's view was taken: cpu-0 counts %g sessions of q elsewhere", got)
	}
	if err := s0.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// r may run a frame every 100 s: its first runs, and empties its
	// bucket, which cpu-0's checkpoint keeps.
	r, err := client.Connect(b.ClientURL(), client.WithCreds(rcreds))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rs, err := r.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	// The replay: cpu-0's checkpoint keeps its view (q has a session on
	// cpu-1, none on cpu-0) and r's bucket; two new sessions of q and two
	// frames of r stored while nobody serves cpu-0 are replayed by the
	// next owner, which admits q's first (0 here, 1 elsewhere) and refuses
	// its second and both of r's, as w0 would have.
	if err := w0.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	answers := storeSyncs(ctx, t, q, "q", "replayed1", "replayed2")
	rAnswers := storeSyncs(ctx, t, r, "r", rs.ID(), rs.ID())
	workertest.Run(t, b, workertest.CPUs(1), fast, func(c *worker.Config) { c.ID = "w0-again" })
	for i := range 2 {
		m, err := rAnswers.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatalf("answer %d of r's replayed frames: %v", i, err)
		}
		var res codec.Result
		if err := json.Unmarshal(m.Data, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Errors) == 0 || res.Errors[0].Code != codec.CodeQuota || !strings.Contains(res.Errors[0].Message, "frame quota") {
			t.Errorf("r's replayed frame %d: %+v; want the frame quota's refusal", i, res)
		}
	}
	var got []string
	for range 2 {
		m, err := answers.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatalf("answers of the replayed sessions: %v (have %v)", err, got)
		}
		var r codec.Result
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Errors) > 0 {
			got = append(got, r.Errors[0].Code+": "+r.Errors[0].Message)
		} else {
			got = append(got, "ok")
		}
	}
	if got[0] != "ok" || !strings.Contains(got[1], "session quota of 2: 1 live on device cpu-0 and 1 on others") {
		t.Errorf("replayed sessions: %q; want the first admitted and the second refused", got)
	}
}
