package nn

import "errors"

// Errors returned by the package. Shape and dtype errors found by shape
// inference also wrap the kernels sentinels (kernels.ErrShape,
// kernels.ErrDType, kernels.ErrAttr, ...), so callers can match either.
var (
	// ErrInvalidArgument: a call's arguments are wrong (a nil tensor, an
	// option out of range).
	ErrInvalidArgument = errors.New("nn: invalid argument")
	// ErrSession: an op mixes tensors of different sessions.
	ErrSession = errors.New("nn: tensors of different sessions")
	// ErrFreed: the tensor was freed (by Free, Release, or a Backward that
	// freed its graph's intermediates).
	ErrFreed = errors.New("nn: tensor freed")
	// ErrNotScalar: Backward was given a loss with more than one element.
	ErrNotScalar = errors.New("nn: not a scalar")
	// ErrNoGrad: Backward was given a loss that depends on no tensor that
	// requires a gradient, or whose graph an earlier Backward freed.
	ErrNoGrad = errors.New("nn: no gradient")
	// ErrNoRule: the graph holds an op that has no gradient rule.
	ErrNoRule = errors.New("nn: no gradient rule")
)
