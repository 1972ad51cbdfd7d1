package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

// opaque is a buffer whose memory the worker cannot see, like device
// memory: it goes through Upload and Download.
type opaque struct{ b kernels.Buffer }

func (o *opaque) Bytes() int { return o.b.Bytes() }

// lender is a backend of opaque buffers that lends host buffers for
// transfers, as the CUDA backend lends pinned memory; it counts what it
// lent and got back, and with refuse set lends nothing. It computes on the
// CPU backend, of which it shows only the kernels.Backend methods.
type lender struct {
	cpu    *cpu.Backend
	refuse bool
	min    int // sizes under it are refused as kernels.ErrShape

	mu          sync.Mutex
	lent, given int
	out         map[*byte]int // lent buffers by first byte: their size
	fromLent    int           // uploads from a lent buffer
	intoLent    int           // downloads into one

	// Downloads of holdSize bytes wait until gate is closed; held counts
	// those that came.
	holdSize int
	gate     chan struct{}
	held     atomic.Int32
}

func newLender(refuse bool) *lender {
	return &lender{cpu: cpu.New(), refuse: refuse, out: map[*byte]int{}}
}

func (l *lender) Name() string { return "lender" }
func (l *lender) Sync() error  { return l.cpu.Sync() }

func (l *lender) HostBuffer(n int) ([]byte, func(), error) {
	if l.refuse {
		return nil, nil, errors.New("no pinned memory today")
	}
	if n < l.min {
		return nil, nil, fmt.Errorf("%w: %d bytes, under %d", kernels.ErrShape, n, l.min)
	}
	b := make([]byte, n)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lent++
	l.out[&b[0]] = n
	var once sync.Once
	return b, func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.given++
			delete(l.out, &b[0])
		})
	}, nil
}

// isLent reports whether p lies in a buffer lent and not given back.
func (l *lender) isLent(p []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.out[&p[0]]
	return ok && len(p) <= n
}

func (l *lender) Alloc(n int) (kernels.Buffer, error) {
	b, err := l.cpu.Alloc(n)
	if err != nil {
		return nil, err
	}
	return &opaque{b}, nil
}

func (l *lender) Free(b kernels.Buffer) {
	if o, ok := b.(*opaque); ok {
		l.cpu.Free(o.b)
	}
}

func (l *lender) Upload(dst kernels.Buffer, src []byte) error {
	if len(src) > 0 && l.isLent(src) {
		l.mu.Lock()
		l.fromLent++
		l.mu.Unlock()
	}
	return l.cpu.Upload(dst.(*opaque).b, src)
}

func (l *lender) Download(dst []byte, src kernels.Buffer) error {
	if l.gate != nil && len(dst) == l.holdSize {
		l.held.Add(1)
		<-l.gate
	}
	if len(dst) > 0 && l.isLent(dst) {
		l.mu.Lock()
		l.intoLent++
		l.mu.Unlock()
	}
	return l.cpu.Download(dst, src.(*opaque).b)
}

func (l *lender) Exec(op *kernels.Op, in, out []*kernels.Tensor) error {
	unwrap := func(ts []*kernels.Tensor) []*kernels.Tensor {
		u := make([]*kernels.Tensor, len(ts))
		for i, t := range ts {
			u[i] = &kernels.Tensor{Meta: t.Meta, Buf: t.Buf.(*opaque).b}
		}
		return u
	}
	return l.cpu.Exec(op, unwrap(in), unwrap(out))
}

// counts returns what l lent and got back, the uploads from and downloads
// into a lent buffer, and the buffers still out.
func (l *lender) counts() (lent, given, from, into, out int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lent, l.given, l.fromLent, l.intoLent, len(l.out)
}

