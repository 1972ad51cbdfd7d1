// Package kernels defines what a jetfabric device can compute: the dtypes,
// the op set with its shape and dtype rules, the counter-based random
// generator, and the small Backend interface that every device
// implementation (kernels/cpu, kernels/cuda) satisfies.
//
// A worker validates an op with Infer, allocates the outputs it names and
// hands the op to a Backend's Exec. Backends may offer more through optional
// interfaces found by type assertion; a backend that cannot do something
// returns ErrNotImplemented and the caller falls back. One of them records
// the device work of a run of ops as a Program, run again on other inputs
// (Record, RecordInput, EndRecord; the worker's replays of a graph).
//
// Every op's result is a function of its inputs and the op alone: random ops
// draw from Random, keyed by (seed, key, element index), never from hidden
// state, so replaying an op stream reproduces every tensor bit for bit.
package kernels
