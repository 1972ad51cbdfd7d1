package objectstore

import (
	"os"
	"syscall"
	"unsafe"
)

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14 and later): fault
// a range's pages in, writable, in one call.
const madvPopulateWrite = 23

// prefaultMin is the smallest destination worth a system call.
const prefaultMin = 1 << 20

var pageSize = uintptr(os.Getpagesize())

// prefault faults in the whole pages of dst, which a read of a stored
// object is about to fill, in one system call. A destination freshly
// allocated (a tensor restored from a checkpoint) has no pages yet, and
// filling it took a fault on every 4 KiB page: on the 2-core VM the copy
// of a 1 GiB restore spent 1.05 s of its 2.85 s of CPU there. A read that
// follows an object still being written (Follow) does not: on the 16-core
// host its uploads were slower with it, the faults having overlapped the
// transfer. A kernel without the call refuses it, and the pages fault one
// by one as before.
func prefault(dst []byte) {
	if len(dst) < prefaultMin {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
	from := int((start+pageSize-1)&^(pageSize-1) - start)
	to := int((start+uintptr(len(dst)))&^(pageSize-1) - start)
	if to <= from {
		return
	}
	_ = syscall.Madvise(dst[from:to], madvPopulateWrite)
}
