//go:build cgo && linux

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

// Only what jetfabric calls, declared here so that no CUDA header is needed.
typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef void* CUevent;
typedef unsigned long long CUdeviceptr;
typedef int nvrtcResult;
typedef void* nvrtcProgram;
typedef int cublasStatus_t;
typedef void* cublasHandle_t;
typedef void* CUgraph;
typedef void* CUgraphExec;

// X(return type, symbol, parameters, arguments). The first names are tried
// in order; the wrapper is called jf_<first name>.
#define JF_CUDA(X) \
	X(CUresult, cuInit, (unsigned int a), (a)) \
	X(CUresult, cuDriverGetVersion, (int* a), (a)) \
	X(CUresult, cuDeviceGetCount, (int* a), (a)) \
	X(CUresult, cuDeviceGet, (CUdevice* a, int b), (a, b)) \
	X(CUresult, cuDeviceGetName, (char* a, int b, CUdevice c), (a, b, c)) \
	X(CUresult, cuDeviceGetAttribute, (int* a, int b, CUdevice c), (a, b, c)) \
	X(CUresult, cuDeviceTotalMem_v2, (size_t* a, CUdevice b), (a, b)) \
	X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext* a, CUdevice b), (a, b)) \
	X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice a), (a)) \
	X(CUresult, cuCtxSetCurrent, (CUcontext a), (a)) \
	X(CUresult, cuStreamCreate, (CUstream* a, unsigned int b), (a, b)) \
	X(CUresult, cuStreamDestroy_v2, (CUstream a), (a)) \
	X(CUresult, cuStreamSynchronize, (CUstream a), (a)) \
	X(CUresult, cuEventCreate, (CUevent* a, unsigned int b), (a, b)) \
	X(CUresult, cuEventDestroy_v2, (CUevent a), (a)) \
	X(CUresult, cuEventRecord, (CUevent a, CUstream b), (a, b)) \
	X(CUresult, cuEventSynchronize, (CUevent a), (a)) \
	X(CUresult, cuEventElapsedTime_v2, (float* a, CUevent b, CUevent c), (a, b, c)) \
	X(CUresult, cuMemAlloc_v2, (CUdeviceptr* a, size_t b), (a, b)) \
	X(CUresult, cuMemFree_v2, (CUdeviceptr a), (a)) \
	X(CUresult, cuMemGetInfo_v2, (size_t* a, size_t* b), (a, b)) \
	X(CUresult, cuMemHostAlloc, (void** a, size_t b, unsigned int c), (a, b, c)) \
	X(CUresult, cuMemFreeHost, (void* a), (a)) \
	X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr a, const void* b, size_t c, CUstream d), (a, b, c, d)) \
	X(CUresult, cuMemcpyDtoHAsync_v2, (void* a, CUdeviceptr b, size_t c, CUstream d), (a, b, c, d)) \
	X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr a, CUdeviceptr b, size_t c, CUstream d), (a, b, c, d)) \
	X(CUresult, cuMemsetD8Async, (CUdeviceptr a, unsigned char b, size_t c, CUstream d), (a, b, c, d)) \
	X(CUresult, cuModuleLoadData, (CUmodule* a, const void* b), (a, b)) \
	X(CUresult, cuModuleUnload, (CUmodule a), (a)) \
	X(CUresult, cuModuleGetFunction, (CUfunction* a, CUmodule b, const char* c), (a, b, c)) \
	X(CUresult, cuLaunchKernel, (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int sh, CUstream s, void** p, void** e), (f, gx, gy, gz, bx, by, bz, sh, s, p, e)) \
	X(CUresult, cuGetErrorName, (CUresult a, const char** b), (a, b))

// CUDA graphs, loaded apart: a driver without them still runs programs
// call by call (see program.go).
#define JF_GRAPH(X) \
	X(CUresult, cuStreamBeginCapture_v2, (CUstream a, int b), (a, b)) \
	X(CUresult, cuStreamEndCapture, (CUstream a, CUgraph* b), (a, b)) \
	X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec* a, CUgraph b, unsigned long long c), (a, b, c)) \
	X(CUresult, cuGraphLaunch, (CUgraphExec a, CUstream b), (a, b)) \
	X(CUresult, cuGraphExecDestroy, (CUgraphExec a), (a)) \
	X(CUresult, cuGraphDestroy, (CUgraph a), (a))

