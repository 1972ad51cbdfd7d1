package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker"
	"github.com/jetfabric/jetfabric/sweep"
	"github.com/jetfabric/jetfabric/tenant"
	"github.com/jetfabric/jetfabric/worker"
)

func cpuCores() int { return runtime.GOMAXPROCS(0) }

func logger(w io.Writer, prefix string) func(string, ...any) {
	return func(format string, args ...any) {
		fmt.Fprintf(w, "%s %s"+format+"\n", append([]any{time.Now().Format("15:04:05.000"), prefix}, args...)...)
	}
}

func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	var bf brokerFlags
	bf.register(fs, "127.0.0.1:4222")
	metrics := fs.String("metrics", "", metricsFlagHelp)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	cfg, err := bf.brokerConfig()
	if err != nil {
		return err
	}
	unservedGrace = bf.unservedGrace
	b, err := startBroker(ctx, cfg)
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(*metrics, stderr, b)
	if err != nil {
		_ = shutdown(b, nil)
		return err
	}
	defer stopMetrics()
	fmt.Fprintf(stdout, "jetfabric broker ready: clients %s, monitoring %s, store %s\n", b.ClientURL(), b.MonitorURL(), cfg.StoreDir)
	<-ctx.Done()
	fmt.Fprintf(stdout, "jetfabric broker: shutting down\n")
	return shutdown(b, nil)
}

func startBroker(ctx context.Context, cfg broker.Config) (*broker.Broker, error) {
	b, err := broker.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		_ = b.Shutdown(context.Background())
		return nil, err
	}
	if err := startSweeper(b, unservedGrace); err != nil {
		_ = b.Shutdown(context.Background())
		return nil, err
	}
	return b, nil
}

// unservedGrace is how long the frames of a device no worker serves wait
// before the sweeper answers them no_device and removes them (the flag
// -unserved-grace of broker and up).
var unservedGrace = 30 * time.Second

// startSweeper runs the sweeper of frames no worker will run beside b,
// sweeping while b's node leads JetStream, until b shuts down.
func startSweeper(b *broker.Broker, grace time.Duration) error {
	nc, err := b.Connect(nats.Name("jetfabric-sweeper"), nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	cfg := sweep.DefaultConfig()
	cfg.Names, cfg.Grace, cfg.Active = b.Names(), grace, b.MetaLeader
	sw, err := sweep.New(nc, cfg)
	if err != nil {
		nc.Close()
		return err
	}
	sw.Start()
	b.Attach(func() {
		sw.Stop()
		nc.Close()
	})
	return nil
}

func shutdown(b *broker.Broker, w *worker.Worker) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	var err error
	if w != nil {
		err = w.Stop(ctx)
	}
	if b != nil {
		if e := b.Shutdown(ctx); err == nil {
			err = e
		}
	}
	return err
}

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	var cf clientFlags
	var wf workerFlags
	cf.register(fs, envOr("JETFABRIC_URL", nats.DefaultURL))
	wf.register(fs)
	metrics := fs.String("metrics", "", metricsFlagHelp)
	claim := fs.String("claim", "", "claim the first -cpus free slots of this kind (cpu: cpu-N) instead of naming devices; for replicas of one service")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if wf.id == "" {
		wf.id = worker.DefaultConfig().ID
	}
	if *claim != "" {
		if err := checkClaim(*claim, &wf); err != nil {
			return err
		}
	} else if _, err := wf.config(nil); err != nil {
		return err
	}
	if err := checkURL(cf.url); err != nil {
		return err
	}
	nopts, err := cf.natsOptions()
	if err != nil {
		return err
	}
	logf := logger(stderr, "")
	nc, err := connectRetrying(ctx, cf.url, append(nopts, nats.Name("jetfabric-worker "+wf.id)), logf)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := waitFabric(ctx, nc, cf.url, logf); err != nil {
		return err
	}
	if *claim != "" {
		if err := claimDevices(ctx, nc, *claim, &wf); err != nil {
			return err
		}
	}
	cfg, err := wf.config(logf)
	if err != nil {
		return err
	}
	// Credentials mean a fabric with tenants: serve theirs too, with the
	// records signed by the account that issued the credentials.
	if cf.creds != "" {
		b, err := os.ReadFile(cf.creds)
		if err != nil {
			return err
		}
		if cfg.TenantIssuer, err = tenant.Issuer(b); err != nil {
			return fmt.Errorf("--creds %s: %w", cf.creds, err)
		}
		cfg.Tenants = true
	}
	cfg, closeGPUs, err := wf.withGPUs(cfg, logf)
	if err != nil {
		return err
	}
	defer closeGPUs()
	w, err := newWorker(ctx, nc, cfg)
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(*metrics, stderr, w)
	if err != nil {
		_ = shutdown(nil, w)
		return err
	}
	defer stopMetrics()
	fmt.Fprintf(stdout, "jetfabric worker %s serving %v on %s\n", cfg.ID, w.Devices(), cf.url)
	<-ctx.Done()
	// Said once it is so: main's own reset of the signals (when its
	// context ends) may come after this line.
	signal.Reset(os.Interrupt, syscall.SIGTERM)
	fmt.Fprintf(stdout, "jetfabric worker: stopping (each device writes a last checkpoint, within %v; a second signal exits at once)\n", stopTimeout)
	return shutdown(nil, w)
}

