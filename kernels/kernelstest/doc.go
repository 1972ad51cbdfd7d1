// Package kernelstest is the conformance suite of jetfabric's kernel
// backends, in the manner of testing/fstest: a backend's tests call
//
//	func TestConformance(t *testing.T) { kernelstest.RunAll(t, mybackend.New()) }
//
// RunAll drives the backend only through kernels.Backend (Alloc, Upload,
// Exec, Sync, Download, Free), so the same suite checks the CPU backend,
// which is the oracle, and any device backend.
//
// Every op in kernels.OpNames has a test here, and an op added to the set
// without one fails the suite. Inputs are random, drawn afresh on every run
// from a seed that is logged when a test fails and can be fixed with the
// environment variable JETFABRIC_KERNELS_SEED. Outputs are filled with
// 0xFF bytes (NaN, -1, or an invalid bool) before Exec, with poisoned guard
// bytes after them that must survive. Results are compared with references
// computed by the suite in float64, or exactly in int64 for integers, with
// the tolerances in this package's tolerances table: integers, casts,
// creation and random ops must match exactly, a float result within about
// two units in the last place of its dtype, widened for accumulating ops
// by the number of terms times the dtype's unit roundoff times the sum of
// the terms' magnitudes.
package kernelstest
