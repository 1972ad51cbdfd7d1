// Command jetfabric runs every part of the fabric from one binary:
//
//	jetfabric up        embedded broker and CPU workers in one process
//	jetfabric broker    the broker alone (embedded nats-server with JetStream)
//	jetfabric worker    a worker serving local devices against a broker
//	jetfabric demo      a short workload that shows the fabric, checked
//	jetfabric devices   the devices registered with a fabric
//	jetfabric top       a live view of every device (q quits)
//	jetfabric bench     latency and throughput against raw NATS
//	jetfabric train     train an MNIST model on the fabric (starts an embedded fabric without --url)
//	jetfabric healthcheck  exit 0 if a broker's JetStream is healthy
//
// Run "jetfabric <command> -h" for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name  string
	short string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"up", "embedded broker and CPU workers in one process", runUp},
	{"broker", "run the broker (embedded nats-server with JetStream)", runBroker},
	{"worker", "serve local devices to a fabric", runWorker},
	{"demo", "run a short checked workload (starts an embedded fabric without --url)", runDemo},
	{"devices", "list the devices registered with a fabric", runDevices},
	{"top", "live view of every device: state, sessions, applied, lag, ops/s", runTop},
	{"bench", "measure the fabric against raw NATS", runBench},
	{"train", "train an MNIST model, data-parallel over devices (starts an embedded fabric without --url)", runTrain},
	{"healthcheck", "exit 0 if a broker's JetStream is healthy", runHealthcheck},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
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
	fmt.Fprintf(w, "\nRun 'jetfabric <command> -h' for a command's flags.\n")
}

// parse parses flags, mapping errors to errUsage.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
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
