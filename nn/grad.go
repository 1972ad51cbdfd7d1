package nn

import (
	"fmt"
	"slices"

	"github.com/jetfabric/jetfabric/kernels"
)

// Backward computes the gradient of loss, a tensor of one element, with
// respect to every leaf that RequireGrad marked and that loss depends on,
// and sets it as that leaf's Grad (freeing the leaf's earlier gradient).
// The gradient program is made of ordinary ops, enqueued in loss's
// session: nothing is read back, so Backward does not wait for the
// worker.
//
// Backward walks the recorded graph from loss in reverse, applying one
// rule per op (see the rules table); an op of the graph without a rule is
// an error wrapping ErrNoRule that names it. Gradients of broadcast inputs
// are summed over the broadcast axes.
//
// Then Backward frees, after the ops that use them (frees are ordered in
// the session's stream like any op), every tensor of the graph and of the
// gradient program except loss, the leaves (tensors uploaded, wrapped or
// marked by RequireGrad, and the gradients set), and the tensors marked by
// Retain; so a training loop's session holds the same tensors step after
// step. Everything the graph recorded is forgotten: loss and the retained
// tensors become constants, and a second Backward of loss fails with
// ErrNoGrad. Free loss when done with it.
//
// Errors: loss failed (its error), ErrNotScalar, ErrNoGrad, ErrFreed,
// ErrNoRule; a gradient op that shape inference refused (a bug in a rule)
// is returned too. On error the gradient ops already enqueued are freed
// and no Grad is changed; the graph is left as it was.
func Backward(loss *Tensor) error {
	switch {
	case loss == nil:
		return fmt.Errorf("%w: Backward of a nil tensor", ErrInvalidArgument)
	case loss.err != nil:
		return fmt.Errorf("nn: Backward: the loss failed: %w", loss.err)
	case loss.freed:
		return fmt.Errorf("%w: Backward of a freed loss %v", ErrFreed, loss)
	case loss.meta.Numel() != 1:
		return fmt.Errorf("%w: Backward of a loss of shape %v: want a single element (sum or average it first)", ErrNotScalar, loss.meta.Shape)
	case loss.cut:
		return fmt.Errorf("%w: Backward of %v, whose graph an earlier Backward or Release freed", ErrNoGrad, loss)
	case !loss.reqGrad:
		return fmt.Errorf("%w: Backward: the loss %v depends on no tensor that requires a gradient (see RequireGrad), or an earlier Backward or Release freed its graph", ErrNoGrad, loss)
	}
	order, err := topo(loss)
	if err != nil {
		return err
	}
	grads := map[*Tensor]*Tensor{loss: Ones(loss.s, loss.meta.DType, loss.meta.Shape)}
	// orphans are the gradient tensors made, which may end up in no
	// leaf's gradient (a rule need not use what it is given, nor what it
	// makes for an input that requires none): the walk that frees starts
	// from them too.
	var orphans []*Tensor
	var leaves []*Tensor
	err = func() error {
		for i := len(order) - 1; i >= 0; i-- {
			n := order[i]
			gout := make([]*Tensor, len(n.out))
			some := false
			for j, o := range n.out {
				gout[j] = grads[o]
				if gout[j] != nil {
					some = true
					orphans = append(orphans, gout[j])
				}
			}
			if !some {
				continue
			}
			r, ok := rules[n.op.k.Name]
			if !ok {
				return fmt.Errorf("%w: op %s (inputs %s) has none; its result cannot be differentiated", ErrNoRule, n.op.k.Name, describe(metasOf(n.in)))
			}
			// A product with a transposed weight gives the weight's
			// gradient directly, skipping the transpose's rule.
			ins := n.in
			var gin []*Tensor
			if w, gw := matmulTransposedWeight(n, gout); w != nil {
				gin = []*Tensor{matmulGrads(n, gout, n.need(0), false)[0], nil, gw}
				ins = []*Tensor{n.in[0], n.in[1], w}
			} else {
				gin = r(n, gout)
			}
			for j, x := range ins {
				if j >= len(gin) || gin[j] == nil {
					continue
				}
				g := gin[j]
				orphans = append(orphans, g)
				if !x.reqGrad {
					continue
				}
				if g.err != nil {
					return fmt.Errorf("nn: gradient of %s input %d: %w", n.op.k.Name, j, g.err)
				}
				if g.meta.DType != x.meta.DType || !slices.Equal(g.meta.Shape, x.meta.Shape) {
					return fmt.Errorf("nn: the gradient rule of %s gave %v for input %d of %v", n.op.k.Name, g, j, x)
				}
				if prev := grads[x]; prev != nil {
					g = Add(prev, g)
				}
				grads[x] = g
				if x.node == nil {
					leaves = append(leaves, x)
				}
			}
		}
		if g := grads[loss]; loss.node == nil && g != nil {
			leaves = append(leaves, loss)
		}
		for _, x := range leaves {
			if g := grads[x]; g.err != nil {
				return fmt.Errorf("nn: gradient of %v: %w", x, g.err)
			}
		}
		return nil
	}()
	if err != nil {
		// Free what the gradient program made, and nothing of the graph.
		roots := orphans
		for _, g := range grads {
			roots = append(roots, g)
		}
		inGraph := map[*Tensor]bool{}
		walk([]*Tensor{loss}, func(t *Tensor) { inGraph[t] = true })
		walk(roots, func(t *Tensor) {
			if !inGraph[t] {
				if t.node != nil && !t.retained {
					t.Free()
				}
				t.detach()
			}
		})
		return err
	}

	// Set the leaves' gradients; a gradient shared by two leaves (a + b)
	// is copied, since each leaf owns and frees its own.
	final := map[*Tensor]bool{}
	roots := append([]*Tensor{loss}, orphans...)
	for _, x := range leaves {
		g := grads[x]
		if g == nil || x.grad == g {
			continue
		}
		if final[g] {
			g = Reshape(g, x.meta.Shape...)
		}
		final[g] = true
		roots = append(roots, g)
		if old := x.grad; old != nil && !old.retained {
			old.Free()
		}
		x.grad = g
	}
	// Free the graph's intermediates and forget it.
	walk(roots, func(t *Tensor) {
		if t.node != nil && t != loss && !t.retained && !final[t] {
			t.Free()
		}
	})
	walk(roots, (*Tensor).spend)
	for g := range final {
		g.detach()
		g.reqGrad, g.cut = false, false
	}
	return nil
}