// TestHostBuffers: on a device whose memory the worker cannot see, a large
// upload is read into a host buffer the backend lends and uploaded from
// it, a large result downloaded into one and written from it, and every
// buffer is given back; the bits are the same. A checkpoint downloads the
// tensor into a lent buffer, and another worker that restores it from the
// checkpoint reads it into one too.
// A backend that refuses to lend (no pinned memory) gets the same bits
// through plain buffers, and a small tensor never borrows.
func TestHostBuffers(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		b := brokertest.Run(t)
		be := newLender(refuse)
		w := startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = be; c.CheckpointInterval = 0 })
		srv := httptest.NewServer(w.MetricsHandler())
		defer srv.Close()
		c, err := client.Connect(b.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := c.Open(ctx, "cpu-0")
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 12<<20) // over the 8 MiB from which transfers borrow
		r := rand.New(rand.NewPCG(1, 2))
		for i := range data {
			data[i] = byte(r.UintN(200)) // u8, no overflow in the sum below
		}
		x, err := s.Upload(ctx, "u8", []int{len(data)}, data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := x.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes, data) {
			t.Fatalf("refuse %v: the tensor read back differs from the upload", refuse)
		}
		small, err := s.Upload(ctx, "u8", []int{1 << 20}, data[:1<<20])
		if err != nil {
			t.Fatal(err)
		}
		if got, err := small.Read(ctx); err != nil || !bytes.Equal(got.Bytes, data[:1<<20]) {
			t.Fatalf("refuse %v: a 1 MiB tensor read back: %v", refuse, err)
		}
		want := 1
		if refuse {
			want = 0
		}
		if lent, given, from, into, out := be.counts(); lent != 2*want || given != 2*want || from != want || into != want || out != 0 {
			t.Errorf("refuse %v: %d host buffers lent, %d given back, %d still out; %d uploads from one, %d downloads into one; want %d, %d, 0, %d, %d",
				refuse, lent, given, out, from, into, 2*want, 2*want, want, want)
		}

		// A checkpoint, then another worker takes the device over and
		// restores the tensor from it.
		s.Checkpoint()
		if err := s.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		waitCheckpoint(t, srv.URL, "cpu-0")
		if err := w.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		// The checkpoint downloaded the large tensor into a lent buffer
		// (the stop's found nothing new to write).
		if lent, given, from, into, out := be.counts(); lent != 3*want || given != 3*want || from != want || into != 2*want || out != 0 {
			t.Errorf("refuse %v, after the checkpoint: %d host buffers lent, %d given back, %d still out; %d uploads from one, %d downloads into one; want %d, %d, 0, %d, %d",
				refuse, lent, given, out, from, into, 3*want, 3*want, want, 2*want)
		}
		be2 := newLender(refuse)
		startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = be2; c.ID = "second"; c.CheckpointInterval = 0 })
		got, err = x.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes, data) {
			t.Fatalf("refuse %v: the tensor restored by another worker differs from the upload", refuse)
		}
		// Restored (read into a lent buffer and uploaded from it), then
		// read back (downloaded into one).
		if lent, given, from, into, out := be2.counts(); lent != 2*want || given != 2*want || from != want || into != want || out != 0 {
			t.Errorf("refuse %v, after the takeover: %d host buffers lent, %d given back, %d still out; %d uploads from one, %d downloads into one; want %d, %d, 0, %d, %d",
				refuse, lent, given, out, from, into, 2*want, 2*want, want, want)
		}
		cancel()
		c.Close()
	}
}

// TestHostBufferSizeRefused: a size the backend does not lend (an error
// wrapping kernels.ErrShape) goes through plain memory, and the next
// transfer of a size it lends still borrows.
func TestHostBufferSizeRefused(t *testing.T) {
	b := brokertest.Run(t)
	be := newLender(false)
	be.min = 16 << 20
	startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = be })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{12 << 20, 20 << 20} {
		data := bytes.Repeat([]byte{byte(n >> 20)}, n)
		x, err := s.Upload(ctx, "u8", []int{n}, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(ctx); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		x.Free()
	}
	if lent, given, from, _, out := be.counts(); lent != 1 || given != 1 || from != 1 || out != 0 {
		t.Errorf("%d host buffers lent, %d given back, %d still out, %d uploads from one; want 1, 1, 0, 1 (the 20 MiB upload)", lent, given, out, from)
	}
}

