package client

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfabric/jetfabric/codec"
)

// Graph records a program for replay: ops built on its Session are kept,
// never sent. Its tensors start at placeholders (Input), its float
// attributes may take scalar placeholders (Scalar and Bind); Define stores
// it and returns the definition that Session.Replay runs.
//
// A replay runs the graph's ops exactly as a session would run them sent
// one by one at that point of its stream, minting the same ids, so random
// ops draw the same bits; the tensors the graph makes and does not output
// are freed on the worker as soon as the graph is done with them.
type Graph struct {
	s       *Session
	inputs  []uint64 // recorded ids of the placeholders, in order
	metas   []codec.Placeholder
	scalars []float64
	names   []string     // of the scalars, "" for none
	binds   []codec.Bind // Op: the index in the recorded ops
}

// NewGraph starts recording a graph.
func (c *Client) NewGraph() *Graph {
	g := &Graph{s: &Session{c: c, record: true, id: "graph", waiters: map[uint64]chan *codec.Result{}}}
	g.s.graph = g
	return g
}

// Graph is the graph s records, nil for a session that sends its ops.
func (s *Session) Graph() *Graph { return s.graph }

// Session is the recording session: build the graph's ops on it (Full,
// Uniform, Apply, ...) and on its tensors. Nothing it records is sent.
func (g *Graph) Session() *Session { return g.s }

// Input adds a tensor placeholder of dtype and shape; a replay binds a
// session tensor of exactly that dtype and shape to it.
func (g *Graph) Input(dtype string, shape []int) *Tensor {
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	g.s.nextID++
	g.inputs = append(g.inputs, g.s.nextID)
	g.metas = append(g.metas, codec.Placeholder{DType: dtype, Shape: append([]int{}, shape...)})
	return &Tensor{s: g.s, id: g.s.nextID}
}

// Scalar is a scalar placeholder of a graph, numbered from 0.
type Scalar int

// Scalar adds a scalar placeholder. v is the value the graph is checked
// with; each replay gives its own.
func (g *Graph) Scalar(v float64) Scalar {
	g.scalars = append(g.scalars, v)
	g.names = append(g.names, "")
	return Scalar(len(g.scalars) - 1)
}

// NamedScalar is the scalar placeholder called name, added with value v
// the first time a name is asked for: code that builds a graph in parts
// (a layer, an optimizer) shares a scalar by name.
func (g *Graph) NamedScalar(name string, v float64) Scalar {
	if i := slices.Index(g.names, name); i >= 0 && name != "" {
		return Scalar(i)
	}
	sc := g.Scalar(v)
	g.names[sc] = name
	return sc
}

// ScalarNames lists the names of the scalar placeholders in order ("" for
// one made by Scalar).
func (g *Graph) ScalarNames() []string { return slices.Clone(g.names) }

// Bind makes attribute attr of the op that made t take scalar sc at each
// replay. attr is one of value, low, high, mean, std, eps, p, lr, t
// (attributes that never change a shape), e.g. the value of a Full holding
// a learning rate, or an adam_step's step count.
func (g *Graph) Bind(t *Tensor, attr string, sc Scalar) error {
	if int(sc) < 0 || int(sc) >= len(g.scalars) {
		return fmt.Errorf("%w: scalar %d of %d", ErrInvalidArgument, sc, len(g.scalars))
	}
	if t == nil || t.s != g.s || t.id == 0 {
		return fmt.Errorf("%w: Bind takes a tensor of the graph", ErrInvalidArgument)
	}
	g.s.mu.Lock()
	defer g.s.mu.Unlock()
	for k := len(g.s.queued) - 1; k >= 0; k-- {
		if slices.Contains(g.s.queued[k].Out, t.id) {
			g.binds = append(g.binds, codec.Bind{Op: k, Attr: attr, Scalar: int(sc)})
			return nil
		}
	}
	return fmt.Errorf("%w: tensor %d is a placeholder, not made by an op of the graph", ErrInvalidArgument, t.id)
}

// GraphDef is a stored graph: what Session.Replay needs to run it.
type GraphDef struct {
	// Name is the SHA-256 of the definition's canonical CBOR, in hex.
	Name string
	// Def is the definition.
	Def codec.Graph
	// Internal is the number of ids a replay reserves: one for every
	// tensor the graph makes.
	Internal int
}

// hostOps are ops a graph cannot hold: they talk to the client or to
// other devices, or change the session rather than make tensors.
var hostOps = []string{"upload", "read", "sync", "seed", "close", "checkpoint", "expose", "import",
	"all_reduce", "all_gather", "reduce_scatter", "broadcast", "replay"}

