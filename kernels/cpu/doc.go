// Package cpu is jetfabric's reference backend: every op of the kernels op
// set, for every dtype its rule accepts, in pure Go. It is the default
// device, and the oracle other backends are checked against.
//
// Buffers are host memory (Buffer.Host). Tensors are contiguous,
// row-major and little-endian, as kernels says.
//
// # Numerics
//
// Results do not depend on the number of cores: work is split across
// goroutines only along boundaries that do not change any summation order,
// and floating-point sums are taken in fixed blocks whose partial sums are
// combined in a fixed order, so an op gives the same bits on every machine
// and on replay. float32 sums, means, products and variances accumulate in
// float64; matrix products accumulate in the operands' dtype. float16 and
// bfloat16 are computed in float32 and rounded once to the output dtype.
// Integer arithmetic wraps; integer division truncates toward zero and
// division by zero gives 0. Conversions from floats to integers truncate
// toward zero and saturate, NaN giving 0. Random ops draw from
// kernels.UniformAt and kernels.NormalAt in float64 and round the result.
// layer_norm and rms_norm compute each group in float64 and round once;
// scatter_add adds in index order in the output dtype (float16 and
// bfloat16 in float32), so repeated indices sum the same way every time.
// The convolutions are matrix products over column matrices (im2col),
// accumulating in the operands' dtype, cut into chunks that depend on the
// shapes alone; the weight gradient adds its chunks' products in a fixed
// order. On amd64 with AVX2 and FMA, a float32 conv2d and its input
// gradient with stride 1, no padding, one group and 8 channels or more on
// the summed side take the direct path instead: one product per kernel
// tap, reading x (or dy, padded) in place, the taps added in order; so
// their bits differ from the column path's, but depend on the shapes and
// the CPU's micro-kernel alone. avg_pool2d and cross_entropy accumulate in
// float64; the pooling gradients add into each input plane in a fixed
// order.
//
// # Fusion
//
// ExecFused runs a kernels.FusedGroup of elementwise ops block by block
// through cache, each op the very kernel it runs alone on a slice of its
// operands, and ExecRelu runs a conv2d taking relu as it writes its
// outputs: both give the bits of their ops one by one. The worker calls
// them for runs of ops whose intermediate results are freed right after,
// so those are never stored. ExecMatmulT runs a matmul of 2-D float32 or
// float64 operands either of which is given as its transpose, packing it
// from where it is (the worker calls it for a permute [1, 0] whose output
// only a matmul reads, as nn's Linear layers make), with the bits of the
// permute and the matmul one by one.
//
// # Memory
//
// Buffers are 8-byte aligned Go memory. Free keeps freed buffers of 1 MiB
// and more, by exact size, up to WithCache bytes (1 GiB by default), and
// Alloc hands them out again, cleared: tensors of the same shapes freed and
// made every step of a loop reuse warm memory instead of faulting in fresh
// pages, which cost about as much as copying the bytes twice. AllocUninit
// skips the clearing for a caller that writes every byte (an upload, a
// transfer).
//
// # Concurrency
//
// A Backend is used by one goroutine at a time, as kernels.Backend says.
// Exec splits ops above about 32K elements across runtime.GOMAXPROCS
// goroutines (fewer with SetThreads), which it starts and waits for;
// smaller ops run on the calling goroutine and allocate nothing. The
// convolutions run their chunks on as many goroutines, each with scratch column matrices of about a
// million elements taken from a pool. The movement, indexing and
// normalisation ops (kernels.Movement, Indexing, Norms) run on the calling
// goroutine and allocate a little bookkeeping per call.
package cpu