// batchLender is a lender that also downloads many buffers in one call,
// as the CUDA backend does; it counts those calls.
type batchLender struct {
	*lender
	batches atomic.Int32
}

func (l *batchLender) DownloadMany(dsts [][]byte, srcs []kernels.Buffer) error {
	l.batches.Add(1)
	for i := range dsts {
		if err := l.Download(dsts[i], srcs[i]); err != nil {
			return err
		}
	}
	return nil
}

// TestCheckpointSmallOpaque: on a backend whose memory the host cannot
// read (a GPU), a checkpoint's small tensors are downloaded by its writer,
// not by the device loop (in one call where the backend takes many): while
// those downloads are held, the device goes on running another session's
// frames. Released, the checkpoint commits, and another worker restores
// the same bits.
func TestCheckpointSmallOpaque(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch %v", batch), func(t *testing.T) { testCheckpointSmallOpaque(t, batch) })
	}
}

func testCheckpointSmallOpaque(t *testing.T, batch bool) {
	const small, size = 40, 1000
	b := brokertest.Run(t)
	be := newLender(false)
	be.holdSize, be.gate = size, make(chan struct{})
	release := sync.OnceFunc(func() { close(be.gate) })
	defer release()
	var backend kernels.Backend = be
	bl := &batchLender{lender: be}
	if batch {
		backend = bl
	}
	w := startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = backend; c.CheckpointInterval = 0 })
	srv := httptest.NewServer(w.MetricsHandler())
	defer srv.Close()
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	want := make([][]byte, small)
	held := make([]*client.Tensor, small)
	for i := range held {
		want[i] = bytes.Repeat([]byte{byte(i + 1)}, size)
		if held[i], err = s.Upload(ctx, "u8", []int{size}, want[i]); err != nil {
			t.Fatal(err)
		}
	}
	empty, err := s.Upload(ctx, "u8", []int{0}, nil) // no bytes: nothing to download
	if err != nil {
		t.Fatal(err)
	}
	held, want = append(held, empty), append(want, []byte{})
	s.Checkpoint()
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	checkFor(t, time.Minute, 5*time.Millisecond, func() error {
		if be.held.Load() == 0 {
			return errors.New("the checkpoint's writer has not come to a small tensor yet")
		}
		return nil
	})
	// The writer waits in a download: the loop serves another session.
	other, err := c.Open(ctx, "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	v, err := other.Full([]int{2}, 3).Sum().Float32s(octx)
	ocancel()
	if err != nil || len(v) != 1 || v[0] != 6 {
		t.Fatalf("another session while the checkpoint's downloads are held: %v, %v (the loop waits for them?)", v, err)
	}
	if n := scrape(t, srv.URL)[`jetfabric_device_checkpoints_total{device="cpu-0"}`]; n != 0 {
		t.Fatalf("%v checkpoints committed with the downloads held", n)
	}
	release()
	waitCheckpoint(t, srv.URL, "cpu-0")
	if got := int(be.held.Load()); got != small {
		t.Errorf("%d small tensors downloaded for the checkpoint, want %d", got, small)
	}
	if want := map[bool]int32{false: 0, true: 1}[batch]; bl.batches.Load() != want {
		t.Errorf("%d calls to download many, want %d", bl.batches.Load(), want)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	startWorker(t, b, func(c *worker.Config) { c.Devices[0].Backend = newLender(false); c.ID = "second" })
	for i, x := range held {
		got, err := x.Read(ctx)
		if err != nil {
			t.Fatalf("tensor %d after the takeover: %v", i, err)
		}
		if !bytes.Equal(got.Bytes, want[i]) {
			t.Fatalf("tensor %d restored differs", i)
		}
	}
}