#define JF_NVRTC(X) \
	X(nvrtcResult, nvrtcVersion, (int* a, int* b), (a, b)) \
	X(nvrtcResult, nvrtcCreateProgram, (nvrtcProgram* a, const char* b, const char* c, int d, const char* const* e, const char* const* f), (a, b, c, d, e, f)) \
	X(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram* a), (a)) \
	X(nvrtcResult, nvrtcCompileProgram, (nvrtcProgram a, int b, const char* const* c), (a, b, c)) \
	X(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram a, size_t* b), (a, b)) \
	X(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram a, char* b), (a, b)) \
	X(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram a, size_t* b), (a, b)) \
	X(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram a, char* b), (a, b)) \
	X(const char*, nvrtcGetErrorString, (nvrtcResult a), (a))

#define JF_CUBLAS(X) \
	X(cublasStatus_t, cublasCreate_v2, (cublasHandle_t* a), (a)) \
	X(cublasStatus_t, cublasDestroy_v2, (cublasHandle_t a), (a)) \
	X(cublasStatus_t, cublasSetStream_v2, (cublasHandle_t a, CUstream b), (a, b)) \
	X(cublasStatus_t, cublasSetWorkspace_v2, (cublasHandle_t a, void* b, size_t c), (a, b, c)) \
	X(cublasStatus_t, cublasGetVersion_v2, (cublasHandle_t a, int* b), (a, b)) \
	X(cublasStatus_t, cublasGemmEx, (cublasHandle_t h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, int lda, const void* B, int bt, int ldb, const void* beta, void* C, int ct, int ldc, int comp, int algo), (h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, comp, algo)) \
	X(cublasStatus_t, cublasGemmStridedBatchedEx, (cublasHandle_t h, int ta, int tb, int m, int n, int k, const void* alpha, const void* A, int at, int lda, long long sa, const void* B, int bt, int ldb, long long sb, const void* beta, void* C, int ct, int ldc, long long sc, int count, int comp, int algo), (h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, count, comp, algo)) \
	X(const char*, cublasGetStatusName, (cublasStatus_t a), (a))

