package worker

import (
	"context"
	"errors"
	"testing"
)

// TestGiveWay: a checkpoint's write goes on at once beside an idle loop,
// and beside a running frame goes on after a bounded wait, unless its
// context ends first.
func TestGiveWay(t *testing.T) {
	d := &device{}
	if err := d.giveWay(context.Background()); err != nil {
		t.Fatalf("idle loop: %v", err)
	}
	d.running.Store(true)
	if err := d.giveWay(context.Background()); err != nil {
		t.Fatalf("a frame without end: %v, want the write to go on", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.giveWay(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled while a frame runs: %v, want context.Canceled", err)
	}
}
