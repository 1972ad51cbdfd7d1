package subjects

import "testing"

func TestTenantNames(t *testing.T) {
	n := Default()
	a, err := n.ForTenant("acme")
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		a.Ops("cpu-0", "s1"):   "fabric.t.acme.ops.cpu-0.s1",
		a.Alive("cpu-0", "s1"): "fabric.t.acme.alive.cpu-0.s1",
		a.InboxPrefix():        "_INBOX_fabric.t.acme",
		a.XferBucket():         "FABRIC_XFER_acme",
		a.GraphKey("g"):        "t.acme.g",
		a.JobKeyOf("j"):        "t.acme.job.j",
		n.Ops("cpu-0", "s1"):   "fabric.ops.cpu-0.s1",
		n.InboxPrefix():        "_INBOX_fabric",
		n.XferBucket():         "FABRIC_XFER",
		n.GraphKey("g"):        "g",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", ">", string(make([]byte, 65))} {
		if _, err := n.ForTenant(bad); err == nil && bad != "" {
			t.Errorf("tenant %q accepted", bad)
		}
	}
}

func TestParseFrame(t *testing.T) {
	n := Default()
	for _, c := range []struct{ subj, tenant, device, session string }{
		{"fabric.ops.cpu-0.s1", "", "cpu-0", "s1"},
		{"fabric.t.acme.ops.cpu-0.s1", "acme", "cpu-0", "s1"},
	} {
		tn, d, s, err := n.ParseFrame(c.subj)
		if err != nil || tn != c.tenant || d != c.device || s != c.session {
			t.Errorf("%s: %q %q %q %v", c.subj, tn, d, s, err)
		}
	}
	for _, bad := range []string{"fabric.t.acme", "fabric.t..ops.cpu-0.s1", "fabric.t.acme.jobs.cpu", "fabric.t.acme.ops.cpu-0", "fabric.t.a*.ops.cpu-0.s1", "fabric.t.acme.ops.cpu-0.s1.x", "other.t.acme.ops.cpu-0.s1"} {
		if tn, d, s, err := n.ParseFrame(bad); err == nil {
			t.Errorf("%s accepted as %q %q %q", bad, tn, d, s)
		}
	}
	if tn, _, s, err := n.ParseAlive("fabric.t.acme.alive.cpu-0.s1"); err != nil || tn != "acme" || s != "s1" {
		t.Errorf("alive: %q %q %v", tn, s, err)
	}
	for _, bad := range []string{"fabric.t.acme.ops.cpu-0.s1", "fabric.alive.cpu-0", "fabric.t.a.b.alive.cpu-0.s1"} {
		if _, _, _, err := n.ParseAlive(bad); err == nil {
			t.Errorf("alive %s accepted", bad)
		}
	}
	if SessionKey("acme", "s1") != "acme.s1" || SessionTenant("acme.s1") != "acme" || SessionTenant("s1") != "" {
		t.Error("session keys")
	}
}
