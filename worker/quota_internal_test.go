package worker

import (
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/codec"
)

// TestFrameShare: a device's frames a second for a tenant are the quota
// less what the others ran for it, and at least an equal share among the
// devices running its frames.
func TestFrameShare(t *testing.T) {
	rec := &codec.Tenant{Name: "q", FPS: 10}
	for _, c := range []struct {
		others codec.TenantUse
		want   int // frames allowed in the first 10 s
	}{
		{codec.TenantUse{}, 10 + 100},                  // alone: a second's burst, then 10 a second
		{codec.TenantUse{FPS: 2, Devices: 1}, 8 + 80},  // 10 less 2
		{codec.TenantUse{FPS: 9, Devices: 1}, 5 + 50},  // an equal share of two
		{codec.TenantUse{FPS: 30, Devices: 3}, 2 + 25}, // a quarter: 2.5 a second (a burst of 2 whole frames)
	} {
		d := &device{}
		d.view.Store(&codec.QuotaView{Tenants: map[string]codec.TenantUse{"q": c.others}})
		u := d.useOf("q")
		start := time.Unix(1000, 0)
		n := 0
		for i := range 10_000 { // a frame every millisecond
			if d.allowFrame(u, "q", rec, start.Add(time.Duration(i)*time.Millisecond)) {
				n++
			}
		}
		if n < c.want-1 || n > c.want+1 {
			t.Errorf("others %+v: %d frames in 10 s, want about %d", c.others, n, c.want)
		}
	}
	if !(&device{}).allowFrame(&tenantUse{}, "q", &codec.Tenant{Name: "q"}, time.Now()) {
		t.Error("a tenant without a frame quota refused")
	}
	// A frame stamped before the last one (a stream leader elected on
	// another node, its clock behind) neither refills nor goes back.
	d, u := &device{}, &tenantUse{}
	at := time.Unix(1000, 0)
	for range 10 {
		d.allowFrame(u, "q", rec, at) // the burst of 10, spent
	}
	if d.allowFrame(u, "q", rec, at.Add(-time.Hour)) || !u.at.Equal(at) {
		t.Errorf("a frame stamped an hour earlier: tokens %g, at %v", u.tokens, u.at)
	}
	if !d.allowFrame(u, "q", rec, at.Add(100*time.Millisecond)) {
		t.Error("no frame 0.1 s later at 10 a second")
	}
}

func TestRoundRate(t *testing.T) {
	for in, want := range map[float64]float64{0: 0, -1: 0, 0.0123: 0.012, 1.26: 1.3, 97.4: 97, 12345: 12000} {
		if got := roundRate(in); got < want*0.999 || got > want*1.001 {
			t.Errorf("roundRate(%g) = %g, want %g", in, got, want)
		}
	}
}
