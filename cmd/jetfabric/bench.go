package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/internal/certs"
	"github.com/jetfabric/jetfabric/subjects"
	"github.com/jetfabric/jetfabric/worker"
)

// benchReport is what `jetfabric bench --json` prints.
type benchReport struct {
	Layout   string `json:"layout"`
	Machine  string `json:"machine"`
	GoMaxPro int    `json:"gomaxprocs"`

	RoundTripP50us   float64 `json:"roundtrip_p50_us"`
	RoundTripP99us   float64 `json:"roundtrip_p99_us"`
	RawRequestP50us  float64 `json:"raw_request_p50_us"`
	RawRequestP99us  float64 `json:"raw_request_p99_us"`
	RoundTripRatio   float64 `json:"roundtrip_ratio_p50"`
	FloorP50us       float64 `json:"js_floor_p50_us"`
	FloorP99us       float64 `json:"js_floor_p99_us"`
	FloorRatio       float64 `json:"js_floor_ratio_p50"`
	PipelinedOpsPerS float64 `json:"pipelined_ops_per_s"`
	// ReplayOpsPerS counts the ops inside replays of a captured chain of
	// ReplayChain adds, run like the pipelined chain.
	ReplayOpsPerS     float64 `json:"replay_ops_per_s"`
	ReplayChain       int     `json:"replay_chain"`
	FrameBytes        int     `json:"frame_bytes"`
	OpsPerFrame       int     `json:"ops_per_frame"`
	RawPublishFramesS float64 `json:"raw_js_publish_frames_per_s"`
	RawPublishOpsS    float64 `json:"raw_js_publish_equiv_ops_per_s"`
	UploadMBs         float64 `json:"upload_64mib_mb_per_s"`
	ReadMBs           float64 `json:"read_64mib_mb_per_s"`
	// SHA256MBs is one core's SHA-256 rate on this machine: the object
	// store hashes every byte of an upload and a read-back at each end.
	SHA256MBs   float64   `json:"sha256_mb_per_s,omitempty"`
	XferStorage string    `json:"xfer_storage"`
	Device      string    `json:"device"`
	NoFusion    bool      `json:"no_fusion,omitempty"`
	NoPrograms  bool      `json:"no_programs,omitempty"`
	TF32        bool      `json:"tf32,omitempty"`
	Lanes       int       `json:"lanes,omitempty"`
	GPU         *gpuBench `json:"gpu,omitempty"`
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	layout := fs.String("layout", "inproc", "inproc: broker, worker and client in this process; procs: broker, worker and the raw responder as separate processes")
	fabricURL := fs.String("url", "", "measure the fabric already running at this URL (its broker and a worker serving -device) instead of starting one; the raw responder starts as a separate process")
	rounds := fs.Int("rounds", 2000, "round trips to time")
	ops := fs.Int("ops", 300000, "ops in the pipelined run")
	upload := fs.Int("upload-mib", 64, "size of the upload and read-back in MiB (0 skips)")
	xferStorage := fs.String("xfer-storage", "file", "the broker's -xfer-storage: file or memory")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	echo := fs.String("serve-echo", "", "internal: serve the raw responder on this URL until stopped")
	echoCA := fs.String("serve-echo-tls-ca", "", "internal: the CA of the raw responder's TLS connection")
	withTLS := fs.Bool("tls", false, "measure twice in one run, alternating: a fabric without TLS and one whose every connection (client, worker, raw responder) uses TLS; report both and their ratio")
	tlsRuns := fs.Int("tls-runs", 3, "with -tls: measurements of each fabric, alternating; the report gives the medians")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (broker, worker and client in -layout inproc) to this file")
	ckpt := fs.Duration("checkpoint-interval", 30*time.Second, "the worker's checkpoint interval (0: only on request), to measure what checkpoints cost")
	device := fs.String("device", "cpu-0", "the device to measure; a gpu-N also runs the matmul and fused-chain benchmarks")
	gpus := fs.String("gpus", "", "the worker's -gpus (default: all when -device is a GPU, else none)")
	noFusion := fs.Bool("no-fusion", false, "the worker runs every op by itself (the unfused baseline)")
	tf32 := fs.Bool("tf32", false, "the worker's float32 matmuls on GPUs use TF32 tensor cores")
	noChains := fs.Bool("no-gpu-chains", false, "the worker launches each elementwise op on a GPU by itself")
	noPrograms := fs.Bool("no-programs", false, "the worker replays graphs op by op on a GPU, not as recorded programs (CUDA graphs)")
	lanes := fs.Int("lanes", 0, "the worker's and the client's -lanes: connections that move the upload and read-back as pieces in parallel (0: their default, one for every four cores, up to 4)")
	matN := fs.Int("matmul-n", 4096, "with a GPU -device: matrix size of the matmul chain")
	matChain := fs.Int("matmul-chain", 100, "with a GPU -device: products in the matmul chain")
	chainMiB := fs.Int("chain-mib", 256, "with a GPU -device: MiB of float32 the 8-op chain runs over")
	chainRuns := fs.Int("chain-runs", 50, "with a GPU -device: timed runs of the 8-op chain")
	scale := fs.String("scale", "", "horizontal scaling instead: the same sets of jobs through the job queue on these numbers of worker processes, e.g. 1,2,4")
	var sc scaleConfig
	fs.IntVar(&sc.jobs, "scale-jobs", 32, "with -scale: jobs in a set")
	fs.StringVar(&sc.gpus, "scale-gpus", "none", "with -scale: the workers' -gpus (none: CPU-only workers; cpu jobs run on the CPU either way)")
	fs.IntVar(&sc.n, "scale-n", 256, "with -scale: matrix size of a job")
	fs.IntVar(&sc.chain, "scale-chain", 8, "with -scale: matmuls in a job's chain")
	fs.IntVar(&sc.sets, "scale-sets", 3, "with -scale: timed sets at each step")
	fs.IntVar(&sc.cores, "worker-cores", 0, "with -scale: GOMAXPROCS of each worker (0: all)")
	soak := fs.String("soak", "", "the state soak instead: sessions holding this many bytes in all (e.g. 3GiB; 8GiB on a 16-core host), checkpointed and their worker process SIGKILLed with a standby waiting, beside a run with no checkpoints and no kills")
	sk := soakConfig{sessions: 20, tensor: 16 << 20, steps: 25, every: 4 * time.Second, probes: 4, ckpt: 10 * time.Second, kills: 3, settle: 25 * time.Second}
	fs.IntVar(&sk.sessions, "soak-sessions", sk.sessions, "with -soak: sessions")
	fs.Func("soak-tensor", "with -soak: bytes of each tensor (default 16MiB)", func(v string) error {
		var err error
		sk.tensor, err = parseSize(v)
		return err
	})
	fs.IntVar(&sk.steps, "soak-steps", sk.steps, "with -soak: steps of each session (a step rewrites one of its tensors, reads its sum, then times -soak-probes tiny op + read round trips)")
	fs.DurationVar(&sk.every, "soak-step-every", sk.every, "with -soak: a session's step period")
	fs.IntVar(&sk.probes, "soak-probes", sk.probes, "with -soak: tiny op + read round trips a step")
	fs.DurationVar(&sk.ckpt, "soak-checkpoint-interval", sk.ckpt, "with -soak: the worker's checkpoint interval")
	fs.IntVar(&sk.kills, "soak-kills", sk.kills, "with -soak: SIGKILLs of the device's worker, each once the owner has committed a checkpoint")
	fs.DurationVar(&sk.leaseTTL, "soak-lease-ttl", 0, "with -soak: the workers' lease TTL (0: the default)")
	fs.DurationVar(&sk.settle, "soak-settle", sk.settle, "with -soak: how long the worker idles after the sessions are freed before its memory is taken")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if *echo != "" {
		var opts []nats.Option
		if *echoCA != "" {
			opts = append(opts, nats.RootCAs(*echoCA))
		}
		return serveEcho(ctx, *echo, opts...)
	}
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", a...) }
	if *soak != "" {
		var err error
		if sk.held, err = parseSize(*soak); err != nil {
			return fmt.Errorf("-soak: %w", err)
		}
		return benchSoak(ctx, sk, *asJSON, stdout, progress)
	}
	if *scale != "" {
		var err error
		if sc.workers, err = parseScale(*scale); err != nil {
			return err
		}
		return benchScale(ctx, sc, *asJSON, stdout, progress)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *gpus == "" {
		*gpus = "none"
		if strings.HasPrefix(*device, "gpu-") {
			*gpus = "all"
		}
	}
	if *lanes < 0 || *lanes > worker.MaxLanes {
		return fmt.Errorf("-lanes %d: want 0 (the default) to %d", *lanes, worker.MaxLanes)
	}
	bw := benchWorker{gpus: *gpus, noFusion: *noFusion, noChains: *noChains, noPrograms: *noPrograms, tf32: *tf32, xferStorage: *xferStorage, lanes: *lanes}
	if *withTLS {
		if *tlsRuns < 1 {
			return fmt.Errorf("-tls-runs %d: want at least 1", *tlsRuns)
		}
		return benchTLS(ctx, *layout, *ckpt, bw, *device, *rounds, *ops, *upload, *tlsRuns, *asJSON, stdout, progress)
	}
	var url string
	var stop func()
	var err error
	if *fabricURL != "" {
		*layout = "url"
		url, stop, err = benchEcho(*fabricURL, progress)
	} else {
		url, stop, err = benchFabric(ctx, *layout, *ckpt, bw, progress)
	}
	if err != nil {
		return err
	}
	defer stop()
	rep := benchReport{XferStorage: *xferStorage, Layout: *layout, GoMaxPro: runtime.GOMAXPROCS(0), Machine: fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())}
	switch *layout {
	case "url":
		rep.Layout, rep.XferStorage = "the fabric at "+url+" (the raw responder a separate process)", "as the broker keeps it"
	case "inproc":
		rep.Layout = "all in one process (broker, worker, client; TCP loopback)"
	default:
		rep.Layout = "separate processes (broker, worker, raw responder, client; TCP loopback)"
	}
	rep.Device, rep.NoFusion, rep.NoPrograms, rep.TF32 = *device, *noFusion, *noPrograms, *tf32
	var copts []client.Option
	rep.Lanes = *lanes
	if *lanes == 0 {
		rep.Lanes = worker.DefaultLanes()
	} else {
		copts = append(copts, client.WithLanes(*lanes))
	}
	var dev *devBench
	if strings.HasPrefix(*device, "gpu-") {
		dev = &devBench{n: *matN, chain: *matChain, elems: *chainMiB << 18, runs: *chainRuns}
	}
	if err := benchRun(ctx, url, *device, *rounds, *ops, *upload, dev, &rep, progress, copts); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	fmt.Fprintf(stdout, "layout: %s; %s\n", rep.Layout, rep.Machine)
	fmt.Fprintf(stdout, "tiny op + read round trip   p50 %8.1f us  p99 %8.1f us\n", rep.RoundTripP50us, rep.RoundTripP99us)
	fmt.Fprintf(stdout, "raw NATS request/reply 64 B p50 %8.1f us  p99 %8.1f us   (ratio %.2fx)\n", rep.RawRequestP50us, rep.RawRequestP99us, rep.RoundTripRatio)
	fmt.Fprintf(stdout, "JetStream floor 64 B         p50 %8.1f us  p99 %8.1f us   (%.2fx raw: stored, pushed by a consumer, answered; no jetfabric code)\n", rep.FloorP50us, rep.FloorP99us, rep.FloorRatio)
	fmt.Fprintf(stdout, "pipelined ops, one session  %10.0f ops/s  (%d ops a frame, %d B frames)\n", rep.PipelinedOpsPerS, rep.OpsPerFrame, rep.FrameBytes)
	programs := ""
	if rep.NoPrograms {
		programs = ", programs off"
	}
	fmt.Fprintf(stdout, "pipelined ops in replays     %10.0f ops/s  (graphs of %d adds, %.2fx op by op%s)\n", rep.ReplayOpsPerS, rep.ReplayChain, rep.ReplayOpsPerS/rep.PipelinedOpsPerS, programs)
	fmt.Fprintf(stdout, "raw JetStream async publish %10.0f frames/s of %d B = %.0f ops/s\n", rep.RawPublishFramesS, rep.FrameBytes, rep.RawPublishOpsS)
	if *upload > 0 {
		fmt.Fprintf(stdout, "%d MiB upload %.0f MB/s, read-back %.0f MB/s (medians of %d; FABRIC_XFER on %s; %d lanes; SHA-256 on one core %.0f MB/s)\n", *upload, rep.UploadMBs, rep.ReadMBs, uploadRuns, rep.XferStorage, rep.Lanes, rep.SHA256MBs)
	}
	if g := rep.GPU; g != nil {
		fused := "fused"
		if rep.NoFusion {
			fused = "op by op"
		}
		prec := "f32"
		if rep.TF32 {
			prec = "tf32"
		}
		fmt.Fprintf(stdout, "matmul chain %dx%d %-4s      %10.1f ops/s = %.1f TFLOP/s (%d products)\n", g.MatmulN, g.MatmulN, prec, g.MatmulOpsS, g.MatmulTFLOPs, g.MatmulChain)
		fmt.Fprintf(stdout, "8-op elementwise chain      %10.3f ms a run over %d MiB f32 = %.0f GB/s (%s, %d runs)\n", g.ChainMs, g.ChainElems>>18, g.ChainGBs, fused, g.ChainRuns)
	}
	return nil
}