#define JF_DECL(ret, name, params, args) \
	static ret (*p_##name) params; \
	static ret jf_##name params { return p_##name args; }
JF_CUDA(JF_DECL)
JF_GRAPH(JF_DECL)
JF_NVRTC(JF_DECL)
JF_CUBLAS(JF_DECL)

// Symbols whose name changed between releases: other names to try.
static const char* jf_alias(const char* name) {
	// cuEventElapsedTime_v2 is CUDA 12.8+; older drivers have cuEventElapsedTime.
	if (strcmp(name, "cuEventElapsedTime_v2") == 0) return "cuEventElapsedTime";
	return NULL;
}

static void* jf_sym(void* lib, const char* name) {
	void* p = dlsym(lib, name);
	if (!p) {
		const char* alt = jf_alias(name);
		if (alt) p = dlsym(lib, alt);
	}
	return p;
}

#define JF_LOAD(ret, name, params, args) \
	p_##name = (ret (*) params)jf_sym(lib, #name); \
	if (!p_##name) return #name;

static void* jf_open(const char* const* names, int n) {
	for (int i = 0; i < n; i++) {
		void* lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
		if (lib) return lib;
	}
	return NULL;
}

// Each loader returns NULL on success, else the missing symbol's name.
static const char* jf_load_cuda(void* lib) { JF_CUDA(JF_LOAD) return NULL; }
static const char* jf_load_graph(void* lib) { JF_GRAPH(JF_LOAD) return NULL; }
static const char* jf_load_nvrtc(void* lib) { JF_NVRTC(JF_LOAD) return NULL; }
static const char* jf_load_cublas(void* lib) { JF_CUBLAS(JF_LOAD) return NULL; }

static const char* jf_dlerror(void) { return dlerror(); }

// Status names, or NULL when the library is not loaded.
static const char* jf_cu_error_name(CUresult r) {
	const char* s = NULL;
	if (p_cuGetErrorName && p_cuGetErrorName(r, &s) == 0) return s;
	return NULL;
}
static const char* jf_nvrtc_error_name(nvrtcResult r) { return p_nvrtcGetErrorString ? p_nvrtcGetErrorString(r) : NULL; }
static const char* jf_cublas_error_name(cublasStatus_t r) { return p_cublasGetStatusName ? p_cublasGetStatusName(r) : NULL; }

static cublasStatus_t jf_set_workspace(cublasHandle_t h, CUdeviceptr p, size_t n) {
	return p_cublasSetWorkspace_v2(h, (void*)p, n);
}

// jf_gemm: C = op(A)*op(B) + beta*C, column-major, op a transpose where
// ta (tb) is 1; beta is 0, or 1 when acc is set. A strided batched call
// when count > 1. alpha and beta are double for the float64 compute type.
static cublasStatus_t jf_gemm(cublasHandle_t h, int ta, int tb, int acc, int m, int n, int k, CUdeviceptr A, int lda, long long sa,
		CUdeviceptr B, int ldb, long long sb, CUdeviceptr C, int ldc, long long sc, int count, int dtype, int compute) {
	float one32 = 1, zero32 = 0;
	double one64 = 1, zero64 = 0;
	const void* alpha = &one32;
	const void* beta = acc ? &one32 : &zero32;
	if (compute == 70 || compute == 71) { alpha = &one64; beta = acc ? &one64 : &zero64; } // CUBLAS_COMPUTE_64F
	if (count == 1) {
		return p_cublasGemmEx(h, ta, tb, m, n, k, alpha, (const void*)A, dtype, lda, (const void*)B, dtype, ldb,
			beta, (void*)C, dtype, ldc, compute, -1);
	}
	return p_cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, (const void*)A, dtype, lda, sa, (const void*)B, dtype, ldb, sb,
		beta, (void*)C, dtype, ldc, sc, count, compute, -1);
}

// jf_launch builds the parameter array from a packed blob: parameter i
// is at blob + offs[i].
static CUresult jf_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
		CUstream s, char* blob, const int* offs, int n) {
	void* args[512];
	if (n > 512) return 1; // CUDA_ERROR_INVALID_VALUE
	for (int i = 0; i < n; i++) args[i] = blob + offs[i];
	return p_cuLaunchKernel(f, gx, gy, gz, bx, 1, 1, 0, s, args, NULL);
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// Library names, newest first. The NVRTC of CUDA 11 is libnvrtc.so.11.2.
var (
	cudaLibs   = []string{"libcuda.so.1", "libcuda.so"}
	nvrtcLibs  = []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", "libnvrtc.so.11.2"}
	cublasLibs = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}
)

// libDirs are searched when the loader's own path finds nothing.
func libDirs() []string {
	var d []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if v := os.Getenv(env); v != "" {
			d = append(d, filepath.Join(v, "lib64"), filepath.Join(v, "lib"))
		}
	}
	return append(d, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/local/cuda/targets/sbsa-linux/lib")
}

// openLib opens the first library found; on failure it returns the
// loader's message for the first name.
func openLib(names []string) (unsafe.Pointer, string) {
	cands := append([]string{}, names...)
	for _, dir := range libDirs() {
		for _, n := range names {
			cands = append(cands, filepath.Join(dir, n))
		}
	}
	first := ""
	for _, n := range cands {
		cn := C.CString(n)
		lib := C.jf_open(&cn, 1)
		C.free(unsafe.Pointer(cn))
		if lib != nil {
			return lib, ""
		}
		if first == "" {
			first = C.GoString(C.jf_dlerror())
		}
	}
	return nil, first
}

var (
	cudaOnce, nvrtcOnce, cublasOnce sync.Once
	cudaErr, nvrtcErr, cublasErr    error
	nvrtcMajor, nvrtcMinor          int
	// graphErr says why the driver offers no CUDA graphs (programs then
	// run call by call).
	graphErr error
)

