package client

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jetfabric/jetfabric/codec"
)

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// To moves t to session dst (on the same or another device) and returns
// the copy there. The source worker writes the tensor to the object store
// under a fresh transfer id and the target worker reads it; the data never
// passes through this client. The expose is sent before the import, so the
// two ordered streams cannot wait on each other.
func (t *Tensor) To(dst *Session) *Tensor {
	return t.ToOpts(dst, 0)
}

// ToOpts is To with a bound on how long the target waits for the data
// (0: the worker's default, a minute).
func (t *Tensor) ToOpts(dst *Session, timeout time.Duration) *Tensor {
	if dst == nil || dst.record || t.s.record {
		t.s.fail(fmt.Errorf("%w: To needs two live sessions", ErrInvalidArgument))
		return &Tensor{s: dst}
	}
	id := NewTransferID()
	t.Expose(id, 1)
	t.s.Flush()
	return dst.Import(id, timeout)
}

// NewTransferID mints a transfer id: 128 random bits in hex.
func NewTransferID() string { return newID() }

// Expose writes t to the object store under transfer id (see
// NewTransferID) for at most reads imports, from any session of any client.
func (t *Tensor) Expose(id string, reads int) {
	t.s.enqueue(codec.Op{Op: "expose", Transfer: id, Reads: reads}, 0, t)
}

// Import waits up to timeout (0: a minute) for transfer id and returns the
// tensor in this session.
func (s *Session) Import(id string, timeout time.Duration) *Tensor {
	return s.enqueue(codec.Op{Op: "import", Transfer: id, TimeoutMS: int(timeout.Milliseconds())}, 1)
}

// Collective options.
type CollectiveOption func(*codec.Op)

// Naive selects the gather-to-rank-0 algorithm, for comparison: rank 0
// moves about 2(n-1) tensors through the broker, where reduce-scatter then
// all-gather (Scatter) has every rank move about 3.
func Naive() CollectiveOption { return func(op *codec.Op) { op.Algo = "naive" } }

// Scatter selects reduce-scatter then all-gather for an all_reduce: two
// rounds through the object store, every rank moving about 3 tensors
// whatever the rank count. The worker's default for more than two ranks
// and tensors over 1 MiB.
func Scatter() CollectiveOption { return func(op *codec.Op) { op.Algo = "scatter" } }

// Direct selects the one-round all_reduce: every rank writes its tensor
// and reads every other's. The worker's default for two ranks, and for
// tensors up to 1 MiB. Every algorithm gives the same bits.
func Direct() CollectiveOption { return func(op *codec.Op) { op.Algo = "direct" } }

// CollectiveTimeout bounds how long a rank waits for the others.
func CollectiveTimeout(d time.Duration) CollectiveOption {
	return func(op *codec.Op) { op.TimeoutMS = int(d.Milliseconds()) }
}

// collective queues op on every rank's session (rank i is ts[i]'s session)
// and flushes them all.
func collective(base codec.Op, ts []*Tensor, inputs func(rank int) []*Tensor, opts []CollectiveOption) []*Tensor {
	base.Group, base.Size = newID(), len(ts)
	for _, o := range opts {
		o(&base)
	}
	out := make([]*Tensor, len(ts))
	seen := map[*Session]bool{}
	for r, t := range ts {
		if seen[t.s] {
			t.s.fail(fmt.Errorf("%w: two ranks of a collective in one session", ErrInvalidArgument))
		}
		seen[t.s] = true
		op := base
		op.Rank = r
		out[r] = t.s.enqueue(op, 1, inputs(r)...)
	}
	for _, t := range ts {
		t.s.Flush()
	}
	return out
}

func checkDevices(ts []*Tensor) error {
	devs := map[string]bool{}
	for _, t := range ts {
		if t == nil {
			return fmt.Errorf("%w: nil tensor in a collective", ErrInvalidArgument)
		}
		if t.s.record {
			return fmt.Errorf("%w: a job cannot take part in a collective", ErrInvalidArgument)
		}
		if devs[t.s.device] {
			return fmt.Errorf("%w: two ranks on device %s: a collective needs one rank a device (a device runs its ops in order, so two ranks on one would wait on each other)", ErrInvalidArgument, t.s.device)
		}
		devs[t.s.device] = true
	}
	return nil
}

// AllReduce reduces ts (one tensor a rank, each in a session on its own
// device, same dtype and shape) with reduce (sum, mean, max or min) and
// returns the result on every rank. Every rank gets the same bits.
func AllReduce(reduce string, ts []*Tensor, opts ...CollectiveOption) ([]*Tensor, error) {
	if err := checkDevices(ts); err != nil {
		return nil, err
	}
	return collective(codec.Op{Op: "all_reduce", Reduce: reduce}, ts, func(r int) []*Tensor { return ts[r : r+1] }, opts), nil
}