// benchWorker is what the bench's worker serves.
type benchWorker struct {
	gpus        string
	noFusion    bool
	noChains    bool
	noPrograms  bool
	tf32        bool
	lanes       int    // the worker's -lanes (0: its default)
	xferStorage string // the broker's -xfer-storage
	// tls, when set, puts every connection under TLS with these
	// certificates: the broker requires it, the worker, the raw responder
	// and the client trust its CA.
	tls *certs.Files
}

// benchEcho starts the raw responder as a separate process beside the
// fabric at url, for -url.
func benchEcho(url string, progress func(string, ...any)) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(exe, "bench", "--serve-echo", url)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	progress("measuring the fabric at %s; started the raw responder as a separate process", url)
	return url, func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() }, nil
}

// devBench sizes the device benchmarks.
type devBench struct{ n, chain, elems, runs int }

// benchFabric starts the fabric in the chosen layout and returns its URL.
func benchFabric(ctx context.Context, layout string, ckpt time.Duration, bw benchWorker, progress func(string, ...any)) (string, func(), error) {
	wf := workerFlags{cpus: 1, idle: time.Hour, checkpoint: ckpt, gpus: bw.gpus, noFusion: bw.noFusion, noChains: bw.noChains, noPrograms: bw.noPrograms, tf32: bw.tf32, lanes: bw.lanes}
	if ckpt == 0 {
		wf.checkpoint = -1 // off
	}
	dir, err := os.MkdirTemp("", "jetfabric-bench-")
	if err != nil {
		return "", nil, err
	}
	cleanup := []func(){func() { os.RemoveAll(dir) }}
	stop := func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	var tlsOpts []nats.Option
	if bw.tls != nil {
		tlsOpts = append(tlsOpts, nats.RootCAs(bw.tls.CA))
	}
	switch layout {
	case "inproc":
		bf := brokerFlags{listen: "127.0.0.1:-1", store: dir, name: "jetfabric", maxPayload: 8 << 20, replicas: 1, xferStorage: bw.xferStorage}
		if bw.tls != nil {
			bf.tlsCert, bf.tlsKey, bf.tlsCA = bw.tls.ServerCert, bw.tls.ServerKey, bw.tls.CA
		}
		bcfg, err := bf.brokerConfig()
		if err != nil {
			stop()
			return "", nil, err
		}
		b, err := startBroker(ctx, bcfg)
		if err != nil {
			stop()
			return "", nil, err
		}
		cleanup = append(cleanup, func() { _ = shutdown(b, nil) })
		url := b.ClientURL()
		logf := logger(os.Stderr, "")
		wcfg, err := wf.config(logf)
		if err != nil {
			stop()
			return "", nil, err
		}
		wcfg, closeGPUs, err := wf.withGPUs(wcfg, logf)
		if err != nil {
			stop()
			return "", nil, err
		}
		cleanup = append(cleanup, closeGPUs)
		nc, err := nats.Connect(url, tlsOpts...)
		if err != nil {
			stop()
			return "", nil, err
		}
		w, err := newWorker(ctx, nc, wcfg)
		if err != nil {
			nc.Close()
			stop()
			return "", nil, err
		}
		cleanup = append(cleanup, func() { _ = shutdown(nil, w); nc.Close() })
		echoCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- serveEcho(echoCtx, url, tlsOpts...) }()
		cleanup = append(cleanup, func() { cancel(); <-done })
		return url, stop, nil
	case "procs":
		exe, err := os.Executable()
		if err != nil {
			stop()
			return "", nil, err
		}
		scheme := "nats://"
		var brokerTLS, clientTLS, echoTLS []string
		if bw.tls != nil {
			scheme = "tls://"
			brokerTLS = []string{"--tls-cert", bw.tls.ServerCert, "--tls-key", bw.tls.ServerKey, "--tls-ca", bw.tls.CA}
			clientTLS = []string{"--tls-ca", bw.tls.CA}
			echoTLS = []string{"--serve-echo-tls-ca", bw.tls.CA}
		}
		start := func(args ...string) error {
			cmd := exec.Command(exe, args...)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				return err
			}
			cleanup = append(cleanup, func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
			return nil
		}
		url, stopBroker, err := spawnBroker(ctx, exe, nil, scheme, func(listen string) []string {
			return append([]string{"broker", "--listen", listen, "--http", "", "--store", dir, "--xfer-storage", bw.xferStorage}, brokerTLS...)
		}, tlsOpts...)
		if err != nil {
			stop()
			return "", nil, err
		}
		cleanup = append(cleanup, stopBroker)
		if err := start(append([]string{"worker", "--url", url, "--idle-timeout", "1h", "--checkpoint-interval", ckpt.String(), "--gpus", bw.gpus, "--no-fusion=" + strconv.FormatBool(bw.noFusion), "--no-gpu-chains=" + strconv.FormatBool(bw.noChains), "--no-programs=" + strconv.FormatBool(bw.noPrograms), "--tf32=" + strconv.FormatBool(bw.tf32), "--lanes=" + strconv.Itoa(cmp.Or(bw.lanes, worker.DefaultLanes()))}, clientTLS...)...); err != nil {
			stop()
			return "", nil, err
		}
		if err := start(append([]string{"bench", "--serve-echo", url}, echoTLS...)...); err != nil {
			stop()
			return "", nil, err
		}
		progress("started broker, worker and raw responder as separate processes on %s", url)
		return url, stop, nil
	}
	stop()
	return "", nil, fmt.Errorf("-layout %q: want inproc or procs", layout)
}