// loadDriver opens libcuda and calls cuInit once per process.
func loadDriver() error {
	cudaOnce.Do(func() {
		lib, why := openLib(cudaLibs)
		if lib == nil {
			cudaErr = fmt.Errorf("%w: cannot open libcuda.so.1: %s", ErrNoGPU, why)
			return
		}
		if missing := C.jf_load_cuda(lib); missing != nil {
			cudaErr = fmt.Errorf("%w: libcuda lacks %s", ErrNoGPU, C.GoString(missing))
			return
		}
		if err := cuResult("cuInit", C.jf_cuInit(0)); err != nil {
			cudaErr = fmt.Errorf("%w: %w", ErrNoGPU, err)
			return
		}
		if missing := C.jf_load_graph(lib); missing != nil {
			graphErr = fmt.Errorf("libcuda lacks %s", C.GoString(missing))
		}
	})
	return cudaErr
}

// loadNVRTC opens NVRTC once per process.
func loadNVRTC() error {
	nvrtcOnce.Do(func() {
		lib, why := openLib(nvrtcLibs)
		if lib == nil {
			nvrtcErr = fmt.Errorf("%w: %s", ErrNoCompiler, why)
			return
		}
		if missing := C.jf_load_nvrtc(lib); missing != nil {
			nvrtcErr = fmt.Errorf("%w: libnvrtc lacks %s", ErrNoCompiler, C.GoString(missing))
			return
		}
		var maj, mnr C.int
		if err := nvrtcResult("nvrtcVersion", C.jf_nvrtcVersion(&maj, &mnr)); err != nil {
			nvrtcErr = err
			return
		}
		nvrtcMajor, nvrtcMinor = int(maj), int(mnr)
	})
	return nvrtcErr
}

// loadCUBLAS opens cuBLAS once per process; without it matrix products
// run on generated kernels.
func loadCUBLAS() error {
	cublasOnce.Do(func() {
		lib, why := openLib(cublasLibs)
		if lib == nil {
			cublasErr = fmt.Errorf("cuda: cuBLAS not found: %s", why)
			return
		}
		if missing := C.jf_load_cublas(lib); missing != nil {
			cublasErr = fmt.Errorf("cuda: libcublas lacks %s", C.GoString(missing))
		}
	})
	return cublasErr
}

// cuResult turns a driver status into an error: nil on CUDA_SUCCESS.
func cuResult(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	name := "CUDA_ERROR_UNKNOWN"
	if s := C.jf_cu_error_name(r); s != nil {
		name = C.GoString(s)
	}
	return &Error{Library: "cuda", Call: call, Code: int(r), Name: name}
}

// nvrtcResult turns an NVRTC status into an error: nil on NVRTC_SUCCESS.
func nvrtcResult(call string, r C.nvrtcResult) error {
	if r == 0 {
		return nil
	}
	name := "NVRTC_ERROR_UNKNOWN"
	if s := C.jf_nvrtc_error_name(r); s != nil {
		name = C.GoString(s)
	}
	return &Error{Library: "nvrtc", Call: call, Code: int(r), Name: name}
}

// cublasResult turns a cuBLAS status into an error: nil on CUBLAS_STATUS_SUCCESS.
func cublasResult(call string, r C.cublasStatus_t) error {
	if r == 0 {
		return nil
	}
	name := "CUBLAS_STATUS_UNKNOWN"
	if s := C.jf_cublas_error_name(r); s != nil {
		name = C.GoString(s)
	}
	return &Error{Library: "cublas", Call: call, Code: int(r), Name: name}
}

