package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// tenantFabric is a broker with an auth directory and one worker process
// running as the service user.
type tenantFabric struct {
	dir    string
	b      *broker.Broker
	url    string
	worker *output
}

// startTenantFabric makes the auth directory with the tenants given as
// `tenant add` arguments, then the broker and a worker process.
func startTenantFabric(t *testing.T, tenants ...[]string) *tenantFabric {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"tenant", "init", "--dir", dir}, &out, &errb); code != 0 {
		t.Fatalf("tenant init: %s", errb.String())
	}
	for _, a := range tenants {
		if code := run(ctx, append([]string{"tenant", "add"}, append(a, "--dir", dir)...), &out, &errb); code != 0 {
			t.Fatalf("tenant add %v: %s", a, errb.String())
		}
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	_, wout := spawn(t, "worker", "--url", b.ClientURL(), "--creds", tenant.ServiceCreds(dir), "--cpus", "1", "--id", "w1", "--jobs", "cpu")
	f := &tenantFabric{dir: dir, b: b, url: b.ClientURL(), worker: wout}
	c := f.connect(t, "service")
	poll.Until(t, 2*time.Minute, 50*time.Millisecond, func() error {
		devs, err := c.Devices(ctx)
		if err == nil && len(devs) == 1 && client.Live(devs[0], time.Now()) {
			return nil
		}
		return fmt.Errorf("no live cpu-0: %v %+v\nworker:\n%s", err, devs, wout.String())
	})
	return f
}

func (f *tenantFabric) creds(name string) string { return filepath.Join(f.dir, name+".creds") }

func (f *tenantFabric) connect(t *testing.T, name string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Connect(f.url, append([]client.Option{client.WithCreds(f.creds(name))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// aliceProgram uploads a tensor through the object store, computes, and
// reads back a small result inline and a large one through the tenant's
// bucket.
func aliceProgram(ctx context.Context, c *client.Client) (small, large []byte, sid string, err error) {
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		return nil, nil, "", err
	}
	defer s.Close(ctx)
	const n = 1_200_000 // 4.8 MB of float32: over the worker's inline limit
	data := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i%977)/7))
	}
	x, err := s.Upload(ctx, "float32", []int{n}, data)
	if err != nil {
		return nil, nil, "", err
	}
	y := x.Mul(x).Add(x)
	sd, err := y.Sum().Read(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	ld, err := y.Read(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	return sd.Bytes, ld.Bytes, s.ID(), nil
}

func TestTenants(t *testing.T) {
	f := startTenantFabric(t,
		[]string{"alice", "--bytes", "256MiB"},
		[]string{"bob"},
		[]string{"quota", "--sessions", "1", "--bytes", "1MiB"},
		[]string{"slow", "--fps", "0.01"},
		[]string{"gone"},
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	alice := f.connect(t, "alice", client.WithInlineUpload(64<<10))
	if alice.Tenant() != "alice" {
		t.Fatalf("tenant %q", alice.Tenant())
	}
	v0 := f.b.Violations()
	small0, large0, sid0, err := aliceProgram(ctx, alice)
	if err != nil {
		t.Fatalf("alice alone: %v\nworker:\n%s", err, f.worker.String())
	}
	if v := f.b.Violations(); v != v0 {
		t.Fatalf("alice's own program was refused by the broker: %+v -> %+v", v0, v)
	}
	t.Run("isolation", func(t *testing.T) { testIsolation(t, f, alice, small0, large0) })
	t.Run("credentials", func(t *testing.T) { testCredentials(t, f) })
	t.Run("quotas", func(t *testing.T) { testQuotas(t, f) })
	t.Run("jobs", func(t *testing.T) { testTenantJobs(t, f, alice) })
	t.Run("graphs", func(t *testing.T) { testTenantGraphs(t, f, alice) })
	t.Run("transfers", func(t *testing.T) { testTenantTransfers(t, f, alice) })
	aliceOps := "fabric.t.alice.ops.cpu-0." + sid0
	t.Run("server answers", func(t *testing.T) { testServerAnswers(t, f, alice, aliceOps, small0, large0) })
	t.Run("revoke", func(t *testing.T) { testRevoke(t, f, alice) })
}

// testRevoke: `tenant revoke` on the running broker's auth directory
// closes the tenant's connections and refuses its credentials, with a
// message that says so; other tenants go on; new credentials work.
func testRevoke(t *testing.T, f *tenantFabric, alice *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gone := f.connect(t, "gone")
	s, err := gone.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Full([]int{4}, 3)
	if v, err := x.Add(x).Float32s(ctx); err != nil || v[0] != 6 {
		t.Fatalf("gone's session before the revocation: %v %v", v, err)
	}
	// The server tells a connection why it closes it: an asynchronous
	// error, then the close.
	var why atomic.Value
	closed := make(chan struct{})
	raw, err := nats.Connect(f.url, nats.UserCredentials(f.creds("gone")), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { why.CompareAndSwap(nil, err) }),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	r0, a0 := f.b.AccountReloads(), f.b.Violations().Authentication
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"tenant", "revoke", "gone", "--dir", f.dir}, &out, &errb); code != 0 || !strings.Contains(out.String(), "1 credentials revoked") {
		t.Fatalf("tenant revoke: %d\n%s%s", code, out.String(), errb.String())
	}
	select {
	case <-closed:
		if err, _ := why.Load().(error); !errors.Is(err, nats.ErrAuthRevoked) {
			t.Errorf("a revoked connection closed after %v", err)
		}
	case <-ctx.Done():
		t.Fatal("a revoked tenant's connection stayed open")
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		// gone's account and the fabric's (older directories' users).
		if n := f.b.AccountReloads() - r0; n != 2 {
			return fmt.Errorf("account JWTs applied %d times, want 2", n)
		}
		return nil
	})
	if _, err := client.Connect(f.url, client.WithCreds(f.creds("gone"))); !errors.Is(err, client.ErrCredentials) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("revoked credentials: %v", err)
	}
	// The client gives up reconnecting once the broker refuses its
	// credentials, and says so.
	poll.Until(t, 30*time.Second, 20*time.Millisecond, func() error {
		if err := s.Sync(ctx); !errors.Is(err, client.ErrCredentials) || !strings.Contains(err.Error(), "gone.creds") {
			return fmt.Errorf("a revoked tenant's session: %v", err)
		}
		return nil
	})
	if n := f.b.Violations().Authentication - a0; n == 0 {
		t.Error("the refused credentials were not counted")
	}
	// Alice goes on; gone's new credentials work.
	sa, err := alice.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	y := sa.Full([]int{2}, 5)
	if v, err := y.Mul(y).Float32s(ctx); err != nil || v[0] != 25 {
		t.Errorf("alice after gone's revocation: %v %v", v, err)
	}
	_ = sa.Close(ctx)
	if code := run(ctx, []string{"tenant", "add", "gone", "--replace", "--dir", f.dir}, &out, &errb); code != 0 {
		t.Fatalf("tenant add --replace: %s", errb.String())
	}
	again := f.connect(t, "gone")
	s2, err := again.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	z := s2.Full([]int{2}, 2)
	if v, err := z.Add(z).Float32s(ctx); err != nil || v[0] != 4 {
		t.Errorf("gone's new credentials: %v %v", v, err)
	}
}

