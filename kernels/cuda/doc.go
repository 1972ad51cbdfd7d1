// Package cuda is the jetfabric backend for NVIDIA GPUs.
//
// Nothing NVIDIA is linked at build time: the driver (libcuda.so.1), the
// run-time compiler NVRTC and cuBLAS are opened with dlopen when New is
// called, so a binary built with cgo starts on machines without a GPU and
// New says so with ErrNoGPU. Builds without cgo, or for other systems than
// Linux, carry a stub whose New always returns ErrNoGPU.
//
// Each Backend owns one device through its primary context, bound to one OS
// thread: a goroutine started by New locks itself to a thread and issues
// every driver call, in the order the Backend's callers made them. The
// Backend may be called from any goroutine (calls are serialised), and
// does on the caller's goroutine all it can: Alloc and Free take blocks
// from the caching allocator's free lists, and go to the device thread
// only for new memory from the driver; Exec and ExecFused check the op,
// plan its kernels (an elementwise op or a reduction is planned once per
// op and inputs' metas), compile and load kernels not loaded yet, and
// queue the op's launches for the device thread without waiting for them.
// Work runs on one stream in the order it was queued, so a block freed
// while queued work still reads it can be handed out at once. Upload,
// Download and Sync wait for the device thread; Download and Sync wait
// for the stream too. Everything that depends on an op and its inputs
// fails in Exec; a launch that the driver rejects once queued (in practice
// a broken context) is reported by the next Sync, Download or
// index-checking op, as an *AsyncError naming the op, whichever caller
// that is. Close stops the goroutine and releases the device.
//
// Consecutive elementwise ops of one shape form a chain: their launches
// are held back and issued as one fused kernel that writes every op's
// output, once that kernel, compiled in the background the first time
// the chain's form is seen, is loaded; until then they are launched one
// by one. Both give the same bits. A chain is issued before any other
// work (another op, Upload, Download, Sync, new memory), and holds at most
// 16 ops (see WithChains).
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
// kernel for the integer types.
//
// The movement, indexing, norm and creation ops (kernels.Movement,
// Indexing, Norms, Creation) run in every dtype they accept. Movement ops
// copy elements by size (1, 2, 4 or 8 bytes) through one strided-copy
// kernel: strides may be zero (expand) or negative (flip, negative slice
// steps); pad fills first, concat, stack and split take one launch per
// piece, squeeze and unsqueeze are plain copies. gather, index_select,
// one_hot and scatter_add set a device flag on an index out of range,
// read back after the launch (so they wait for the stream), and return
// kernels.ErrIndex as the CPU does. scatter_add is deterministic, with no
// atomics: one thread per output element adds the entries aimed at it in
// index order, so its sums round exactly as the CPU's. layer_norm and
// rms_norm take one block per normalised row and sum in float64 (in a
// tree, not in the CPU's order), rounding once. bernoulli matches
// kernels.UniformAt(seed, key, i, 0, 1) < p bit for bit.
//
// conv2d and its two gradients lower to cuBLAS GEMMs over an im2col
// matrix, built for a chunk of images at a time (at most 256 MiB of it):
// the forward is one strided batched GEMM per group over the chunk's
// images, the input gradient a strided batched GEMM into the matrix's
// gradient then a col2im gather (one thread per input element adds the
// entries that copied it, taps in order), the weight gradient one GEMM
// per group over the chunk's images and positions, chunks accumulated in
// order. They run in float32 and float64 (float16 and bfloat16 return
// kernels.ErrNotImplemented). The pools and cross_entropy are generated
// kernels in every float dtype: max_pool2d_grad and avg_pool2d_grad are
// gathers that add each input element's windows in row-major order (a max
// pool whose windows do not overlap writes each window's elements from one
// thread), and cross_entropy gives each row a warp that sums in float64,
// with a target out of range reported as kernels.ErrIndex through a device
// flag. None of these uses atomics, so every result is the same bits from
// run to run. The convolution and pooling kernels are compiled for their
// geometry (extents, strides, padding, dilation), so that their index
// arithmetic has constant divisors.
//
// Device memory comes from a caching allocator with size classes; classes
// up to 64 KiB are carved from 2 MiB slabs. Host transfers go through
// pinned staging buffers, or, from and into a buffer that HostBuffer lent
// (page-locked itself), straight to and from the device.
//
// Random ops reproduce kernels.UniformAt and kernels.NormalAt bit for bit:
// the generated code mixes the same splitmix64 counters and evaluates
// log and cos with the same float64 algorithms as Go's math package.
package cuda