// compileCUBIN compiles CUDA C source with NVRTC and returns the cubin.
func compileCUBIN(src string, opts []string) ([]byte, error) {
	if err := loadNVRTC(); err != nil {
		return nil, err
	}
	csrc := C.CString(src)
	defer C.free(unsafe.Pointer(csrc))
	cname := C.CString("jetfabric.cu")
	defer C.free(unsafe.Pointer(cname))
	var prog C.nvrtcProgram
	if err := nvrtcResult("nvrtcCreateProgram", C.jf_nvrtcCreateProgram(&prog, csrc, cname, 0, nil, nil)); err != nil {
		return nil, err
	}
	defer C.jf_nvrtcDestroyProgram(&prog)
	copts := make([]*C.char, len(opts))
	for i, o := range opts {
		copts[i] = C.CString(o)
	}
	defer func() {
		for _, c := range copts {
			C.free(unsafe.Pointer(c))
		}
	}()
	var optp **C.char
	if len(copts) > 0 {
		optp = (**C.char)(unsafe.Pointer(&copts[0]))
	}
	if err := nvrtcResult("nvrtcCompileProgram", C.jf_nvrtcCompileProgram(prog, C.int(len(copts)), optp)); err != nil {
		var n C.size_t
		log := ""
		if C.jf_nvrtcGetProgramLogSize(prog, &n) == 0 && n > 1 {
			buf := C.malloc(n)
			if C.jf_nvrtcGetProgramLog(prog, (*C.char)(buf)) == 0 {
				log = C.GoString((*C.char)(buf))
			}
			C.free(buf)
		}
		return nil, fmt.Errorf("%w: %w\n%s", ErrCompile, err, log)
	}
	var n C.size_t
	if err := nvrtcResult("nvrtcGetCUBINSize", C.jf_nvrtcGetCUBINSize(prog, &n)); err != nil {
		return nil, err
	}
	img := C.malloc(n)
	defer C.free(img)
	if err := nvrtcResult("nvrtcGetCUBIN", C.jf_nvrtcGetCUBIN(prog, (*C.char)(img))); err != nil {
		return nil, err
	}
	return C.GoBytes(img, C.int(n)), nil
}

// The Go side of the driver: thin wrappers, so that no other file needs cgo.

type (
	cuDevice    = C.CUdevice
	cuContext   = C.CUcontext
	cuStream    = C.CUstream
	cuEvent     = C.CUevent
	cuModule    = C.CUmodule
	cuFunction  = C.CUfunction
	blasHandle  = C.cublasHandle_t
	cuGraph     = C.CUgraph
	cuGraphExec = C.CUgraphExec
)

func deviceCount() (int, error) {
	var n C.int
	err := cuResult("cuDeviceGetCount", C.jf_cuDeviceGetCount(&n))
	return int(n), err
}

func deviceGet(ordinal int) (cuDevice, error) {
	var d C.CUdevice
	err := cuResult("cuDeviceGet", C.jf_cuDeviceGet(&d, C.int(ordinal)))
	return d, err
}

func deviceName(d cuDevice) (string, error) {
	var name [256]C.char
	if err := cuResult("cuDeviceGetName", C.jf_cuDeviceGetName(&name[0], C.int(len(name)), d)); err != nil {
		return "", err
	}
	return C.GoString(&name[0]), nil
}

func deviceAttr(d cuDevice, attr int) (int, error) {
	var v C.int
	err := cuResult("cuDeviceGetAttribute", C.jf_cuDeviceGetAttribute(&v, C.int(attr), d))
	return int(v), err
}

func driverVersion() int {
	var v C.int
	C.jf_cuDriverGetVersion(&v)
	return int(v)
}

func primaryCtxRetain(d cuDevice) (cuContext, error) {
	var c C.CUcontext
	err := cuResult("cuDevicePrimaryCtxRetain", C.jf_cuDevicePrimaryCtxRetain(&c, d))
	return c, err
}

func primaryCtxRelease(d cuDevice) error {
	return cuResult("cuDevicePrimaryCtxRelease_v2", C.jf_cuDevicePrimaryCtxRelease_v2(d))
}

func ctxSetCurrent(c cuContext) error {
	return cuResult("cuCtxSetCurrent", C.jf_cuCtxSetCurrent(c))
}

func streamCreate() (cuStream, error) {
	const nonBlocking = 1
	var s C.CUstream
	err := cuResult("cuStreamCreate", C.jf_cuStreamCreate(&s, nonBlocking))
	return s, err
}