// spend drops t's history after a Backward or a Release freed its graph.
// A tensor that required a gradient is marked, so that a later Backward
// that reaches it fails instead of treating it as a constant.
func (t *Tensor) spend() {
	if t.node == nil {
		return
	}
	t.cut = t.cut || t.reqGrad
	t.detach()
	t.reqGrad = false
}

// Release frees t and the tensors it was computed from, except leaves and
// retained tensors, and forgets t's history: the way to drop a graph
// built without Backward (an evaluation). Released tensors fail later ops
// with ErrFreed.
func Release(t *Tensor) {
	if t != nil {
		forget(t, true)
	}
}

// forget frees the intermediates t was computed from (and t itself when
// self), except leaves and retained tensors, and drops the history of
// every tensor it reached.
func forget(t *Tensor, self bool) {
	walk([]*Tensor{t}, func(u *Tensor) {
		if u == t && self || u != t && u.node != nil && !u.retained {
			u.Free()
		}
	})
	walk([]*Tensor{t}, func(u *Tensor) {
		if u != t || self {
			u.spend()
		}
	})
	t.detach()
}

// walk visits every tensor reachable from roots through recorded ops
// (inputs and the other outputs of multi-output ops), each once, before
// anything is detached: it collects first, then calls visit.
func walk(roots []*Tensor, visit func(*Tensor)) {
	seen := map[*Tensor]bool{}
	nodes := map[*node]bool{}
	var all []*Tensor
	stack := slices.Clone(roots)
	for len(stack) > 0 {
		t := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t == nil || seen[t] {
			continue
		}
		seen[t] = true
		all = append(all, t)
		if n := t.node; n != nil && !nodes[n] {
			nodes[n] = true
			stack = append(stack, n.in...)
			stack = append(stack, n.out...)
		}
	}
	for _, t := range all {
		visit(t)
	}
}

// topo lists the recorded ops that loss depends on through tensors that
// require a gradient, each after the ops its inputs come from.
func topo(loss *Tensor) ([]*node, error) {
	var order []*node
	state := map[*node]uint8{} // 1: on the stack, 2: done
	type frame struct {
		n    *node
		next int
	}
	if loss.node == nil {
		return nil, nil
	}
	stack := []frame{{n: loss.node}}
	state[loss.node] = 1
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.next < len(f.n.in) {
			x := f.n.in[f.next]
			f.next++
			switch {
			case x.cut:
				return nil, fmt.Errorf("%w: Backward reached %v, an input of %s, whose graph an earlier Backward or Release freed (add the losses and call Backward once, or Detach it to use it as a constant)", ErrFreed, x, f.n.op.k.Name)
			case x.freed && x.reqGrad:
				return nil, fmt.Errorf("%w: Backward reached %v, an input of %s, which was freed", ErrFreed, x, f.n.op.k.Name)
			case !x.reqGrad:
				continue
			}
			if x.node != nil && state[x.node] == 0 {
				state[x.node] = 1
				stack = append(stack, frame{n: x.node})
			}
			continue
		}
		state[f.n] = 2
		order = append(order, f.n)
		stack = stack[:len(stack)-1]
	}
	return order, nil
}

func metasOf(ts []*Tensor) []kernels.Meta {
	ms := make([]kernels.Meta, len(ts))
	for i, t := range ts {
		ms[i] = t.meta
	}
	return ms
}