// testServerAnswers: a NATS client may name any reply subject, and the
// server answers its requests there (a JetStream publish's ack, the
// JetStream API, a direct get) without checking the requester's
// permissions. Each tenant has an account of its own: whatever subject a
// tenant names, the server's answer is published in the tenant's account,
// never in the fabric's. A user of quota's own account with no limits
// sees every forged answer arrive there, while the fabric's account sees
// none on the subjects they named (alice's record, a lease key, alice's
// frames, alice's graphs), and nothing of the fabric changes.
func testServerAnswers(t *testing.T, f *tenantFabric, alice *client.Client, aliceOps string, small0, large0 []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := f.connect(t, "quota")
	nc := q.Conn()
	js, _ := jetstream.New(nc)
	if _, err := js.Publish(ctx, "$O.FABRIC_XFER_quota.C.forged", []byte(`{"name":"quota"}`)); err != nil {
		t.Fatal(err)
	}
	targets := []string{"$KV.FABRIC_CTRL.tenant.alice", "$KV.FABRIC_CTRL.lease.forged-0", aliceOps, "$KV.FABRIC_GRAPHS.t.alice.forged"}
	// What the fabric's account receives on those subjects.
	svc := f.connect(t, "service")
	fabricSaw := make(chan *nats.Msg, 64)
	for _, subj := range targets {
		if _, err := svc.Conn().ChanSubscribe(subj, fabricSaw); err != nil {
			t.Fatal(err)
		}
	}
	sjs, _ := jetstream.New(svc.Conn())
	ctrl, err := sjs.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	rec0, err := ctrl.Get(ctx, "tenant.alice")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := sjs.Stream(ctx, "FABRIC_OPS")
	if err != nil {
		t.Fatal(err)
	}
	frame0, err := ops.GetLastMsgForSubject(ctx, aliceOps)
	if err != nil {
		t.Fatal(err)
	}
	// What quota's own account receives on them.
	observer := accountUser(t, f, "quota")
	quotaSaw, err := observer.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := observer.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := svc.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	requests := []struct {
		subject string
		data    []byte
	}{
		{"fabric.t.quota.ops.cpu-0.forged", []byte("not a frame")}, // stored in FABRIC_OPS, acknowledged
		{"$JS.API.STREAM.INFO.OBJ_FABRIC_XFER_quota", nil},
		{"$JS.API.DIRECT.GET.KV_FABRIC_CTRL.$KV.FABRIC_CTRL.tenant.quota", nil},
		{"$JS.API.DIRECT.GET.OBJ_FABRIC_XFER_quota.$O.FABRIC_XFER_quota.C.forged", nil},
	}
	for _, r := range requests {
		for _, reply := range targets {
			if err := nc.PublishMsg(&nats.Msg{Subject: r.subject, Reply: reply, Data: r.data}); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := len(requests) * len(targets)
	got := map[string]int{}
	for n := 0; n < want; {
		m, err := quotaSaw.NextMsgWithContext(ctx)
		if err != nil {
			t.Fatalf("quota's account received %d of the %d answers %v: %v", n, want, got, err)
		}
		if slices.Contains(targets, m.Subject) {
			got[m.Subject]++
			n++
		}
	}
	if n := len(fabricSaw); n != 0 {
		m := <-fabricSaw
		t.Errorf("the fabric's account received %d forged answers, the first on %s: %q", n, m.Subject, m.Data)
	}
	if rec, err := ctrl.Get(ctx, "tenant.alice"); err != nil || rec.Revision() != rec0.Revision() {
		t.Errorf("alice's record after the forged answers: %v", err)
	}
	for _, key := range []string{"lease.forged-0"} {
		if _, err := ctrl.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("control key %s after the forged answers: %v", key, err)
		}
	}
	if frame, err := ops.GetLastMsgForSubject(ctx, aliceOps); err != nil || frame.Sequence != frame0.Sequence {
		t.Errorf("alice's frames after the forged answers: %v", err)
	}
	graphs, err := sjs.KeyValue(ctx, "FABRIC_GRAPHS")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := graphs.Get(ctx, "t.alice.forged"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("alice's graph key after the forged answers: %v", err)
	}
	// quota's quota holds; alice's results are what they were.
	s1, err := q.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Sync(ctx); !isCode(err, codec.CodeQuota, "session quota") {
		t.Errorf("quota's session quota after its forged answers: %v", err)
	}
	small, large, _, err := aliceProgram(ctx, alice)
	if err != nil || !bytes.Equal(small, small0) || !bytes.Equal(large, large0) {
		t.Errorf("alice after quota's forged answers: %v", err)
	}
	testServiceReplies(t, f, nc)
}

// accountUser connects a user of tenant name's own account with no
// permission limits, minted with the account's key from the auth
// directory: it sees everything published in that account.
func accountUser(t *testing.T, f *tenantFabric, name string) *nats.Conn {
	t.Helper()
	seed, err := os.ReadFile(filepath.Join(f.dir, "tenants", name+".acc.nk"))
	if err != nil {
		t.Fatal(err)
	}
	acc, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := nkeys.CreateUser()
	upub, _ := u.PublicKey()
	tok, err := jwt.NewUserClaims(upub).Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	useed, _ := u.Seed()
	creds, err := jwt.FormatUserConfig(tok, useed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "observer.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(f.url, nats.UserCredentials(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// testServiceReplies: the fabric's own services (a device's info and
// health, the broker's registry) do not answer onto a subject a stream
// captures: requests whose reply names bob's record key change nothing,
// while the same requests with an inbox are answered.
func testServiceReplies(t *testing.T, f *tenantFabric, nc *nats.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc := f.connect(t, "service")
	sjs, _ := jetstream.New(svc.Conn())
	kv, err := sjs.KeyValue(ctx, "FABRIC_CTRL")
	if err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(ctx, "tenant.bob")
	if err != nil {
		t.Fatal(err)
	}
	services := []string{"fabric.svc.cpu-0.info", "fabric.svc.cpu-0.health", "fabric.svc.registry"}
	for _, subj := range services {
		for _, reply := range []string{"$KV.FABRIC_CTRL.tenant.bob", "fabric.t.quota.ops.cpu-0.x"} {
			if err := nc.PublishRequest(subj, reply, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each service answers in order: once the inbox's answer is in, the
	// forged ones were handled before it.
	for _, subj := range services {
		if _, err := nc.RequestWithContext(ctx, subj, nil); err != nil {
			t.Errorf("%s with an inbox: %v", subj, err)
		}
	}
	after, err := kv.Get(ctx, "tenant.bob")
	if err != nil || after.Revision() != before.Revision() {
		t.Errorf("bob's record after requests answered onto its key: revision %d, was %d (%v)", after.Revision(), before.Revision(), err)
	}
}

// testTenantGraphs: a tenant's graph is stored under its key and replays
// in its sessions; another tenant knowing its name finds nothing.
func testTenantGraphs(t *testing.T, f *tenantFabric, alice *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := alice.NewGraph()
	in := g.Input("f32", []int{3})
	def, err := g.Define(ctx, in.Add(in).Mul(in))
	if err != nil {
		t.Fatal(err)
	}
	if err := alice.StoreGraph(ctx, def); err != nil {
		t.Errorf("storing alice's graph again: %v", err)
	}
	if got, err := alice.LoadGraph(ctx, def.Name); err != nil || got.Name != def.Name {
		t.Fatalf("alice's graph back: %v", err)
	}
	s, err := alice.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	out := s.Replay(def, []*client.Tensor{s.Full([]int{3}, 3)})
	if v, err := out[0].Float32s(ctx); err != nil || v[0] != 18 {
		t.Fatalf("alice's replay: %v %v", v, err)
	}
	bob := f.connect(t, "bob")
	if _, err := bob.LoadGraph(ctx, def.Name); err == nil {
		t.Error("bob loaded alice's graph")
	}
	bs, err := bob.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close(ctx)
	bout := bs.Replay(def, []*client.Tensor{bs.Full([]int{3}, 3)})
	if _, err := bout[0].Read(ctx); !isCode(err, codec.CodeUnknownGraph, "not stored") {
		t.Errorf("bob replaying alice's graph: %v", err)
	}
}

// testTenantTransfers: a tenant's transfer reaches its other session;
// another tenant importing the same transfer id gets nothing of it.
func testTenantTransfers(t *testing.T, f *tenantFabric, alice *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s1, err := alice.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close(ctx)
	s2, err := alice.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	id := client.NewTransferID()
	s1.Full([]int{2}, 5).Expose(id, 2)
	if err := s1.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Import(id, 0).Float32s(ctx); err != nil || v[0] != 5 {
		t.Fatalf("alice's transfer: %v %v", v, err)
	}
	bob := f.connect(t, "bob")
	bs, err := bob.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	defer bs.Close(ctx)
	if v, err := bs.Import(id, 300*time.Millisecond).Float32s(ctx); err == nil {
		t.Errorf("bob imported alice's transfer: %v", v)
	}
}

// testTenantJobs: a tenant's job runs, its result is under the tenant's
// key and its output in the tenant's bucket, where another tenant finds
// neither.
func testTenantJobs(t *testing.T, f *tenantFabric, alice *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j := alice.NewJob()
	x, err := j.Upload(ctx, "float32", []int{100_000}, make([]byte, 400_000)) // through alice's bucket
	if err != nil {
		t.Fatal(err)
	}
	id, err := alice.Submit(ctx, "cpu", j, x.Add(j.Full([]int{100_000}, 3)).Sum())
	if err != nil {
		t.Fatal(err)
	}
	res, err := alice.Wait(ctx, id)
	if err != nil {
		t.Fatalf("%v\nworker:\n%s", err, f.worker.String())
	}
	d, err := res[0].Output(ctx, 0)
	if err != nil || math.Float32frombits(binary.LittleEndian.Uint32(d.Bytes)) != 300_000 {
		t.Fatalf("alice's job output: %v %v", d, err)
	}
	svc, err := f.b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	kv, _ := js.KeyValue(ctx, "FABRIC_CTRL")
	if _, err := kv.Get(ctx, "t.alice.job."+id); err != nil {
		t.Errorf("alice's job result is not under her key: %v", err)
	}
	if _, err := kv.Get(ctx, "job."+id); err == nil {
		t.Error("alice's job result is under the single-user key")
	}
	// Bob waiting for alice's job id sees nothing: his keys are his own.
	bob := f.connect(t, "bob")
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if r, err := bob.Wait(wctx, id); err == nil || r[0] != nil {
		t.Errorf("bob waited for alice's job and got %v %v", r, err)
	}
}

// testIsolation: bob, with valid credentials, tries every path to alice's
// data and work while alice runs her program again. Each is refused by the
// broker (and counted) or answered with nothing of alice's, and alice's
// read-backs are those of her run alone.
func testIsolation(t *testing.T, f *tenantFabric, alice *client.Client, small0, large0 []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Alice runs while bob attacks; her session stays open until he is done.
	s, err := alice.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	secret := s.Full([]int{4}, 42)
	if _, err := secret.Read(ctx); err != nil {
		t.Fatal(err)
	}
	aliceSid := s.ID()
	aliceOps := subjects.Default()
	aliceNames, _ := aliceOps.ForTenant("alice")

	var asyncErrs []string
	var mu sync.Mutex
	bob, err := nats.Connect(f.url, nats.UserCredentials(f.creds("bob")), nats.CustomInboxPrefix("_INBOX_fabric.t.bob"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			asyncErrs = append(asyncErrs, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	// Whatever answers bob's attacks lands here; nothing may.
	got := make(chan *nats.Msg, 1024)
	if _, err := bob.ChanSubscribe("_INBOX_fabric.t.bob.attack.>", got); err != nil {
		t.Fatal(err)
	}
	v0 := f.b.Violations()
	// Subscriptions to everything, to alice's inbox, to her bucket's chunks.
	subs := []string{">", "fabric.>", "fabric.t.alice.>", "_INBOX_fabric.t.alice.>", "_INBOX_fabric.>", "$O.FABRIC_XFER_alice.>", "$O.FABRIC_XFER.>", "$O.FABRIC_RESULTS.>", "$KV.>", "$JS.>", "$SRV.>", "$SYS.>"}
	for _, subj := range subs {
		if _, err := bob.ChanSubscribe(subj, got); err != nil {
			t.Fatal(err)
		}
	}
	streams := []string{"FABRIC_OPS", "FABRIC_JOBS", "KV_FABRIC_CTRL", "KV_FABRIC_GRAPHS", "OBJ_FABRIC_XFER", "OBJ_FABRIC_RESULTS", "OBJ_FABRIC_CKPT", "OBJ_FABRIC_XFER_alice"}
	var pubs []string
	for _, st := range streams {
		pubs = append(pubs,
			"$JS.API.STREAM.INFO."+st,
			"$JS.API.STREAM.MSG.GET."+st,
			"$JS.API.STREAM.PURGE."+st,
			"$JS.API.STREAM.DELETE."+st,
			"$JS.API.STREAM.UPDATE."+st,
			"$JS.API.DIRECT.GET."+st,
			"$JS.API.CONSUMER.CREATE."+st,
			"$JS.API.CONSUMER.CREATE."+st+".spy",
			"$JS.API.CONSUMER.CREATE."+st+".spy.>",
			"$JS.API.CONSUMER.DURABLE.CREATE."+st+".spy",
			"$JS.API.CONSUMER.LIST."+st,
		)
	}
	pubs = append(pubs,
		"$JS.API.INFO",
		"$JS.API.STREAM.LIST",
		"$JS.API.STREAM.NAMES",
		"$JS.API.STREAM.CREATE.SPY",
		// Direct gets of alice's frames, objects, graphs and results, and
		// of the control data no tenant reads.
		subjects.DirectGet("FABRIC_OPS", aliceNames.Ops("cpu-0", aliceSid)),
		subjects.DirectGet("FABRIC_OPS", "fabric.t.alice.ops.cpu-0.*"),
		subjects.DirectGet("OBJ_FABRIC_XFER_alice", "$O.FABRIC_XFER_alice.M.>"),
		subjects.DirectGet("KV_FABRIC_CTRL", "$KV.FABRIC_CTRL.lease.cpu-0"),
		subjects.DirectGet("KV_FABRIC_CTRL", "$KV.FABRIC_CTRL.ckpt.cpu-0"),
		subjects.DirectGet("KV_FABRIC_CTRL", "$KV.FABRIC_CTRL.tenant.alice"),
		subjects.DirectGet("KV_FABRIC_CTRL", "$KV.FABRIC_CTRL.t.alice.job.x"),
		subjects.DirectGet("KV_FABRIC_GRAPHS", "$KV.FABRIC_GRAPHS.t.alice.*"),
		// Watches of every bucket (consumers in the filtered form).
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_CTRL.spy.$KV.FABRIC_CTRL.>",
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_CTRL.spy.$KV.FABRIC_CTRL.lease.*",
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_CTRL.spy.$KV.FABRIC_CTRL.t.alice.>",
		// No consumers on streams a tenant does not own, even of what it may read.
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_CTRL.spy.$KV.FABRIC_CTRL.device.*",
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_CTRL.spy.$KV.FABRIC_CTRL.t.bob.job.*",
		"$JS.API.CONSUMER.CREATE.FABRIC_OPS.spy.fabric.t.bob.ops.cpu-0.*",
		"$JS.API.CONSUMER.CREATE.KV_FABRIC_GRAPHS.spy.$KV.FABRIC_GRAPHS.>",
		"$JS.API.CONSUMER.CREATE.FABRIC_OPS.spy.fabric.t.alice.ops.cpu-0.*",
		"$JS.API.CONSUMER.CREATE.OBJ_FABRIC_XFER_alice.spy.$O.FABRIC_XFER_alice.>",
		// Writes to every bucket: the registry, leases, alice's record and graphs, objects.
		"$KV.FABRIC_CTRL.device.cpu-0",
		"$KV.FABRIC_CTRL.lease.cpu-0",
		"$KV.FABRIC_CTRL.tenant.alice",
		"$KV.FABRIC_CTRL.tenant.bob",
		"$KV.FABRIC_GRAPHS.t.alice.x",
		"$O.FABRIC_XFER_alice.C.x",
		"$O.FABRIC_XFER.C.x",
		"$O.FABRIC_RESULTS.C.x",
		"$O.FABRIC_CKPT.C.x",
		// Frames and heartbeats into alice's session, in both layouts.
		aliceNames.Ops("cpu-0", aliceSid),
		aliceNames.Alive("cpu-0", aliceSid),
		"fabric.ops.cpu-0."+aliceSid,
		"fabric.jobs.cpu",
		// The workers' service discovery.
		"$SRV.PING",
		"$SRV.INFO.jetfabric-worker",
		"$SRV.STATS",
	)
	for i, subj := range pubs {
		if err := bob.PublishRequest(subj, fmt.Sprintf("_INBOX_fabric.t.bob.attack.%d", i), []byte(`{"name":"spy","stream_name":"x","config":{"name":"spy"},"last_by_subj":"x"}`)); err != nil {
			t.Fatal(err)
		}
	}
	// Replaying alice's frames as bob: on his own subject, with alice's
	// session token, so a worker that confused the two would answer.
	fb, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: []codec.Op{{Op: "read", In: []uint64{secret.ID()}, Tag: 1}}})
	bobReplies := make(chan *nats.Msg, 16)
	if _, err := bob.ChanSubscribe("_INBOX_fabric.t.bob.frames", bobReplies); err != nil {
		t.Fatal(err)
	}
	bobFrame := func(reply string, data []byte) {
		t.Helper()
		m := &nats.Msg{Subject: "fabric.t.bob.ops.cpu-0." + aliceSid, Data: data, Header: nats.Header{subjects.HeaderReply: []string{reply}}}
		if err := bob.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	bobFrame("_INBOX_fabric.t.bob.frames", fb)
	// A frame forging its Fabric-Reply into alice's inbox, then a sync on
	// bob's own inbox that must report the forgery.
	var forgedAnswers []string
	svc, err := f.b.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	victimSub, err := svc.Subscribe("_INBOX_fabric.t.alice.>", func(m *nats.Msg) {
		var r codec.Result
		if m.Subject == "_INBOX_fabric.t.alice."+aliceSid && codec.Unmarshal(codec.CBOR, m.Data, &r) == nil && r.Tag == 2 {
			mu.Lock()
			forgedAnswers = append(forgedAnswers, m.Subject)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = victimSub.SetPendingLimits(-1, -1)
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	forged, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: []codec.Op{{Op: "full", Shape: []int{2}, Value: 7, Out: []uint64{1}}, {Op: "read", In: []uint64{1}, Tag: 2}}})
	bobFrame("_INBOX_fabric.t.alice."+aliceSid, forged)
	syncF, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: []codec.Op{{Op: "sync", Tag: 3}}})
	bobFrame("_INBOX_fabric.t.bob.frames", syncF)

	// Alice's program runs meanwhile, and gives what it gave alone.
	small, large, _, err := aliceProgram(ctx, alice)
	if err != nil {
		t.Fatalf("alice under attack: %v", err)
	}
	if !bytes.Equal(small, small0) || !bytes.Equal(large, large0) {
		t.Error("alice's read-backs differ from her run alone")
	}

	// Bob's replayed read found nothing of alice's; his forged read was
	// not answered anywhere and his sync names the forgery.
	var answers []codec.Result
	for len(answers) < 2 {
		select {
		case m := <-bobReplies:
			var r codec.Result
			if err := codec.Unmarshal(codec.CBOR, m.Data, &r); err != nil {
				t.Fatal(err)
			}
			answers = append(answers, r)
		case <-ctx.Done():
			t.Fatalf("bob's frames not answered: %+v\nworker:\n%s", answers, f.worker.String())
		}
	}
	if r := answers[0]; r.Tag != 1 || r.Tensor != nil || len(r.Errors) == 0 || r.Errors[0].Code != codec.CodeUnknownID {
		t.Errorf("bob's read of alice's tensor id on his session of the same token: %+v", r)
	}
	if r := answers[1]; r.Tag != 3 || len(r.Errors) != 1 || r.Errors[0].Code != codec.CodePermission || !strings.Contains(r.Errors[0].Message, "outside tenant bob's inbox") {
		t.Errorf("bob's sync after a forged reply: %+v", r)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	if dropped, _ := victimSub.Dropped(); dropped > 0 {
		t.Errorf("%d messages to alice's inbox were not inspected", dropped)
	}
	mu.Lock()
	if len(forgedAnswers) > 0 {
		t.Errorf("the worker answered bob's forged read in alice's inbox: %v", forgedAnswers)
	}
	mu.Unlock()

	// Every attack was refused by the broker, and counted.
	poll.Until(t, 30*time.Second, 20*time.Millisecond, func() error {
		v := f.b.Violations()
		if v.Publish-v0.Publish < uint64(len(pubs)) || v.Subscribe-v0.Subscribe < uint64(len(subs)) {
			return fmt.Errorf("violations counted: %d publishes of %d, %d subscriptions of %d", v.Publish-v0.Publish, len(pubs), v.Subscribe-v0.Subscribe, len(subs))
		}
		return nil
	})
	if err := bob.Flush(); err != nil {
		t.Fatal(err)
	}
	for len(got) > 0 {
		m := <-got
		t.Errorf("bob got a message on %s: %.200q", m.Subject, m.Data)
	}
	mu.Lock()
	nerrs := len(asyncErrs)
	perm := 0
	for _, e := range asyncErrs {
		if strings.Contains(strings.ToLower(e), "permissions violation") {
			perm++
		}
	}
	mu.Unlock()
	if perm != nerrs || perm < len(subs) {
		t.Errorf("bob's connection was told %d permission violations of %d errors", perm, nerrs)
	}
	var m bytes.Buffer
	if err := f.b.WriteMetrics(&m); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.String(), `jetfabric_broker_permission_violations_total{server="jetfabric",kind="publish"}`) {
		t.Errorf("no violations in the metrics:\n%s", m.String())
	}
	// Alice's session is untouched by all of it.
	if d, err := secret.Read(ctx); err != nil || binary.LittleEndian.Uint32(d.Bytes) != math.Float32bits(42) {
		t.Errorf("alice's tensor after the attacks: %v %v", d, err)
	}
	_ = s.Close(ctx)
}

// testCredentials: credentials of another fabric and expired ones are
// refused with a message that names the cause.
func testCredentials(t *testing.T, f *tenantFabric) {
	other := t.TempDir()
	if err := tenant.Init(other); err != nil {
		t.Fatal(err)
	}
	stranger, err := tenant.Add(other, subjects.Default(), codec.Tenant{Name: "alice"}, false)
	if err != nil {
		t.Fatal(err)
	}
	a0 := f.b.Violations().Authentication
	_, err = client.Connect(f.url, client.WithCreds(stranger))
	if !errors.Is(err, client.ErrCredentials) || !strings.Contains(err.Error(), "tenant alice") || !strings.Contains(err.Error(), stranger) {
		t.Errorf("foreign credentials: %v", err)
	}
	expired, err := tenant.Add(f.dir, subjects.Default(), codec.Tenant{Name: "late", Expires: time.Now().Add(-time.Minute)}, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Connect(f.url, client.WithCreds(expired))
	if !errors.Is(err, client.ErrCredentials) || !strings.Contains(err.Error(), "expired at") {
		t.Errorf("expired credentials: %v", err)
	}
	// The broker refuses them too, whoever presents them.
	if nc, err := nats.Connect(f.url, nats.UserCredentials(expired)); err == nil {
		nc.Close()
		t.Error("the broker accepted expired credentials")
	}
	if _, err := client.Connect(f.url, client.WithCreds(filepath.Join(f.dir, "nobody.creds"))); err == nil || !strings.Contains(err.Error(), "nobody.creds") {
		t.Errorf("missing creds file: %v", err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		if n := f.b.Violations().Authentication - a0; n < 2 {
			return fmt.Errorf("%d refused authentications counted", n)
		}
		return nil
	})
}

// testQuotas: sessions, bytes held and frames per second, each refused
// with code quota naming the quota.
func testQuotas(t *testing.T, f *tenantFabric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := f.connect(t, "quota")
	s1, err := q.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s1.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	s2, err := q.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Sync(ctx); !isCode(err, codec.CodeQuota, "session quota") {
		t.Errorf("second session of a tenant with a quota of 1: %v", err)
	}
	// 1 MiB held at most: 512 KiB fits, 768 KiB more does not.
	a := s1.Full([]int{128 << 10}, 1)
	if err := s1.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	b := s1.Full([]int{192 << 10}, 1)
	if _, err := b.Read(ctx); !isCode(err, codec.CodeQuota, "byte quota") {
		t.Errorf("over the byte quota: %v", err)
	}
	a.Free()
	c := s1.Full([]int{192 << 10}, 1)
	if _, err := c.Read(ctx); err != nil {
		t.Errorf("within the byte quota after a free: %v", err)
	}
	// What the quotas count, as devices shows it to the fabric's own user.
	poll.Until(t, time.Minute, 100*time.Millisecond, func() error {
		var out, errb bytes.Buffer
		if code := run(ctx, []string{"devices", "--url", f.url, "--creds", tenant.ServiceCreds(f.dir)}, &out, &errb); code != 0 {
			return fmt.Errorf("devices: %s", errb.String())
		}
		if !regexp.MustCompile(`(?m)^TENANT +DEVICE +SESSIONS +MEMORY +FRAMES/S$`).MatchString(out.String()) ||
			!regexp.MustCompile(`(?m)^quota +cpu-0 +1 +768K +[0-9.]+$`).MatchString(out.String()) {
			return fmt.Errorf("no use of tenant quota in:\n%s", out.String())
		}
		return nil
	})
	// 0.01 frames per second: the first frame runs, the next is refused.
	slow := f.connect(t, "slow")
	s3, err := slow.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s3.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s3.Sync(ctx); !isCode(err, codec.CodeQuota, "frame quota") {
		t.Errorf("over the frame quota: %v", err)
	}
}

func isCode(err error, code, text string) bool {
	var e *codec.Error
	return errors.As(err, &e) && e.Code == code && strings.Contains(e.Message, text)
}

// TestTenantCommand: the tenant command's bad input, a tenant added to a
// running broker with --url, and its list.
func TestTenantCommand(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	runT := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"tenant"}, args...), &out, &errb)
		return code, out.String() + errb.String()
	}
	if code, out := runT("init", "--dir", dir); code != 0 {
		t.Fatal(out)
	}
	for _, bad := range [][]string{
		{},
		{"init", "--dir", dir},       // keys are never replaced
		{"init"},                     // no dir
		{"frobnicate", "--dir", dir}, // no such subcommand
		{"add", "--dir", dir},        // no name
		{"add", "a.b", "--dir", dir}, // a dot in the name
		{"add", "x", "--dir", dir, "--bytes", "10%"},
		{"add", "x", "--dir", dir, "--bytes", "lots"},
		{"add", "x", "--dir", dir, "--expires", "-1h"},
		{"add", "x", "--dir", dir, "--sessions", "-1"},
		{"add", "x", "--dir", t.TempDir()}, // not an auth directory
		{"list", "--dir", t.TempDir()},
		{"revoke", "--dir", dir},              // no name
		{"revoke", "nobody", "--dir", dir},    // no such tenant
		{"revoke", "a.b", "--dir", dir},       // not a tenant's name
		{"revoke", "x", "--dir", t.TempDir()}, // not an auth directory
		{"revoke", "x", "y", "--dir", dir},    // two names
	} {
		if code, out := runT(bad...); code == 0 {
			t.Errorf("tenant %v succeeded:\n%s", bad, out)
		}
	}
	b := brokertest.Run(t, func(c *broker.Config) { c.AuthDir = dir })
	workertest.Run(t, b, workertest.CPUs(1))
	// Added while the broker runs: --url provisions its bucket and record.
	if code, out := runT("add", "late", "--dir", dir, "--bytes", "2MiB", "--url", b.ClientURL()); code != 0 || !strings.Contains(out, "provisioned") {
		t.Fatalf("add --url: %d\n%s", code, out)
	}
	if code, out := runT("add", "late", "--dir", dir); code == 0 {
		t.Errorf("a tenant added twice:\n%s", out)
	}
	if code, out := runT("list", "--dir", dir); code != 0 || !strings.Contains(out, "late\tsessions 0\tbytes 2097152") {
		t.Errorf("list: %d\n%s", code, out)
	}
	c, err := client.Connect(b.ClientURL(), client.WithCreds(filepath.Join(dir, "late.creds")), client.WithInlineUpload(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	testAccountsService(cctx, t, dir, b, c)
	// The tenant lists the registry through its filtered consumer.
	poll.Until(t, time.Minute, 50*time.Millisecond, func() error {
		devs, err := c.Devices(cctx)
		if err != nil || len(devs) != 1 || devs[0].Name != "cpu-0" || !client.Live(devs[0], time.Now()) {
			return fmt.Errorf("devices as a tenant: %+v %v", devs, err)
		}
		return nil
	})
	s, err := c.Open(cctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	x := s.Full([]int{3}, 2)
	if v, err := x.Add(x).Float32s(cctx); err != nil || len(v) != 3 || v[0] != 4 {
		t.Errorf("late's session: %v %v", v, err)
	}
	// Its bucket is 2 MiB: a 4 MiB upload through it is refused.
	_, err = s.Upload(cctx, "float32", []int{1 << 20}, make([]byte, 4<<20))
	if err == nil {
		err = s.Sync(cctx)
	}
	if err == nil || !strings.Contains(err.Error(), "maximum bytes") {
		t.Errorf("a 4 MiB upload into a 2 MiB tenant bucket: %v", err)
	}
}

// testAccountsService: the broker's accounts service applies only
// account JWTs its operator signed, and only the service user may call it.
func testAccountsService(ctx context.Context, t *testing.T, dir string, b *broker.Broker, tenantClient *client.Client) {
	d, err := tenant.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.ClientURL(), broker.ServiceUser(d))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ask := func(body string) (string, error) {
		m, err := nc.RequestWithContext(ctx, "fabric.svc.accounts", []byte(body))
		if err != nil {
			return "", err
		}
		if e := m.Header.Get("Nats-Service-Error"); e != "" {
			return "", errors.New(e)
		}
		return string(m.Data), nil
	}
	if n, err := ask(d.Accounts[d.Account]); err != nil || n != "0" {
		t.Errorf("the fabric's account JWT in force, again: %q %v", n, err)
	}
	ac, err := jwt.DecodeAccountClaims(d.Accounts[d.Account])
	if err != nil {
		t.Fatal(err)
	}
	op, _ := nkeys.CreateOperator()
	foreign, _ := ac.Encode(op)
	for _, bad := range []struct{ body, want string }{
		{"junk", "expected 3 chunks"},
		{foreign, "not signed by the operator"},
	} {
		if n, err := ask(bad.body); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("accounts service given %.24q: %q %v, want an error with %q", bad.body, n, err, bad.want)
		}
	}
	// A tenant may not call it.
	if err := tenantClient.Conn().Publish("fabric.svc.accounts", []byte(d.Accounts[d.Account])); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if err := tenantClient.Conn().LastError(); err == nil || !strings.Contains(err.Error(), "Permissions Violation") {
			return fmt.Errorf("a tenant publishing to the accounts service: %v", err)
		}
		return nil
	})
}

// TestUpWithTenants runs `jetfabric up --auth` as its own process: a
// tenant's session works, and a refused subscription shows in /metrics.
func TestUpWithTenants(t *testing.T) {
	dir := t.TempDir()
	if err := tenant.Init(dir); err != nil {
		t.Fatal(err)
	}
	creds, err := tenant.Add(dir, subjects.Default(), codec.Tenant{Name: "acme"}, false)
	if err != nil {
		t.Fatal(err)
	}
	listen, metrics := freeAddr(t), freeAddr(t)
	_, out := spawn(t, "up", "--auth", dir, "--store", t.TempDir(), "--listen", listen, "--http", "", "--metrics", metrics, "--cpus", "1", "--gpus", "none")
	url := "nats://" + listen
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var c *client.Client
	poll.Until(t, time.Minute, 50*time.Millisecond, func() error {
		var err error
		if c == nil {
			if c, err = client.Connect(url, client.WithCreds(creds)); err != nil {
				return fmt.Errorf("%v\n%s", err, out.String())
			}
		}
		devs, err := c.Devices(ctx)
		if err != nil || len(devs) != 1 || !client.Live(devs[0], time.Now()) {
			return fmt.Errorf("devices: %+v %v\n%s", devs, err, out.String())
		}
		return nil
	})
	defer c.Close()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Full([]int{2}, 3).Float32s(ctx); err != nil || v[1] != 3 {
		t.Fatalf("acme's session: %v %v", v, err)
	}
	nc, err := nats.Connect(url, nats.UserCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync("fabric.>"); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	poll.Until(t, time.Minute, 50*time.Millisecond, func() error {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if want := `jetfabric_broker_permission_violations_total{server="jetfabric",kind="subscribe"} 1`; !strings.Contains(string(b), want) {
			return fmt.Errorf("metrics lack %q:\n%s", want, b)
		}
		return nil
	})
}
