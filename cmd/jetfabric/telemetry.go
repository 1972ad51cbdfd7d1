package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

// telemetryWatch keeps the latest telemetry sample of every device that
// publishes one (GPU workers, every 2 s by default).
type telemetryWatch struct {
	sub    *nats.Subscription
	mu     sync.Mutex
	latest map[string]codec.Telemetry
	got    chan struct{} // a sample arrived
}

func watchTelemetry(nc *nats.Conn, names subjects.Names) (*telemetryWatch, error) {
	tw := &telemetryWatch{latest: map[string]codec.Telemetry{}, got: make(chan struct{}, 1)}
	var err error
	tw.sub, err = nc.Subscribe(names.TelemetryAll(), func(m *nats.Msg) {
		var s codec.Telemetry
		if json.Unmarshal(m.Data, &s) != nil || s.Device == "" {
			return
		}
		tw.mu.Lock()
		tw.latest[s.Device] = s
		tw.mu.Unlock()
		select {
		case tw.got <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	return tw, nc.Flush()
}

func (tw *telemetryWatch) stop() { _ = tw.sub.Unsubscribe() }

// wait returns once every device in want has a sample, or at ctx's end.
func (tw *telemetryWatch) wait(ctx context.Context, want []string) {
	for {
		tw.mu.Lock()
		n := 0
		for _, d := range want {
			if _, ok := tw.latest[d]; ok {
				n++
			}
		}
		tw.mu.Unlock()
		if n == len(want) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tw.got:
		}
	}
}

// print writes a table of the GPUs among devs: model, utilisation, memory,
// temperature and power as last published (nothing if none published).
func (tw *telemetryWatch) print(w io.Writer, devs []client.Device, now time.Time) {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := false
	for _, d := range devs {
		s, ok := tw.latest[d.Name]
		if !ok {
			continue
		}
		if !header {
			fmt.Fprintf(t, "GPU\tMODEL\tCC\tUTIL\tMEMUTIL\tMEMORY GiB\tTEMP\tPOWER\tAGE\n")
			header = true
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d%%\t%d%%\t%.1f/%.1f\t%d C\t%.0f W\t%s\n", clip(d.Name, 8), clip(strings.TrimPrefix(d.Props["name"], "NVIDIA "), 16), d.Props["compute_capability"],
			s.Util, s.MemUtil, float64(s.MemUsed)/(1<<30), float64(s.MemTotal)/(1<<30), s.TempC, s.PowerW, age(now.Sub(s.Time)))
	}
	t.Flush()
}

// liveGPUs names the live devices of kind gpu.
func liveGPUs(devs []client.Device, now time.Time) []string {
	var out []string
	for _, d := range devs {
		if d.Kind == "gpu" && client.Live(d, now) {
			out = append(out, d.Name)
		}
	}
	return out
}