func streamDestroy(s cuStream) error {
	return cuResult("cuStreamDestroy_v2", C.jf_cuStreamDestroy_v2(s))
}

func streamSync(s cuStream) error {
	return cuResult("cuStreamSynchronize", C.jf_cuStreamSynchronize(s))
}

func eventCreate(timing bool) (cuEvent, error) {
	var flags C.uint = 2 // CU_EVENT_DISABLE_TIMING
	if timing {
		flags = 0
	}
	var e C.CUevent
	err := cuResult("cuEventCreate", C.jf_cuEventCreate(&e, flags))
	return e, err
}

func eventDestroy(e cuEvent) error {
	return cuResult("cuEventDestroy_v2", C.jf_cuEventDestroy_v2(e))
}

func eventRecord(e cuEvent, s cuStream) error {
	return cuResult("cuEventRecord", C.jf_cuEventRecord(e, s))
}

func eventSync(e cuEvent) error {
	return cuResult("cuEventSynchronize", C.jf_cuEventSynchronize(e))
}

// eventElapsed is the time between two recorded, completed events, in ms.
func eventElapsed(start, end cuEvent) (float32, error) {
	var ms C.float
	err := cuResult("cuEventElapsedTime", C.jf_cuEventElapsedTime_v2(&ms, start, end))
	return float32(ms), err
}

func memAlloc(n int) (uint64, error) {
	var p C.CUdeviceptr
	err := cuResult("cuMemAlloc_v2", C.jf_cuMemAlloc_v2(&p, C.size_t(n)))
	return uint64(p), err
}

func memFree(p uint64) error {
	return cuResult("cuMemFree_v2", C.jf_cuMemFree_v2(C.CUdeviceptr(p)))
}

func memInfo() (free, total int, err error) {
	var f, t C.size_t
	err = cuResult("cuMemGetInfo_v2", C.jf_cuMemGetInfo_v2(&f, &t))
	return int(f), int(t), err
}

func hostAlloc(n int) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	err := cuResult("cuMemHostAlloc", C.jf_cuMemHostAlloc(&p, C.size_t(n), 0))
	return p, err
}

func hostFree(p unsafe.Pointer) error {
	return cuResult("cuMemFreeHost", C.jf_cuMemFreeHost(p))
}

func memcpyHtoD(dst uint64, src unsafe.Pointer, n int, s cuStream) error {
	return cuResult("cuMemcpyHtoDAsync_v2", C.jf_cuMemcpyHtoDAsync_v2(C.CUdeviceptr(dst), src, C.size_t(n), s))
}

func memcpyDtoH(dst unsafe.Pointer, src uint64, n int, s cuStream) error {
	return cuResult("cuMemcpyDtoHAsync_v2", C.jf_cuMemcpyDtoHAsync_v2(dst, C.CUdeviceptr(src), C.size_t(n), s))
}

func memcpyDtoD(dst, src uint64, n int, s cuStream) error {
	return cuResult("cuMemcpyDtoDAsync_v2", C.jf_cuMemcpyDtoDAsync_v2(C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s))
}

func memsetD8(dst uint64, v byte, n int, s cuStream) error {
	return cuResult("cuMemsetD8Async", C.jf_cuMemsetD8Async(C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), s))
}

func moduleLoad(image []byte) (cuModule, error) {
	var m C.CUmodule
	err := cuResult("cuModuleLoadData", C.jf_cuModuleLoadData(&m, unsafe.Pointer(&image[0])))
	return m, err
}

func moduleUnload(m cuModule) error {
	return cuResult("cuModuleUnload", C.jf_cuModuleUnload(m))
}

func moduleFunction(m cuModule, name string) (cuFunction, error) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	var f C.CUfunction
	err := cuResult("cuModuleGetFunction", C.jf_cuModuleGetFunction(&f, m, cn))
	return f, err
}