// AllGather concatenates ts along axis 0, in rank order, on every rank.
func AllGather(ts []*Tensor, opts ...CollectiveOption) ([]*Tensor, error) {
	if err := checkDevices(ts); err != nil {
		return nil, err
	}
	return collective(codec.Op{Op: "all_gather"}, ts, func(r int) []*Tensor { return ts[r : r+1] }, opts), nil
}

// ReduceScatter reduces ts and gives rank r the r-th of len(ts) equal
// slices of the result along axis 0.
func ReduceScatter(reduce string, ts []*Tensor, opts ...CollectiveOption) ([]*Tensor, error) {
	if err := checkDevices(ts); err != nil {
		return nil, err
	}
	return collective(codec.Op{Op: "reduce_scatter", Reduce: reduce}, ts, func(r int) []*Tensor { return ts[r : r+1] }, opts), nil
}

// Broadcast copies ts[root] to every rank. Only the root's tensor is read;
// the others name the ranks' sessions (any tensor of each session will do).
func Broadcast(root int, ts []*Tensor, opts ...CollectiveOption) ([]*Tensor, error) {
	if err := checkDevices(ts); err != nil {
		return nil, err
	}
	if root < 0 || root >= len(ts) {
		return nil, fmt.Errorf("%w: root %d of %d ranks", ErrInvalidArgument, root, len(ts))
	}
	return collective(codec.Op{Op: "broadcast", Root: root}, ts, func(r int) []*Tensor {
		if r == root {
			return ts[r : r+1]
		}
		return nil
	}, opts), nil
}

// GradSync averages gradients across data-parallel ranks as they become
// ready: register the parameters, Submit each rank's gradient of each
// parameter when the backward pass makes it, and the all_reduce of a
// parameter starts as soon as every rank has submitted it, overlapping the
// rest of the backward pass. Synced waits for all of them.
type GradSync struct {
	ranks  int
	params int
	opts   []CollectiveOption
	reduce string

	mu      sync.Mutex
	grads   [][]*Tensor // [param][rank]
	reduced [][]*Tensor // [param][rank]
	err     error
}

// NewGradSync syncs params parameters over ranks ranks with reduce (mean
// for data-parallel training).
func NewGradSync(ranks, params int, reduce string, opts ...CollectiveOption) (*GradSync, error) {
	if ranks < 1 || params < 1 {
		return nil, fmt.Errorf("%w: %d ranks, %d params", ErrInvalidArgument, ranks, params)
	}
	g := &GradSync{ranks: ranks, params: params, reduce: reduce, opts: opts,
		grads: make([][]*Tensor, params), reduced: make([][]*Tensor, params)}
	for p := range g.grads {
		g.grads[p] = make([]*Tensor, ranks)
	}
	return g, nil
}

// Submit hands in rank's gradient of param. When the last rank submits a
// parameter, its all_reduce is queued on every rank.
func (g *GradSync) Submit(rank, param int, grad *Tensor) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rank < 0 || rank >= g.ranks || param < 0 || param >= g.params || grad == nil {
		return fmt.Errorf("%w: rank %d param %d", ErrInvalidArgument, rank, param)
	}
	if g.grads[param][rank] != nil {
		return fmt.Errorf("%w: rank %d submitted param %d twice", ErrInvalidArgument, rank, param)
	}
	g.grads[param][rank] = grad
	if slices.Contains(g.grads[param], nil) {
		return nil
	}
	out, err := AllReduce(g.reduce, g.grads[param], g.opts...)
	if err != nil {
		g.err = err
		return err
	}
	g.reduced[param] = out
	return nil
}

// Reduced returns the reduced gradients of param, one a rank, once every
// rank submitted it, so that a caller can use one parameter's sum while
// others are still to come; read them (or Sync the sessions) to wait.
func (g *GradSync) Reduced(param int) ([]*Tensor, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.err != nil:
		return nil, g.err
	case param < 0 || param >= g.params:
		return nil, fmt.Errorf("%w: param %d of %d", ErrInvalidArgument, param, g.params)
	case g.reduced[param] == nil:
		return nil, fmt.Errorf("%w: param %d not submitted by every rank", ErrInvalidArgument, param)
	}
	return g.reduced[param], nil
}

// Synced returns the reduced gradients, [param][rank], once every rank
// submitted every parameter; read them (or Sync the sessions) to wait.
func (g *GradSync) Synced() ([][]*Tensor, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return nil, g.err
	}
	for p, r := range g.reduced {
		if r == nil {
			return nil, fmt.Errorf("%w: param %d not submitted by every rank", ErrInvalidArgument, p)
		}
	}
	return g.reduced, nil
}
