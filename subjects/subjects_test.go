package subjects

import (
	"errors"
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	n := Default()
	for _, c := range []struct{ got, want string }{
		{n.OpsStream(), "FABRIC_OPS"},
		{n.CtrlBucket(), "FABRIC_CTRL"},
		{n.XferBucket(), "FABRIC_XFER"},
		{n.ResultsBucket(), "FABRIC_RESULTS"},
		{n.Ops("cpu-0", "s1"), "fabric.ops.cpu-0.s1"},
		{n.OpsDevice("gpu-3"), "fabric.ops.gpu-3.*"},
		{n.OpsAll(), "fabric.ops.>"},
		{n.Telemetry("gpu-0"), "fabric.telemetry.gpu-0"},
		{n.Alive("cpu-0", "s1"), "fabric.alive.cpu-0.s1"},
		{n.AliveDevice("cpu-0"), "fabric.alive.cpu-0.*"},
		{n.WorkerLive("abc"), "fabric.live.abc"},
		{n.InboxPrefix(), "_INBOX_fabric"},
		{n.ServiceInfo("cpu-0"), "fabric.svc.cpu-0.info"},
		{n.ServiceHealth("gpu-2"), "fabric.svc.gpu-2.health"},
		{DeviceKey("cpu-1"), "device.cpu-1"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	p, err := New("lab-2")
	if err != nil {
		t.Fatal(err)
	}
	if p.OpsStream() != "LAB_2_OPS" || p.Ops("cpu-0", "x") != "lab-2.ops.cpu-0.x" {
		t.Errorf("prefix lab-2: %s %s", p.OpsStream(), p.Ops("cpu-0", "x"))
	}
}

func TestValidateToken(t *testing.T) {
	for _, ok := range []string{"a", "cpu-0", "GPU_1", strings.Repeat("x", MaxTokenLen)} {
		if err := ValidateToken(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a.b", "a*", ">", "a b", "ü", "a\x00", strings.Repeat("x", MaxTokenLen+1), "tab\t"} {
		if err := ValidateToken(bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%q: got %v, want ErrInvalidToken", bad, err)
		}
	}
	for _, bad := range []string{"", "a.b", "FABRIC!"} {
		if _, err := New(bad); !errors.Is(err, ErrInvalidPrefix) {
			t.Errorf("prefix %q: %v", bad, err)
		}
	}
}

func TestParseOps(t *testing.T) {
	n := Default()
	dev, sess, err := n.ParseOps("fabric.ops.cpu-0.abc")
	if err != nil || dev != "cpu-0" || sess != "abc" {
		t.Fatalf("got %q %q %v", dev, sess, err)
	}
	for _, bad := range []string{"fabric.ops.cpu-0", "other.ops.cpu-0.s", "fabric.ops.cpu-0.s.extra", "fabric.ops..s", "fabric.ops.cpu-0.a!b", ""} {
		if _, _, err := n.ParseOps(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseOps(f *testing.F) {
	for _, s := range []string{"fabric.ops.cpu-0.abc", "fabric.ops.a.b.c", "fabric.ops.", "x"} {
		f.Add(s)
	}
	n := Default()
	f.Fuzz(func(t *testing.T, s string) {
		dev, sess, err := n.ParseOps(s)
		if err != nil {
			return
		}
		if ValidateToken(dev) != nil || ValidateToken(sess) != nil {
			t.Fatalf("%q parsed into invalid tokens %q %q", s, dev, sess)
		}
		if n.Ops(dev, sess) != s {
			t.Fatalf("%q does not round-trip: %q", s, n.Ops(dev, sess))
		}
	})
}

func TestAnswerable(t *testing.T) {
	n := Default()
	a, err := n.ForTenant("acme")
	if err != nil {
		t.Fatal(err)
	}
	for reply, want := range map[string]bool{
		"_INBOX_fabric.abc":                true,
		a.InboxPrefix() + ".x.1":           true,
		"_INBOX.xyz":                       true,
		"":                                 false,
		"$KV.FABRIC_CTRL.lease.cpu-0":      false,
		"$O.FABRIC_XFER.C.abc":             false,
		"$JS.API.STREAM.DELETE.FABRIC_OPS": false,
		"fabric.ops.cpu-0.s1":              false,
		"fabric.t.acme.ops.cpu-0.s1":       false,
		"fabricated":                       true,
	} {
		if got := n.Answerable(reply); got != want {
			t.Errorf("Answerable(%q) = %v, want %v", reply, got, want)
		}
	}
}
