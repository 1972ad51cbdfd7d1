// Command jetfabric runs every part of the fabric from one binary:
//
//	jetfabric up        embedded broker and CPU workers in one process
//	jetfabric broker    the broker alone (embedded nats-server with JetStream)
//	jetfabric worker    a worker serving local devices against a broker
//	jetfabric demo      the fabric in a few seconds: devices, a transfer, a job, a failover
//	jetfabric devices   the devices registered with a fabric
//	jetfabric top       a live view of every device (q quits)
//	jetfabric bench     latency and throughput against raw NATS
//	jetfabric train     train an MNIST model on the fabric (starts an embedded fabric without --url)
//	jetfabric certs     a certificate authority and TLS certificates for a test or small deployment
//	jetfabric tenant    credentials of a fabric with tenants (init, add, list)
//	jetfabric healthcheck  exit 0 if a broker's JetStream is healthy
//	jetfabric version   the build's version
//
// Run "jetfabric <command> -h" for what a command does, an example and its
// flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
)

// version is set at build time: go build -ldflags '-X main.version=v1.2.3'
// (the Makefile sets it from git describe).
var version = ""

type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"up", "embedded broker and CPU workers in one process", runUp},
	{"broker", "run the broker (embedded nats-server with JetStream)", runBroker},
	{"worker", "serve local devices to a fabric", runWorker},
	{"demo", "show the fabric in a few seconds, every answer checked (its own fabric without --url)", runDemo},
	{"devices", "list the devices registered with a fabric", runDevices},
	{"top", "live view of every device: state, worker, sessions, lag, ops/s", runTop},
	{"bench", "measure the fabric against raw NATS", runBench},
	{"train", "train an MNIST model, data-parallel over devices (starts an embedded fabric without --url)", runTrain},
	{"certs", "make a certificate authority and TLS certificates for brokers and clients", runCerts},
	{"tenant", "make the credentials of a fabric with tenants: init, add NAME, list, revoke NAME", runTenant},
	{"healthcheck", "exit 0 if a broker's JetStream is healthy", runHealthcheck},
	{"version", "print the version of this build", runVersion},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal asks for a clean stop, which may wait (up to
	// stopTimeout) for last checkpoints to a broker that is gone; the
	// second ends the process at once.
	context.AfterFunc(ctx, stop)
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
	}
	for _, c := range commands {
		if c.name == args[0] {
			stopProfile, err := startProfile(stderr)
			if err != nil {
				fmt.Fprintf(stderr, "jetfabric: %v\n", err)
				return 1
			}
			err = c.run(ctx, args[1:], stdout, stderr)
			stopProfile()
			switch {
			case err == nil:
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.Is(err, errUsage):
				return 2
			}
			fmt.Fprintf(stderr, "jetfabric %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "jetfabric: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errUsage: the flag package already printed what was wrong.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintf(w, "jetfabric: a NATS-brokered compute fabric for tensors\n\nUsage: jetfabric <command> [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.short)
	}
	fmt.Fprintf(w, "\nRun 'jetfabric <command> -h' for what a command does, an example and its flags.\n")
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "jetfabric %s (%s %s/%s)\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}

// buildVersion is main.version when the build set it, else the module
// version of a go install, else the VCS revision the go command stamped,
// else "dev".
func buildVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "dev-" + rev
}

// shorts maps each command to its one-line description, for the help of
// commands without an entry in helps.
var shorts = map[string]string{}

func init() {
	for _, c := range commands {
		shorts[c.name] = c.short
	}
}

// commandHelp is what a command's -h says before its flags: what the
// command does and examples.
type commandHelp struct {
	what     string
	examples []string
}

var helps = map[string]commandHelp{
	"up": {"Runs a broker and CPU workers in this one process: the quickest fabric to try, or one for a\n" +
		"single machine. Clients connect to -listen; the store keeps the stream and checkpoints.",
		[]string{"jetfabric up --store .jetfabric/store --cpus 2", "jetfabric up --store /var/lib/jetfabric --listen 0.0.0.0:4222 --metrics 127.0.0.1:9090"}},
	"broker": {"Runs the broker alone: an embedded nats-server with JetStream, provisioning the fabric's\n" +
		"stream and buckets. Workers and clients connect to it on -listen; with --tls-cert they must use\n" +
		"TLS (and, with --tls-verify, present a client certificate).",
		[]string{"jetfabric broker --store /var/lib/jetfabric --listen 0.0.0.0:4222", "jetfabric broker --store /data --name n1 --cluster jetfabric --routes nats://n1:6222,nats://n2:6222,nats://n3:6222 --replicas 3",
			"jetfabric broker --store /data --tls-cert tls/server.pem --tls-key tls/server-key.pem --tls-ca tls/ca.pem   # TLS required (jetfabric certs)"}},
	"worker": {"Serves this machine's devices (CPU slots, NVIDIA GPUs) to a fabric: it takes their op frames\n" +
		"from the broker, runs them and checkpoints the sessions. With --jobs it also takes jobs from\n" +
		"the job queue; with --adopt it stands by for the devices of workers that die.",
		[]string{"jetfabric worker --url nats://127.0.0.1:4222 --cpus 2", "jetfabric worker --url nats://broker:4222 --claim cpu --adopt --jobs cpu --metrics 0.0.0.0:9090",
			"jetfabric worker --url tls://broker:4222 --tls-ca tls/ca.pem"}},
	"demo": {"Runs a short workload that shows the fabric and checks every answer. Without --url it starts\n" +
		"an embedded fabric of its own (two CPU devices, a job worker and a standby) and also shows a\n" +
		"transfer between devices, a job through the queue and a worker's death survived.",
		[]string{"jetfabric demo", "jetfabric demo --url nats://127.0.0.1:4222"}},
	"devices": {"Lists the devices registered with a fabric: kind, backend, state, sessions and heartbeat,\n" +
		"and for live GPUs their telemetry.",
		[]string{"jetfabric devices --url nats://127.0.0.1:4222", "jetfabric devices --json"}},
	"top": {"Shows every device live, refreshed each --interval: state, worker, sessions, lag behind the\n" +
		"stream, ops per second. q or Ctrl-C quits.",
		[]string{"jetfabric top --url nats://127.0.0.1:4222", "jetfabric top --plain --count 1"}},
	"bench": {"Measures the fabric: round trips and pipelined ops against raw NATS, uploads and reads;\n" +
		"with a GPU --device the GPU kernels; with --scale the job queue on more and more worker\n" +
		"processes.",
		[]string{"jetfabric bench", "jetfabric bench --scale 1,2,4 --json"}},
	"certs": {"Makes a certificate authority of its own (ca.pem, ca-key.pem) and, signed by it, the brokers'\n" +
		"certificate (server.pem, server-key.pem: valid for --hosts, for the client port and for cluster\n" +
		"routes) and a client certificate (client.pem, client-key.pem: for brokers run with --tls-verify).\n" +
		"ECDSA P-256 keys, PEM files; keys readable by their owner only. An authority already in --dir is\n" +
		"reused, so certificates made again are trusted by clients that have its ca.pem. For development,\n" +
		"tests and small deployments; a real deployment may bring certificates of its own.",
		[]string{"jetfabric certs --dir tls --hosts localhost,127.0.0.1,broker,n1,n2,n3",
			"jetfabric broker --store /data --tls-cert tls/server.pem --tls-key tls/server-key.pem --tls-ca tls/ca.pem",
			"jetfabric worker --url tls://127.0.0.1:4222 --tls-ca tls/ca.pem"}},
	"healthcheck": {"Exits 0 if the broker's JetStream answers healthy on its monitoring port (for container\n" +
		"health checks), else 1.",
		[]string{"jetfabric healthcheck --http 127.0.0.1:8222"}},
	"train": {"Trains an MNIST model on the fabric (an MLP, or PyTorch's example CNN) with Adam, data-parallel\n" +
		"over --devices, and reports the test accuracy. Without --url it starts an embedded fabric with\n" +
		"the devices named. The data comes from the Go module cache (or --data).",
		[]string{"jetfabric train --epochs 1", "jetfabric train --model cnn --devices cpu-0,cpu-1 --save mnist.safetensors"}},
	"tenant": {"Makes the credentials of a fabric with tenants: init makes an operator, the fabric's account\n" +
		"and the service user (workers) in --dir; add makes a tenant's creds file and quotas; revoke ends\n" +
		"every credential a tenant was given (a broker serving --dir applies it within a second). Start the\n" +
		"broker with --auth DIR, workers with --creds DIR/service.creds, clients with --creds NAME.creds.",
		[]string{"jetfabric tenant init --dir auth", "jetfabric tenant add acme --dir auth --sessions 8 --bytes 4GiB --fps 2000 --expires 720h",
			"jetfabric tenant revoke acme --dir auth"}},
	"version": {"Prints the version of this build, the Go version and the platform.",
		[]string{"jetfabric version", "jetfabric --version"}},
}

// printHelp writes a command's help: what it does, examples, and its flags
// except those whose usage starts with "internal:".
func printHelp(w io.Writer, fs *flag.FlagSet) {
	name := fs.Name()
	h, ok := helps[name]
	if !ok {
		what := name
		if s := shorts[name]; s != "" {
			what = strings.ToUpper(s[:1]) + s[1:] + "."
		}
		h = commandHelp{what: what, examples: []string{"jetfabric " + name}}
	}
	fmt.Fprintf(w, "jetfabric %s: %s\n\nExamples:\n", name, h.what)
	for _, e := range h.examples {
		fmt.Fprintf(w, "  %s\n", e)
	}
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, "internal:") {
			return
		}
		if n == 0 {
			fmt.Fprintf(w, "\nFlags:\n")
		}
		n++
		kind, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if kind != "" {
			line += " " + kind
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch {
		case f.DefValue == "" || f.DefValue == "false" || f.DefValue == "0":
		case kind == "string":
			line += fmt.Sprintf(" (default %q)", f.DefValue)
		default:
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// parse parses flags, mapping errors to errUsage.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	fs.Usage = func() { printHelp(fs.Output(), fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %v\n", fs.Args())
		return errUsage
	}
	return nil
}