// Build returns the definition of the graph with outputs, without storing
// it. Ids are renumbered to the canonical spelling (placeholders 1..n,
// then the tensors made in order), so the same program always has the
// same name.
func (g *Graph) Build(outputs ...*Tensor) (*GraphDef, error) {
	g.s.mu.Lock()
	errs := g.s.errs
	ops := slices.Clone(g.s.queued)
	g.s.mu.Unlock()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	local := make(map[uint64]uint64, len(g.inputs)+len(ops))
	for j, id := range g.inputs {
		local[id] = uint64(j + 1)
	}
	next := uint64(len(g.inputs) + 1)
	def := codec.Graph{V: codec.Version, Inputs: g.metas, Scalars: len(g.scalars), Binds: g.binds, Ops: make([]codec.Op, len(ops))}
	for k, op := range ops {
		if slices.Contains(hostOps, op.Op) {
			return nil, fmt.Errorf("%w: a graph cannot hold %s (op %d)", ErrInvalidArgument, op.Op, k)
		}
		in := make([]uint64, len(op.In))
		for j, id := range op.In {
			l, ok := local[id]
			if !ok {
				return nil, fmt.Errorf("%w: op %d (%s) reads tensor %d, made outside the graph", ErrInvalidArgument, k, op.Op, id)
			}
			in[j] = l
		}
		out := make([]uint64, len(op.Out))
		for j, id := range op.Out {
			local[id], out[j] = next, next
			next++
		}
		op.In, op.Out = in, out
		if len(in) == 0 {
			op.In = nil
		}
		if len(out) == 0 {
			op.Out = nil
		}
		def.Ops[k] = op
	}
	for j, t := range outputs {
		if t == nil || t.s != g.s || t.id == 0 {
			return nil, fmt.Errorf("%w: output %d is not a tensor of the graph", ErrInvalidArgument, j)
		}
		def.Outputs = append(def.Outputs, local[t.id])
	}
	_, name, err := codec.EncodeGraph(&def)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &GraphDef{Name: name, Def: def, Internal: int(next) - 1 - len(g.inputs)}, nil
}

// Define builds the graph with outputs and stores it in the graph bucket,
// where every worker finds it. Storing a graph stored before changes
// nothing.
func (g *Graph) Define(ctx context.Context, outputs ...*Tensor) (*GraphDef, error) {
	def, err := g.Build(outputs...)
	if err != nil {
		return nil, err
	}
	return def, g.s.c.StoreGraph(ctx, def)
}

// StoreGraph stores def in the graph bucket, once.
func (c *Client) StoreGraph(ctx context.Context, def *GraphDef) error {
	data, name, err := codec.EncodeGraph(&def.Def)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if name != def.Name {
		return fmt.Errorf("%w: graph definition named %s encodes to %s", ErrInvalidArgument, def.Name, name)
	}
	if c.names.Tenant() != "" {
		return c.storeTenantGraph(ctx, name, data)
	}
	kv, err := c.js.KeyValue(ctx, c.names.GraphBucket())
	if err != nil {
		return fmt.Errorf("client: graph bucket: %w", err)
	}
	if _, err := kv.Create(ctx, name, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("client: store graph %s: %w", name[:12], err)
	}
	return nil
}

// LoadGraph returns the stored graph named name.
func (c *Client) LoadGraph(ctx context.Context, name string) (*GraphDef, error) {
	if !codec.ValidGraphName(name) {
		return nil, fmt.Errorf("%w: graph name %q", ErrInvalidArgument, name)
	}
	value, err := c.graphValue(ctx, name)
	if err != nil {
		return nil, err
	}
	if codec.GraphName(value) != name {
		return nil, fmt.Errorf("client: graph %s: the stored bytes hash to another name", name)
	}
	g, err := codec.DecodeGraph(value)
	if err != nil {
		return nil, fmt.Errorf("client: graph %s: %w", name, err)
	}
	made := 0
	for _, op := range g.Ops {
		made += len(op.Out)
	}
	return &GraphDef{Name: name, Def: *g, Internal: made}, nil
}

// Replay queues one op that runs def with its placeholders bound to in and
// scalars, and returns the graph's outputs. It reserves def.Internal ids:
// the ids the graph's ops would get if this session sent them one by one
// here. Bindings are checked here for count and session; the worker checks
// dtypes and shapes, and a replay with a wrong binding runs nothing.
func (s *Session) Replay(def *GraphDef, in []*Tensor, scalars ...float64) []*Tensor {
	s.mu.Lock()
	defer s.mu.Unlock()
	outs := make([]*Tensor, len(def.Def.Outputs))
	for j := range outs {
		outs[j] = &Tensor{s: s}
	}
	bad := func(err error) []*Tensor {
		s.errs = append(s.errs, err)
		return outs
	}
	switch {
	case s.closed:
		return bad(fmt.Errorf("%w: session %s", ErrClosed, s.id))
	case len(in) != len(def.Def.Inputs):
		return bad(fmt.Errorf("%w: graph %s takes %d inputs, %d given", ErrInvalidArgument, def.Name[:12], len(def.Def.Inputs), len(in)))
	case len(scalars) != def.Def.Scalars:
		return bad(fmt.Errorf("%w: graph %s takes %d scalars, %d given", ErrInvalidArgument, def.Name[:12], def.Def.Scalars, len(scalars)))
	}
	op := codec.Op{Op: "replay", Graph: def.Name, Scalars: slices.Clone(scalars), In: make([]uint64, len(in))}
	for j, t := range in {
		if t == nil || t.s != s || t.id == 0 {
			return bad(fmt.Errorf("%w: replay input %d is nil or belongs to another session", ErrInvalidArgument, j))
		}
		op.In[j] = t.id
	}
	nIn := uint64(len(def.Def.Inputs))
	op.Base = s.nextID + 1
	s.nextID += uint64(def.Internal)
	for j, l := range def.Def.Outputs {
		outs[j].id = op.Base + l - nIn - 1
		op.Out = append(op.Out, outs[j].id)
	}
	s.queueLocked(op, false)
	return outs
}