// waitConnect waits for a broker process to take connections: a loaded
// machine can take long to start one, so the wait is generous.
func waitConnect(ctx context.Context, url string, opts ...nats.Option) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			nc.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker at %s did not come up: %w", url, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serveEcho answers every request on the echo subject with its payload.
func serveEcho(ctx context.Context, url string, opts ...nats.Option) error {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	names := subjects.Default()
	if _, err := nc.Subscribe(names.BenchEcho(), func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	stop, err := serveFloor(ctx, nc, names)
	if err != nil {
		return err
	}
	defer stop()
	<-ctx.Done()
	return nil
}

// serveFloor answers the JetStream floor's messages: a stream made like
// FABRIC_OPS (file storage, discard new), read by a push consumer made as
// the worker's feed makes its consumers, each message answered, on the
// subscription's goroutine, on its Fabric-Reply inbox with its own
// payload. Nothing of the fabric is in the path, so its round trip is the
// least any JetStream-brokered op can take. stop ends the consumer.
func serveFloor(ctx context.Context, nc *nats.Conn, names subjects.Names) (stop func(), err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:      names.BenchFloorStream(),
		Subjects:  []string{names.BenchFloor()},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		Discard:   jetstream.DiscardNew,
		MaxAge:    time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("floor stream: %w", err)
	}
	cons, err := st.CreateOrUpdatePushConsumer(ctx, jetstream.ConsumerConfig{
		DeliverSubject:    nats.NewInbox(),
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		FlowControl:       true,
		IdleHeartbeat:     time.Second,
		InactiveThreshold: 30 * time.Second,
		MemoryStorage:     true,
	})
	if err != nil {
		return nil, fmt.Errorf("floor consumer: %w", err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if reply := m.Headers().Get(subjects.HeaderReply); reply != "" {
			_ = nc.Publish(reply, m.Data())
		}
	})
	if err != nil {
		return nil, fmt.Errorf("floor consumer: %w", err)
	}
	return cc.Stop, nil
}

