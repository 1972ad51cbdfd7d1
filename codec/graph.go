package codec

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Graph limits: a definition over any of them is refused.
const (
	// MaxGraphBytes bounds an encoded definition.
	MaxGraphBytes = 1 << 20
	// MaxGraphOps bounds the ops of a graph.
	MaxGraphOps = 1 << 14
	// MaxGraphInputs bounds its tensor placeholders, outputs and scalars.
	MaxGraphInputs = 1 << 12
)

// Graph is a captured program: a sequence of ops over local tensor ids,
// stored once under its name (GraphName of its encoding) and run by a
// replay op that binds its placeholders to session tensors.
//
// Local ids 1..len(Inputs) are the tensor placeholders, in order. Every op
// output is a new local id, numbered on from len(Inputs)+1 in the order
// the ops produce them, so that a definition has one spelling. An op reads
// only placeholders and ids produced by earlier ops and not freed since.
// Outputs lists the produced ids the replay binds to session ids.
type Graph struct {
	V      int           `cbor:"v" json:"v"`
	Inputs []Placeholder `cbor:"inputs,omitempty" json:"inputs,omitempty"`
	// Scalars is the number of scalar placeholders; Binds places them.
	Scalars int      `cbor:"scalars,omitempty" json:"scalars,omitempty"`
	Ops     []Op     `cbor:"ops" json:"ops"`
	Outputs []uint64 `cbor:"outputs,omitempty" json:"outputs,omitempty"`
	Binds   []Bind   `cbor:"binds,omitempty" json:"binds,omitempty"`
}

// Placeholder is a tensor input of a graph: its dtype and shape are fixed,
// and a replay binds a session tensor of exactly that dtype and shape.
type Placeholder struct {
	DType string `cbor:"dtype" json:"dtype"`
	Shape []int  `cbor:"shape" json:"shape"`
}

// Bind sets attribute Attr of op Op (an index into Graph.Ops) to scalar
// placeholder Scalar at each replay. Attr is one of the float attributes
// that never change a shape: value, low, high, mean, std, eps, p. The
// value in the op itself is the one validation uses.
type Bind struct {
	Op     int    `cbor:"op" json:"op"`
	Attr   string `cbor:"attr" json:"attr"`
	Scalar int    `cbor:"scalar" json:"scalar"`
}

// EncodeGraph returns g's canonical CBOR encoding and its name.
func EncodeGraph(g *Graph) (data []byte, name string, err error) {
	data, err = encMode.Marshal(g)
	if err != nil {
		return nil, "", fmt.Errorf("codec: encode graph: %w", err)
	}
	if len(data) > MaxGraphBytes {
		return nil, "", fmt.Errorf("%w: graph definition of %d bytes, at most %d", ErrTooLarge, len(data), MaxGraphBytes)
	}
	return data, GraphName(data), nil
}

// GraphName is the name of an encoded graph: the SHA-256 of its bytes in
// lower-case hex.
func GraphName(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// DecodeGraph decodes a CBOR graph definition and checks its version and
// sizes; the ids and the ops are the worker's to validate. Errors wrap
// ErrMalformed, ErrVersion or ErrTooLarge.
func DecodeGraph(data []byte) (*Graph, error) {
	if len(data) > MaxGraphBytes {
		return nil, fmt.Errorf("%w: graph definition of %d bytes, at most %d", ErrTooLarge, len(data), MaxGraphBytes)
	}
	g := new(Graph)
	if err := Unmarshal(CBOR, data, g); err != nil {
		return nil, err
	}
	if g.V != Version {
		return nil, fmt.Errorf("%w: graph version %d, this build speaks %d", ErrVersion, g.V, Version)
	}
	switch {
	case len(g.Ops) > MaxGraphOps:
		return nil, fmt.Errorf("%w: graph of %d ops, at most %d", ErrTooLarge, len(g.Ops), MaxGraphOps)
	case len(g.Inputs) > MaxGraphInputs, len(g.Outputs) > MaxGraphInputs, g.Scalars > MaxGraphInputs, len(g.Binds) > MaxGraphOps:
		return nil, fmt.Errorf("%w: graph of %d inputs, %d outputs, %d scalars and %d binds, at most %d each (%d binds)",
			ErrTooLarge, len(g.Inputs), len(g.Outputs), g.Scalars, len(g.Binds), MaxGraphInputs, MaxGraphOps)
	}
	return g, nil
}

// ValidGraphName reports whether name can name a graph: 64 lower-case
// hex digits.
func ValidGraphName(name string) bool {
	if len(name) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
