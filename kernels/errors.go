package kernels

import "errors"

// Errors returned by shape inference and backends. Callers match them with
// errors.Is; the wrapped text says which op and which input.
var (
	// ErrUnknownOp: the op name is not in the op set.
	ErrUnknownOp = errors.New("kernels: unknown op")
	// ErrArity: the op got the wrong number of inputs.
	ErrArity = errors.New("kernels: wrong number of inputs")
	// ErrShape: shapes do not fit the op (broadcast, matmul, reshape...).
	ErrShape = errors.New("kernels: shape mismatch")
	// ErrDType: the op does not accept this dtype.
	ErrDType = errors.New("kernels: unsupported dtype")
	// ErrAttr: an attribute is missing or out of range.
	ErrAttr = errors.New("kernels: invalid attribute")
	// ErrTooLarge: a tensor exceeds a configured limit.
	ErrTooLarge = errors.New("kernels: tensor too large")
	// ErrIndex: an index tensor holds a value outside the axis it indexes
	// (gather, scatter_add, index_select, one_hot). Backends find it while
	// running, so it comes from Exec; the error also wraps ErrShape.
	ErrIndex = errors.New("kernels: index out of range")
	// ErrNotImplemented: the backend cannot run this op; callers may fall back.
	ErrNotImplemented = errors.New("kernels: not implemented by this backend")
	// ErrOutOfMemory: the backend could not allocate.
	ErrOutOfMemory = errors.New("kernels: out of device memory")
	// ErrNotRecordable: the work recorded (see Program) cannot be run again
	// as it was recorded: a call failed, data went to or from the host, a
	// check ran on the host.
	ErrNotRecordable = errors.New("kernels: work not recordable")
	// ErrNotYet: a recording (see Program) was refused for now, not for
	// good: the same work recorded later may be accepted (a fused kernel
	// it would use is still compiling).
	ErrNotYet = errors.New("kernels: not ready yet")
)