func benchRun(ctx context.Context, url, device string, rounds, nops, uploadMiB int, dev *devBench, rep *benchReport, progress func(string, ...any), copts []client.Option) error {
	c, err := client.Connect(url, copts...)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var s *client.Session
	for deadline := time.Now().Add(30 * time.Second); ; {
		if s, err = c.Open(ctx, device); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer s.Close(ctx)

	// Round trips, ours and raw, interleaved in blocks so drift hits both.
	progress("round trips: %d each, fabric, raw request/reply and the JetStream floor", rounds)
	one := s.Full([]int{1}, 1)
	if err := s.Sync(ctx); err != nil {
		return err
	}
	nc := c.Conn()
	payload := make([]byte, 64)
	ours, raw, floor := make([]time.Duration, 0, rounds), make([]time.Duration, 0, rounds), make([]time.Duration, 0, rounds)
	echo := subjects.Default().BenchEcho()
	floorSub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		return err
	}
	defer func() { _ = floorSub.Unsubscribe() }()
	floorMsg := nats.NewMsg(subjects.Default().BenchFloor())
	floorMsg.Header.Set(subjects.HeaderReply, floorSub.Subject)
	floorMsg.Data = payload
	// One JetStream round trip: the message published as the client
	// publishes a frame it waits on (no acknowledgement asked), stored,
	// pushed by the consumer and answered.
	floorTrip := func(wait time.Duration) (time.Duration, error) {
		t0 := time.Now()
		if err := nc.PublishMsg(floorMsg); err != nil {
			return 0, err
		}
		if _, err := floorSub.NextMsg(wait); err != nil {
			return 0, fmt.Errorf("JetStream floor: %w", err)
		}
		return time.Since(t0), nil
	}
	// The raw responder starts beside the worker; wait until it answers.
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := nc.Request(echo, payload, 5*time.Second)
		if err == nil {
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
			return fmt.Errorf("raw request: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The floor's stream and consumer start beside the raw responder.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := floorTrip(200 * time.Millisecond); err == nil {
			break
		} else if time.Now().After(deadline) {
			return err
		}
	}
	for i := 0; i < rounds+200; i++ {
		fd, err := floorTrip(5 * time.Second)
		if err != nil {
			return err
		}
		t0 := time.Now()
		y := one.Add(one)
		if _, err := y.Float32s(ctx); err != nil {
			return err
		}
		d := time.Since(t0)
		y.Free()
		t0 = time.Now()
		if _, err := nc.Request(echo, payload, 5*time.Second); err != nil {
			return fmt.Errorf("raw request: %w", err)
		}
		if i >= 200 { // warm-up excluded
			ours, raw, floor = append(ours, d), append(raw, time.Since(t0)), append(floor, fd)
		}
	}
	rep.RoundTripP50us, rep.RoundTripP99us = pct(ours, 50), pct(ours, 99)
	rep.RawRequestP50us, rep.RawRequestP99us = pct(raw, 50), pct(raw, 99)
	rep.RoundTripRatio = rep.RoundTripP50us / rep.RawRequestP50us
	rep.FloorP50us, rep.FloorP99us = pct(floor, 50), pct(floor, 99)
	rep.FloorRatio = rep.FloorP50us / rep.RawRequestP50us

	if dev != nil {
		rep.GPU = &gpuBench{}
		if err := benchDevice(ctx, s, dev.n, dev.chain, dev.elems, dev.runs, rep.GPU, progress); err != nil {
			return err
		}
	}

	// The same chain replayed first: the chain op by op leaves its tensors
	// in the session, which the replays would have to live beside.
	if err := benchReplay(ctx, c, s, one, nops, rep, progress); err != nil {
		return err
	}
	// Pipelined ops: a chain of adds, read once at the end.
	progress("pipelined: %d ops in one session", nops)
	const opsPerFrame = 4096
	frame := make([]codec.Op, opsPerFrame)
	for i := range frame {
		frame[i] = codec.Op{Op: "add", Out: []uint64{uint64(1000000 + i)}, In: []uint64{uint64(999999 + i), 2}}
	}
	fb, _ := codec.Marshal(codec.CBOR, &codec.Frame{V: codec.Version, Ops: frame})
	rep.FrameBytes, rep.OpsPerFrame = len(fb), opsPerFrame
	t0 := time.Now()
	x := s.Full([]int{1}, 0)
	for range nops {
		x = x.Add(one)
	}
	v, err := x.Float32s(ctx)
	if err != nil {
		return err
	}
	el := time.Since(t0)
	if int(v[0]) != nops {
		return fmt.Errorf("pipelined chain gave %v, want %d", v[0], nops)
	}
	rep.PipelinedOpsPerS = float64(nops) / el.Seconds()

	// Raw: JetStream async publish of frames of the same size.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return err
	}
	frames := max(nops/opsPerFrame, 50)
	t0 = time.Now()
	for range frames {
		if _, err := js.PublishAsync("fabric.ops.bench-raw.s", fb); err != nil {
			return err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	el = time.Since(t0)
	rep.RawPublishFramesS = float64(frames) / el.Seconds()
	rep.RawPublishOpsS = rep.RawPublishFramesS * opsPerFrame

	if uploadMiB > 0 {
		progress("upload and read-back of %d MiB, %d times", uploadMiB, uploadRuns)
		data := make([]byte, uploadMiB<<20)
		for i := range data {
			data[i] = byte(i % 251)
		}
		var up, back []float64
		for range uploadRuns {
			// New bytes each run, and each bench (several may measure one
			// fabric), in every MiB: an upload of bytes stored before is
			// not sent again, nor is a piece of one (see client.WithLanes).
			for off := 0; off < len(data); off += 1 << 20 {
				binary.LittleEndian.PutUint64(data[off:], rand.Uint64())
			}
			t0 := time.Now()
			t, err := s.Upload(ctx, "u8", []int{len(data)}, data)
			if err != nil {
				return err
			}
			if err := s.Sync(ctx); err != nil {
				return err
			}
			up = append(up, float64(len(data))/1e6/time.Since(t0).Seconds())
			t0 = time.Now()
			d, err := t.Read(ctx)
			if err != nil {
				return err
			}
			back = append(back, float64(len(data))/1e6/time.Since(t0).Seconds())
			if !slices.Equal(d.Bytes, data) {
				return fmt.Errorf("read-back differs from the upload")
			}
			t.Free()
		}
		rep.UploadMBs, rep.ReadMBs = median(up), median(back)
		t0 := time.Now()
		sha256.Sum256(data)
		rep.SHA256MBs = float64(len(data)) / 1e6 / time.Since(t0).Seconds()
	}
	return nil
}

// uploadRuns is how many uploads and read-backs the bench times; it
// reports the medians.
const uploadRuns = 3

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(d []time.Duration, p int) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[(len(s)-1)*p/100].Nanoseconds()) / 1e3
}