func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	var bf brokerFlags
	var wf workerFlags
	bf.register(fs, "127.0.0.1:4222")
	wf.register(fs)
	metrics := fs.String("metrics", "", metricsFlagHelp+": the broker's and the worker's")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	f, err := startFabric(ctx, bf, wf, stderr)
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(*metrics, stderr, f.b, f.w)
	if err != nil {
		_ = f.close()
		return err
	}
	defer stopMetrics()
	fmt.Fprintf(stdout, "jetfabric up: clients %s, monitoring %s, devices %v\n", f.b.ClientURL(), f.b.MonitorURL(), f.w.Devices())
	<-ctx.Done()
	fmt.Fprintf(stdout, "jetfabric up: shutting down\n")
	return f.close()
}

// fabric is a broker and a worker in this process.
type fabric struct {
	b         *broker.Broker
	nc        *nats.Conn
	w         *worker.Worker
	closeGPUs func()
}

func startFabric(ctx context.Context, bf brokerFlags, wf workerFlags, logw io.Writer) (*fabric, error) {
	bcfg, err := bf.brokerConfig()
	if err != nil {
		return nil, err
	}
	unservedGrace = bf.unservedGrace
	logf := logger(logw, "")
	wcfg, err := wf.config(logf)
	if err != nil {
		return nil, err
	}
	wcfg, closeGPUs, err := wf.withGPUs(wcfg, logf)
	if err != nil {
		return nil, err
	}
	b, err := startBroker(ctx, bcfg)
	if err != nil {
		closeGPUs()
		return nil, err
	}
	wcfg.Tenants, wcfg.TenantIssuer = b.AccountKey() != "", b.AccountKey()
	nc, err := b.Connect(nats.Name("jetfabric-worker " + wcfg.ID))
	if err != nil {
		_ = shutdown(b, nil)
		return nil, err
	}
	w, err := newWorker(ctx, nc, wcfg)
	if err != nil {
		nc.Close()
		_ = shutdown(b, nil)
		closeGPUs()
		return nil, err
	}
	return &fabric{b: b, nc: nc, w: w, closeGPUs: closeGPUs}, nil
}

func (f *fabric) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	err := f.w.Stop(ctx)
	f.closeGPUs()
	f.nc.Close()
	if e := f.b.Shutdown(ctx); err == nil {
		err = e
	}
	return err
}

func runHealthcheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	addr := fs.String("http", "127.0.0.1:8222", "the broker's monitoring host:port")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+"/healthz?js-enabled-only=true", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("nothing answers on http://%s (is the broker running with -http %s?): %w", *addr, *addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s %s", resp.Status, body)
	}
	fmt.Fprintf(stdout, "%s", body)
	return nil
}

// newWorker builds and starts a worker, waiting up to a minute for the
// fabric to be provisioned.
func newWorker(ctx context.Context, nc *nats.Conn, cfg worker.Config) (*worker.Worker, error) {
	w, err := worker.New(nc, cfg)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := w.Start(sctx); err != nil {
		return nil, err
	}
	return w, nil
}

// stopTimeout bounds a clean stop: each serving device writes a last
// checkpoint and gives its lease up, which takes longer on a busy broker.
const stopTimeout = 30 * time.Second
