package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/subjects"
)

// ANSI sequences of the terminal view.
const (
	ansiHome      = "\x1b[H"
	ansiClear     = "\x1b[2J"
	ansiClearEOL  = "\x1b[K"
	ansiClearDown = "\x1b[J"
	ansiHide      = "\x1b[?25l"
	ansiShow      = "\x1b[?25h"
)

func runTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs, envOr("JETFABRIC_URL", nats.DefaultURL))
	interval := fs.Duration("interval", time.Second, "time between refreshes")
	count := fs.Int("count", 0, "quit after this many refreshes (0: until q or Ctrl-C)")
	plain := fs.Bool("plain", false, "print plain tables even when stdout is a terminal")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *interval < 100*time.Millisecond {
		return fmt.Errorf("-interval %v: want at least 100ms", *interval)
	}
	if *count < 0 {
		return fmt.Errorf("-count %d: want 0 or more", *count)
	}
	c, err := cf.connect()
	if err != nil {
		return err
	}
	defer c.Close()

	term := !*plain && isTerminal(stdout)
	var quit <-chan struct{}
	if term {
		q, restore := watchKeys()
		defer restore()
		quit = q
		fmt.Fprint(stdout, ansiHide+ansiHome+ansiClear)
		defer fmt.Fprint(stdout, ansiShow)
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	tp := &topView{nc: c.Conn(), names: subjects.Default(), prev: map[string]topSample{}}
	if tp.tel, err = watchTelemetry(c.Conn(), tp.names); err != nil {
		return err
	}
	defer tp.tel.stop()
	for n := 0; *count == 0 || n < *count; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-quit:
				return nil
			case <-t.C:
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		devs, err := c.Devices(rctx)
		cancel()
		if err != nil && ctx.Err() != nil {
			return nil
		}
		var buf bytes.Buffer
		now := time.Now()
		if err != nil {
			fmt.Fprintf(&buf, "registry: %v\n", err)
		} else {
			tp.render(ctx, &buf, devs, now)
		}
		header := fmt.Sprintf("jetfabric top  %s  every %v", now.Format("15:04:05"), *interval)
		if term {
			header += "  (q quits)"
		}
		header += "  " + clip(cf.url, 78-len(header))
		if term {
			out := ansiHome + header + ansiClearEOL + "\n"
			for _, line := range bytes.SplitAfter(buf.Bytes(), []byte("\n")) {
				if len(line) > 0 {
					out += string(bytes.TrimSuffix(line, []byte("\n"))) + ansiClearEOL + "\n"
				}
			}
			fmt.Fprint(stdout, out+ansiClearDown)
		} else {
			fmt.Fprintf(stdout, "%s\n%s\n", header, buf.Bytes())
		}
	}
	return nil
}

// topSample is what a device's rate is computed from.
type topSample struct {
	worker string
	ops    uint64
	at     time.Time
}

type topView struct {
	nc    *nats.Conn
	names subjects.Names
	prev  map[string]topSample
	tel   *telemetryWatch // nil: no GPU table
}

// render writes one table of devs. A live device's entry is refreshed from
// its worker's info endpoint (the registry is rewritten only once a
// heartbeat), and its ops/s comes from the previous refresh.
func (v *topView) render(ctx context.Context, w io.Writer, devs []client.Device, now time.Time) {
	if len(devs) == 0 {
		fmt.Fprintf(w, "no devices registered: start a worker (jetfabric worker --url ...)\n")
		return
	}
	var wg sync.WaitGroup
	for i := range devs {
		if client.Live(devs[i], now) {
			wg.Go(func() { v.refresh(ctx, &devs[i]) })
		}
	}
	wg.Wait()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DEVICE\tSTATE\tWORKER\tSESS\tMEM\tLAG\tOPS/S\tOPS\tBEAT\n")
	for _, d := range devs {
		state := deviceState(d, now)
		rate := "-"
		if p, ok := v.prev[d.Name]; ok && p.worker == d.Worker && d.Ops >= p.ops && now.Sub(p.at) > 0 && client.Live(d, now) {
			rate = count(uint64(float64(d.Ops-p.ops) / now.Sub(p.at).Seconds()))
		}
		v.prev[d.Name] = topSample{worker: d.Worker, ops: d.Ops, at: now}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", clip(d.Name, 10), state, clip(d.Worker, 12),
			d.Sessions, byteText(d.Bytes), count(d.Lag), rate, count(d.Ops), age(now.Sub(d.Beat)))
	}
	tw.Flush()
	if v.tel != nil && len(liveGPUs(devs, now)) > 0 {
		fmt.Fprintln(w)
		v.tel.print(w, devs, now)
	}
}

// count writes n in at most 6 characters: as is below a million, else
// with a k, M or G suffix.
func count(n uint64) string {
	switch {
	case n < 1_000_000:
		return strconv.FormatUint(n, 10)
	case n < 1_000_000_000:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	case n < 1_000_000_000_000:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 1, 64) + "G"
	}
	return strconv.FormatFloat(float64(n)/1e12, 'f', 0, 64) + "T"
}

// age writes a duration in at most 6 characters: 0.3s, 42s, 7m, 5h, 3d.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < 10*time.Second:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < 100*time.Second:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 100*time.Minute:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}

// clip shortens s to n characters, keeping its end (a worker id ends in
// its pid) behind a "~".
func clip(s string, n int) string {
	switch {
	case len(s) <= n:
		return s
	case n < 2:
		return ""
	}
	return "~" + s[len(s)-n+1:]
}

// refresh replaces *d with the worker's answer on the device's info
// endpoint, if it answers in time.
func (v *topView) refresh(ctx context.Context, d *client.Device) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	m, err := v.nc.RequestWithContext(ctx, v.names.ServiceInfo(d.Name), nil)
	if err != nil {
		return
	}
	var fresh client.Device
	if json.Unmarshal(m.Data, &fresh) == nil && fresh.Name == d.Name {
		*d = fresh
	}
}
