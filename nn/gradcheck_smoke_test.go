package nn_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/broker/brokertest"
	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/internal/poll"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
	"github.com/jetfabric/jetfabric/worker"
	"github.com/jetfabric/jetfabric/worker/workertest"
)

// fabric starts a broker and a worker serving cpu-0 and returns a client,
// a session on cpu-0, and the worker.
func fabric(t testing.TB) (*client.Client, *client.Session, *worker.Worker) {
	t.Helper()
	b := brokertest.Run(t)
	w := workertest.Run(t, b, workertest.CPUs(1), func(c *worker.Config) { c.Heartbeat = 200 * time.Millisecond })
	c, err := client.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Open(context.Background(), "cpu-0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return c, s, w
}

// TestBackwardSquare: the gradient of sum(x²) is 2x, read back from the
// worker.
func TestBackwardSquare(t *testing.T) {
	_, s, _ := fabric(t)
	ctx := context.Background()
	x, err := nn.FromValues(ctx, s, kernels.Float64, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})
	if err != nil {
		t.Fatal(err)
	}
	x.RequireGrad()
	loss := nn.Sum(nn.Mul(x, x), nil, false)
	if err := nn.Backward(loss); err != nil {
		t.Fatal(err)
	}
	if v, err := loss.Item(ctx); err != nil || v != 91 {
		t.Fatalf("loss = %v, %v; want 91", v, err)
	}
	g, err := x.Grad().Float64s(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{2, 4, 6, 8, 10, 12}; !slices.Equal(g, want) {
		t.Fatalf("dx = %v, want %v", g, want)
	}
}

// checkFor polls fn every step until it returns nil or total passes.
var checkFor = poll.Until

// expectBytes waits until the worker's tensor memory on cpu-0 is want
// bytes (it counts a frame's frees when the frame ends, which may be
// after the answer to a sync in it).
func expectBytes(t testing.TB, w *worker.Worker, want int64, what string) {
	t.Helper()
	checkFor(t, time.Minute, time.Millisecond, func() error {
		if got := heldBytes(t, w); got != want {
			return fmt.Errorf("%s: the worker holds %d tensor bytes, want %d", what, got, want)
		}
		return nil
	})
}
