package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetfabric/jetfabric/client"
)

// BenchmarkReplay: pipelined replays of a captured chain of 256 adds over
// one-element tensors, each replay one op on the wire, beside the same
// adds sent one by one (each intermediate freed, as the replay frees
// it); adds/s counts until the worker has run them all.
func BenchmarkReplay(b *testing.B) {
	const chain = 256
	for _, replay := range []bool{false, true} {
		name := "op-by-op"
		if replay {
			name = "replayed"
		}
		b.Run(name, func(b *testing.B) {
			_, c := fabric(b)
			s := open(b, c, "cpu-0")
			ctx := context.Background()
			g := c.NewGraph()
			x, inc := g.Input("f32", []int{1}), g.Input("f32", []int{1})
			y := x
			for range chain {
				y = y.Add(inc)
			}
			def, err := g.Define(ctx, y)
			if err != nil {
				b.Fatal(err)
			}
			one := s.Full([]int{1}, 1)
			v := s.Full([]int{1}, 0)
			n := 0
			t0 := time.Now()
			for b.Loop() {
				var next *client.Tensor
				if replay {
					next = s.Replay(def, []*client.Tensor{v, one})[0]
				} else {
					next = v
					for range chain {
						prev := next
						next = next.Add(one)
						if prev != v {
							prev.Free()
						}
					}
				}
				v.Free()
				v = next
				n++
			}
			got, err := v.Float32s(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if int(got[0]) != n*chain {
				b.Fatalf("chain gave %v, want %d", got[0], n*chain)
			}
			// The rate counts until the worker has run every op.
			b.ReportMetric(float64(n*chain)/time.Since(t0).Seconds(), "adds/s")
		})
	}
}
