package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/codec"
	"github.com/jetfabric/jetfabric/kernels/cpu"
	"github.com/jetfabric/jetfabric/worker"
)

func TestJobs(t *testing.T) {
	b := brokertest.Run(t)
	for i := range 2 {
		nc, err := nats.Connect(b.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		cfg := worker.DefaultConfig()
		cfg.ID = []string{"ja", "jb"}[i]
		cfg.Jobs = []worker.Jobs{{Kind: "cpu", Backend: cpu.New()}}
		w, err := worker.New(nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Stop(context.Background()); nc.Close() })
	}
	c, err := client.Connect(b.ClientURL(), client.WithInlineUpload(1<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var ids []string
	for k := range 20 {
		j := c.NewJob()
		data := make([]byte, 4*1024) // over the inline limit: an object reference
		for i := range 1024 {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(float32(i)))
		}
		x, err := j.Upload(ctx, "f32", []int{1024}, data)
		if err != nil {
			t.Fatal(err)
		}
		y := x.Mul(j.Full(nil, float64(k))).Sum()
		id, err := c.Submit(ctx, "cpu", j, y, x.Max())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	// A job that fails reports why.
	bad := c.NewJob()
	z := bad.Full([]int{2}, 1).Add(bad.Full([]int{3}, 1))
	badID, err := c.Submit(ctx, "cpu", bad, z)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Wait(ctx, append(ids, badID)...)
	if err != nil {
		t.Fatal(err)
	}
	workers := map[string]int{}
	for k, r := range res[:20] {
		d, err := r.Output(ctx, 0)
		if err != nil {
			t.Fatalf("job %d: %v", k, err)
		}
		got := math.Float32frombits(binary.LittleEndian.Uint32(d.Bytes))
		if want := float32(k) * 1023 * 1024 / 2; got != want {
			t.Errorf("job %d: %v, want %v", k, got, want)
		}
		if m, _ := r.Output(ctx, 1); math.Float32frombits(binary.LittleEndian.Uint32(m.Bytes)) != 1023 {
			t.Errorf("job %d max: %v", k, m.Bytes)
		}
		workers[r.Worker]++
	}
	t.Logf("jobs per worker: %v", workers)
	var ce *codec.Error
	if err := res[20].Err(); !errors.As(err, &ce) || ce.Op != "add" {
		t.Errorf("bad job: %v", err)
	}
	// Bad submissions are refused here.
	if _, err := c.Submit(ctx, "cpu", bad, z.Session().Full(nil, 1)); err != nil {
		t.Errorf("output from the same job refused: %v", err)
	}
	s := c.NewJob()
	if _, err := s.Full(nil, 1).Float32s(ctx); !errors.Is(err, client.ErrInvalidArgument) || !strings.Contains(err.Error(), "job cannot read") {
		t.Errorf("read in a job: %v", err)
	}
	if _, err := c.Submit(ctx, "c.p.u", s); err == nil {
		t.Error("submitted to a kind with dots")
	}
	other := c.NewJob()
	if _, err := c.Submit(ctx, "cpu", s, other.Full(nil, 1)); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("output of another job: %v", err)
	}
}
