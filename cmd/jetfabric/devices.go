package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/subjects"
)

func runDevices(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("devices", flag.ContinueOnError)
	var cf clientFlags
	cf.register(fs, envOr("JETFABRIC_URL", nats.DefaultURL))
	asJSON := fs.Bool("json", false, "print the registry entries as JSON")
	wait := fs.Duration("telemetry-wait", 3*time.Second, "how long to wait for the telemetry of live GPUs")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	c, err := cf.connect()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	devs, err := c.Devices(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(devs)
	}
	printDevices(stdout, devs, time.Now())
	printTenants(stdout, devs)
	if gpus := liveGPUs(devs, time.Now()); len(gpus) > 0 {
		// GPU workers publish telemetry every few seconds: wait for one round.
		tw, err := watchTelemetry(c.Conn(), subjects.Default())
		if err != nil {
			return err
		}
		defer tw.stop()
		wctx, cancel := context.WithTimeout(ctx, *wait)
		tw.wait(wctx, gpus)
		cancel()
		fmt.Fprintln(stdout)
		tw.print(stdout, devs, time.Now())
	}
	return nil
}

func printDevices(w io.Writer, devs []client.Device, now time.Time) {
	if len(devs) == 0 {
		fmt.Fprintf(w, "no devices registered: start a worker (jetfabric worker --url ...)\n")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DEVICE\tKIND\tBACKEND\tSTATE\tSESSIONS\tMEMORY\tAPPLIED\tLAG\tWORKER\tHEARTBEAT\n")
	for _, d := range devs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%v ago\n", d.Name, d.Kind, d.Backend, deviceState(d, now), d.Sessions, memoryText(d), d.Applied, d.Lag, d.Worker, now.Sub(d.Beat).Round(time.Millisecond))
	}
	tw.Flush()
}

// printTenants writes each tenant's use of each device as the devices'
// entries report it (with tenants only; nothing when no tenant uses any),
// and the tenant's use of all of them, which its quotas bound.
func printTenants(w io.Writer, devs []client.Device) {
	use := map[string]map[string]codec.TenantUse{}
	for _, d := range devs {
		for tn, u := range d.Tenants {
			if use[tn] == nil {
				use[tn] = map[string]codec.TenantUse{}
			}
			use[tn][d.Name] = u
		}
	}
	if len(use) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TENANT\tDEVICE\tSESSIONS\tMEMORY\tFRAMES/S\n")
	row := func(tn, dev string, u codec.TenantUse) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", tn, dev, u.Sessions, byteText(u.Bytes), strconv.FormatFloat(u.FPS, 'f', 1, 64))
	}
	for _, tn := range slices.Sorted(maps.Keys(use)) {
		var all codec.TenantUse
		for _, dev := range slices.Sorted(maps.Keys(use[tn])) {
			u := use[tn][dev]
			row(tn, dev, u)
			all.Sessions += u.Sessions
			all.Bytes += u.Bytes
			all.FPS += u.FPS
		}
		if len(use[tn]) > 1 {
			row(tn, "all", all)
		}
	}
	tw.Flush()
}

// stuckAfter is how long a device with frames waiting may run none before
// it shows as stuck.
const stuckAfter = 5 * time.Second

// deviceState is a registry entry's state as devices and top show it:
// lost (serving, but no recent heartbeat), stalled (its worker found its
// consumer delivering nothing while frames wait, and is creating it
// again), stuck (frames wait, none ran for stuckAfter), behind (frames
// wait), else the entry's own (serving, stopped).
func deviceState(d client.Device, now time.Time) string {
	if d.State != "serving" {
		return d.State
	}
	switch {
	case !client.Live(d, now):
		return "lost"
	case d.Stalled:
		return "stalled"
	case d.Lag > 0 && !d.LastFrame.IsZero() && now.Sub(d.LastFrame) > stuckAfter:
		return fmt.Sprintf("stuck %v", now.Sub(d.LastFrame).Round(time.Second))
	case d.Lag > 0:
		return "behind"
	}
	return d.State
}

// memoryText is a device's tensor memory and budget, as 1.5G/12G.
func memoryText(d client.Device) string {
	if d.Budget <= 0 {
		return byteText(d.Bytes)
	}
	return byteText(d.Bytes) + "/" + byteText(d.Budget)
}

// byteText writes n bytes in binary units, to 2 significant digits or so.
func byteText(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	f, u := float64(n)/1024, 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	prec := 0
	if f < 10 {
		prec = 1
	}
	return strconv.FormatFloat(f, 'f', prec, 64) + units[u:u+1]
}
