// Package cuda is the jetfabric backend for NVIDIA GPUs.
//
// Nothing NVIDIA is linked at build time: the driver (libcuda.so.1), the
// run-time compiler NVRTC and cuBLAS are opened with dlopen when New is
// called, so a binary built with cgo starts on machines without a GPU and
// New says so with ErrNoGPU. Builds without cgo, or for other systems than
// Linux, carry a stub whose New always returns ErrNoGPU.
//
// Each Backend owns one device through its primary context, bound to one OS
// thread: a goroutine started by New locks itself to a thread and runs
// every call the Backend receives, in order, so the Backend may be called
// from any goroutine (calls are serialised). Work is queued on one stream;
// Exec returns once the work is queued, Download and Sync wait for it.
// Close stops the goroutine and releases the device.
//
// Kernels are CUDA C generated as Go strings and compiled at run time by
// NVRTC for the device's compute capability; the images are cached by the
// SHA-256 of source and options, in memory and on disk (see WithCacheDir).
// One generator serves every elementwise op (unary, binary with
// broadcasting, comparisons, where, clamp, cast), permutes, and the
// reductions (sum, mean, max, min, prod, argmax, argmin, logsumexp, var,
// and through them softmax); it also fuses chains of elementwise ops,
// optionally ending in a reduction, into one kernel (ExecFused on a
// kernels.FusedGroup): intermediates that no output names are never
// stored. Permutes that swap the two innermost dims use shared-memory
// tiles. Matrix products run on cuBLAS (float32, optionally TF32, float16
// and bfloat16 with float32 accumulation, float64), with a generated
// kernel for the integer types. Device memory comes from a caching
// allocator with size classes; host transfers go through pinned staging
// buffers.
//
// Random ops reproduce kernels.UniformAt and kernels.NormalAt bit for bit:
// the generated code mixes the same splitmix64 counters and evaluates
// log and cos with the same float64 algorithms as Go's math package.
package cuda