func launch(f cuFunction, grid [3]uint32, block uint32, s cuStream, a *kargs) error {
	var blob *C.char
	var offs *C.int
	if len(a.offs) > 0 {
		if len(a.blob) == 0 {
			a.blob = append(a.blob, 0)
		}
		blob = (*C.char)(unsafe.Pointer(&a.blob[0]))
		offs = (*C.int)(unsafe.Pointer(&a.offs[0]))
	}
	return cuResult("cuLaunchKernel", C.jf_launch(f, C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]), C.uint(block), s, blob, offs, C.int(len(a.offs))))
}

func blasCreate() (blasHandle, error) {
	var h C.cublasHandle_t
	err := cublasResult("cublasCreate_v2", C.jf_cublasCreate_v2(&h))
	return h, err
}

func blasDestroy(h blasHandle) error {
	return cublasResult("cublasDestroy_v2", C.jf_cublasDestroy_v2(h))
}

func blasSetStream(h blasHandle, s cuStream) error {
	return cublasResult("cublasSetStream_v2", C.jf_cublasSetStream_v2(h, s))
}

func blasSetWorkspace(h blasHandle, p uint64, n int) error {
	return cublasResult("cublasSetWorkspace_v2", C.jf_set_workspace(h, C.CUdeviceptr(p), C.size_t(n)))
}

func blasVersion(h blasHandle) int {
	var v C.int
	C.jf_cublasGetVersion_v2(h, &v)
	return int(v)
}

// gemmArgs is one column-major GEMM, strided batched when count > 1:
// C = op(A)*op(B), or C += op(A)*op(B) with acc; op transposes A (B)
// where ta (tb) is set.
type gemmArgs struct {
	ta, tb, acc   bool
	m, n, k       int
	a, b, c       uint64
	lda, ldb, ldc int
	sa, sb, sc    int
	count         int
	dtype         int // cudaDataType of A, B and C
	compute       int // cublasComputeType_t
}

// gemm runs C = op(A)*op(B), plus C with acc.
func gemm(h blasHandle, g *gemmArgs) error {
	call := "cublasGemmEx"
	if g.count > 1 {
		call = "cublasGemmStridedBatchedEx"
	}
	flag := func(v bool) C.int {
		if v {
			return 1
		}
		return 0
	}
	return cublasResult(call, C.jf_gemm(h, flag(g.ta), flag(g.tb), flag(g.acc), C.int(g.m), C.int(g.n), C.int(g.k),
		C.CUdeviceptr(g.a), C.int(g.lda), C.longlong(g.sa), C.CUdeviceptr(g.b), C.int(g.ldb), C.longlong(g.sb),
		C.CUdeviceptr(g.c), C.int(g.ldc), C.longlong(g.sc), C.int(g.count), C.int(g.dtype), C.int(g.compute)))
}

// cudaDataType and cublasComputeType_t values.
const (
	dataF32  = 0
	dataF64  = 1
	dataF16  = 2
	dataBF16 = 14

	computeF32     = 68
	computeF64     = 70
	computeF32TF32 = 77
)

// captureRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED: the capture does not
// forbid calls that are unsafe during a capture on other threads.
const captureRelaxed = 2

func streamBeginCapture(s cuStream) error {
	return cuResult("cuStreamBeginCapture_v2", C.jf_cuStreamBeginCapture_v2(s, captureRelaxed))
}

func streamEndCapture(s cuStream) (cuGraph, error) {
	var g C.CUgraph
	err := cuResult("cuStreamEndCapture", C.jf_cuStreamEndCapture(s, &g))
	return g, err
}

func graphInstantiate(g cuGraph) (cuGraphExec, error) {
	var e C.CUgraphExec
	err := cuResult("cuGraphInstantiateWithFlags", C.jf_cuGraphInstantiateWithFlags(&e, g, 0))
	return e, err
}

func graphLaunch(e cuGraphExec, s cuStream) error {
	return cuResult("cuGraphLaunch", C.jf_cuGraphLaunch(e, s))
}

func graphExecDestroy(e cuGraphExec) error {
	return cuResult("cuGraphExecDestroy", C.jf_cuGraphExecDestroy(e))
}

func graphDestroy(g cuGraph) error {
	return cuResult("cuGraphDestroy", C.jf_cuGraphDestroy(g))
}
