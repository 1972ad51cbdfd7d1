// Package nn is jetfabric's training stack: tensors that remember the op
// that made them, reverse-mode automatic differentiation whose gradient
// program runs on the worker like any other ops, layers and optimizers.
//
// A Tensor wraps a tensor of a client.Session with its dtype and shape.
// Every op checks its inputs with the fabric's own shape inference
// (kernels.Infer) before it is enqueued, so a shape mismatch is a Go error
// at once, carried by the result (Tensor.Err) and by everything computed
// from it, and the op is recorded with its inputs. Nothing waits for the
// worker until a read.
//
// Backward(loss) walks the recorded graph from a one-element loss back to
// the leaves marked by RequireGrad, applying one rule per op from a single
// table (the shape of PyTorch's derivatives.yaml and tinygrad's
// gradient.py); each rule is a few ops of this package, so the gradients
// are computed on the worker and nothing is read back. Gradients of
// broadcast inputs are summed back to the input's shape. An op without a
// rule fails Backward with ErrNoRule naming it; ops whose gradient is zero
// almost everywhere (sign, floor, ceil, round) and ops with bool or
// integer results never require a gradient. max and min split the
// gradient evenly between tied elements (like PyTorch's amax), maximum and
// minimum give half to each operand on a tie.
//
// Memory: tensors on the worker are freed only when asked. After emitting
// the gradient program, Backward frees every intermediate tensor of the
// graph and of the gradient program (a free is an op like any other, run
// after the ops queued before it), keeping the loss, the leaves (uploaded,
// wrapped or RequireGrad'ed tensors, and the gradients) and the tensors
// marked by Retain. Tensors made by creation ops (Full, Zeros, Uniform,
// Bernoulli, ...) are intermediates too: Retain a constant reused across
// steps, or make it a leaf with Detach. RequireGrad and Detach turn a
// computed tensor into a leaf and free the intermediates it came from, so
// an optimizer's update leaves nothing behind; Release frees a graph that
// no Backward will walk, such as an evaluation.
//
// A training step, by hand:
//
//	s, _ := c.Open(ctx, "cpu-0")
//	w := nn.Normal(s, []int{784, 10}, 0, 0.03).RequireGrad()
//	b := nn.Zeros(s, kernels.Float32, []int{10}).RequireGrad()
//	for step := range steps {
//		x, _ := nn.Upload(ctx, s, kernels.Float32, []int{64, 784}, images[step])
//		y, _ := nn.Upload(ctx, s, kernels.Int64, []int{64}, labels[step])
//		loss := nn.CrossEntropy(nn.Matmul(x, w).Add(b), y, nn.ReduceMean)
//		if err := nn.Backward(loss); err != nil {
//			return err // a shape error, or an op without a gradient rule
//		}
//		for _, p := range []**nn.Tensor{&w, &b} {
//			next := nn.Sub(*p, nn.ScalarMul((*p).Grad(), 0.1)).RequireGrad()
//			(*p).Grad().Free()
//			(*p).Free()
//			*p = next
//		}
//		v, err := loss.Item(ctx) // the step's only wait for the worker
//		...
//		loss.Free(); x.Free(); y.Free()
//	}
//
// and with layers and an optimizer:
//
//	l1, _ := nn.NewLinear(s, 784, 128)
//	l2, _ := nn.NewLinear(s, 128, 10)
//	model := nn.NewSequential(l1, nn.ReLU{}, l2)
//	opt := &nn.SGD{LR: 0.1, Momentum: 0.9}
//	for step := range steps {
//		logits, err := model.Forward(x)
//		...
//		loss := nn.CrossEntropy(logits, y, nn.ReduceMean)
//		if err := nn.Backward(loss); err != nil { ... }
//		if err := opt.Step(model.Params()); err != nil { ... }
//	}
//
// A Step captures such a training step once as a graph (see
// client.Graph) and replays it for every batch, one op on the wire a
// step, with the bits of the step sent op by op:
//
//	st, _ := nn.NewStep(c, model.Params(), opt, func(b []*nn.Tensor) (*nn.Tensor, error) {
//		logits, err := model.Forward(b[0])
//		if err != nil {
//			return nil, err
//		}
//		return nn.CrossEntropy(logits, b[1], nn.ReduceMean), nil
//	}, x.Meta(), y.Meta())
//	for step := range steps {
//		loss, err := st.Run(ctx, x, y) // x, y: this step's batch
//		...
//	}
//
// NewStepAux adds outputs outside the gradient (a count of correct
// predictions). Data-parallel ranks capture the two halves instead:
// a GradStep (forward and backward, leaving the gradients on the
// parameters), then, once the gradients are summed over the ranks, an
// Update (the optimizer). NewSplitGradStep's GradStep replays its forward
// and backward in two parts (client.SplitGraph), cut where the backward
// has made the first half of the gradients' bytes (the last layers'), so
// that their sum can start while the device runs the rest:
//
//	gs, _ := nn.NewSplitGradStep(c, model.Params(), fn, x.Meta(), y.Meta())
//	loss, aux, err := gs.Start(ctx, x, y) // forward, and the first bucket's gradients
//	... queue the sum of the gradients of gs.Buckets()[0]
//	err = gs.Finish()                     // the rest of the backward
//	... queue the sum of the others, then the Update
//
// When the forward begins with ops that read no parameter of the first
// bucket and draw nothing (the convolutions of a CNN whose first bucket
// is its linear layers), they form an early part (gs.Early()): Begin
// queues it, and a caller may queue the first bucket's update of the
// step before between Begin and Start, so that its sum overlaps the next
// step's early forward too; Start then binds the parameters that update
// replaced (it refuses one the early part read).
//
// The parts give the bits of the whole replay, dropout masks included.
//
// Tensors and graphs are not safe for concurrent use; the session under
// them is.
package nn
