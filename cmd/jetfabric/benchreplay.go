package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// replayChain is the number of adds in the graph the replay benchmark
// replays.
const replayChain = 256

// benchReplay runs the pipelined chain of nops adds again as replays of a
// captured chain of replayChain adds, each replay one op on the wire, and
// reports the adds run a second.
func benchReplay(ctx context.Context, c *client.Client, s *client.Session, one *client.Tensor, nops int, rep *benchReport, progress func(string, ...any)) error {
	progress("pipelined replays: %d ops in graphs of %d", nops, replayChain)
	g := c.NewGraph()
	x, inc := g.Input("f32", []int{1}), g.Input("f32", []int{1})
	y := x
	for range replayChain {
		y = y.Add(inc)
	}
	def, err := g.Define(ctx, y)
	if err != nil {
		return err
	}
	runs := max(nops/replayChain, 1)
	t0 := time.Now()
	v := s.Full([]int{1}, 0)
	for range runs {
		next := s.Replay(def, []*client.Tensor{v, one})[0]
		v.Free()
		v = next
	}
	got, err := v.Float32s(ctx)
	if err != nil {
		return err
	}
	el := time.Since(t0)
	if want := runs * replayChain; int(got[0]) != want {
		return fmt.Errorf("replayed chain gave %v, want %d", got[0], want)
	}
	rep.ReplayOpsPerS, rep.ReplayChain = float64(runs*replayChain)/el.Seconds(), replayChain
	return nil
}
