package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// maxThreads bounds the goroutines one op splits its work over (0: none
// but GOMAXPROCS); see SetThreads.
var maxThreads atomic.Int32

// SetThreads bounds the goroutines that one op of any CPU backend of the
// process splits its work over to n; 0 or less lifts the bound. By
// default an op takes up to GOMAXPROCS: with fewer, the processors left
// over run what else the process does (a worker's network and its
// collectives) at once, instead of waiting for an op's goroutines to
// yield.
func SetThreads(n int) { maxThreads.Store(int32(max(n, 0))) }

// threads is the most goroutines one op splits its work over.
func threads() int {
	n := runtime.GOMAXPROCS(0)
	if m := int(maxThreads.Load()); m > 0 && m < n {
		return m
	}
	return n
}

// parallelMin is the number of cheap element operations below which an op
// runs on the calling goroutine.
const parallelMin = 1 << 15

// vecGrain is the number of float32 elements that the vector kernels
// (elementwise_amd64.go) take in the time of one cheap element operation
// of a Go loop, where the CPU has them: those ops spread over the cores
// only when that much larger, starting goroutines costing more than the
// work they would share.
var vecGrain = 1

// maxRank is the highest rank the backend handles.
const maxRank = 16

// split returns how many goroutines should share n units of work when one
// unit costs about cost cheap element operations: 1 below parallelMin,
// else up to threads(), each with at least parallelMin/2 of work.
func split(n, cost int) int {
	work := n * max(cost, 1)
	if work < parallelMin || n < 2 {
		return 1
	}
	return max(1, min(threads(), work/(parallelMin/2), n))
}

// parallel runs f over w contiguous ranges covering [0, n) and waits for
// all of them. A panic in any range is raised again on the calling
// goroutine. Every range runs on a goroutine of its own, the caller only
// waiting: were the caller to take the first range, the others could start
// only once the scheduler found them a processor, up to 0.2 ms later on a
// machine with few cores (matmul's spread does the same).
func parallel(n, w int, f func(lo, hi int)) {
	if w <= 1 {
		f(0, n)
		return
	}
	spread(w, func(i int) { f(bound(n, w, i), bound(n, w, i+1)) })
}

// bound is the start of range i of w over [0, n), rounded to a multiple of
// 16 elements so ranges do not share cache lines.
func bound(n, w, i int) int {
	if i >= w {
		return n
	}
	b := int(int64(n) * int64(i) / int64(w))
	if n >= 16*w {
		b &^= 15
	}
	return b
}

// view returns b's first n elements as a []T; b must hold them and be
// aligned for T.
func view[T any](b []byte, n int) []T {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// scratch pools, to keep temporaries off the heap in steady state.
var (
	f64Pool  = sync.Pool{New: func() any { return new([]float64) }}
	wordPool = sync.Pool{New: func() any { return new([]uint64) }}
)

func getF64(n int) *[]float64 {
	p := f64Pool.Get().(*[]float64)
	if cap(*p) < n {
		*p = make([]float64, n)
	}
	*p = (*p)[:n]
	return p
}

// getBytes returns a pooled 8-byte-aligned scratch of n bytes and its
// handle for putBytes.
func getBytes(n int) ([]byte, *[]uint64) {
	p := wordPool.Get().(*[]uint64)
	w := (n + 7) / 8
	if cap(*p) < w {
		*p = make([]uint64, w)
	}
	*p = (*p)[:w]
	if n == 0 {
		return []byte{}, p
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&(*p)[0])), n), p
}

// asBytes returns the memory of x as bytes.
func asBytes[T any](x []T) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*sizeOf[T]())
}

// sizeOf is the size of a T in bytes.
func sizeOf[T any]() int {
	var z T
	return int(unsafe.Sizeof(z))
}
