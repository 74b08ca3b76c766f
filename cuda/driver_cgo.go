//go:build cgo

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

// Minimal declarations of the CUDA driver API and NVRTC. Only the types
// we need, as plain integers and opaque pointers; no CUDA header is used.
typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
typedef void* CUevent;
typedef void* CUgraph;
typedef void* CUgraphExec;
typedef unsigned long long CUdeviceptr;
typedef int nvrtcResult;
typedef void* nvrtcProgram;

typedef struct {
	void* h;
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuDriverGetVersion)(int*);
	CUresult (*cuGetErrorName)(CUresult, const char**);
	CUresult (*cuDeviceGetCount)(int*);
	CUresult (*cuDeviceGet)(CUdevice*, int);
	CUresult (*cuDeviceGetName)(char*, int, CUdevice);
	CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
	CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
	CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
	CUresult (*cuCtxSetCurrent)(CUcontext);
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuMemGetInfo)(size_t*, size_t*);
	CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
	CUresult (*cuMemFree)(CUdeviceptr);
	CUresult (*cuMemHostAlloc)(void**, size_t, unsigned int);
	CUresult (*cuMemFreeHost)(void*);
	CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
	CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult (*cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
	CUresult (*cuStreamCreate)(CUstream*, unsigned int);
	CUresult (*cuStreamDestroy)(CUstream);
	CUresult (*cuStreamSynchronize)(CUstream);
	CUresult (*cuEventCreate)(CUevent*, unsigned int);
	CUresult (*cuEventDestroy)(CUevent);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
	CUresult (*cuModuleLoadData)(CUmodule*, const void*);
	CUresult (*cuModuleUnload)(CUmodule);
	CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
	CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
	CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int,
		unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void**, void**);
	CUresult (*cuStreamBeginCapture)(CUstream, int);
	CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
	CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
	CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
	CUresult (*cuGraphDestroy)(CUgraph);
	CUresult (*cuGraphExecDestroy)(CUgraphExec);
	CUresult (*cuGraphGetNodes)(CUgraph, void*, size_t*);
	// Optional (driver 12.0+): NULL disables PDL launches.
	CUresult (*cuLaunchKernelEx)(const void*, CUfunction, void**, void**);
	// Optional (driver 12.0+): NULL disables the TMA kernels.
	CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned int, void*, const unsigned long long*,
		const unsigned long long*, const unsigned int*, const unsigned int*, int, int, int, int);
} mm_driver;

typedef struct {
	void* h;
	nvrtcResult (*nvrtcVersion)(int*, int*);
	const char* (*nvrtcGetErrorString)(nvrtcResult);
	nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int,
		const char* const*, const char* const*);
	nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
	nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
	nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
	nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
	nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*);
	nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
} mm_nvrtc;

// mm_sym resolves one symbol; on failure it copies the name into miss.
static void* mm_sym(void* h, const char* name, char* miss, size_t n) {
	void* p = dlsym(h, name);
	if (!p && miss[0] == 0) { strncpy(miss, name, n - 1); }
	return p;
}

// mm_open returns NULL and fills err with dlerror() text when path cannot be opened.
static void* mm_open(const char* path, char* err, size_t n) {
	void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { const char* e = dlerror(); strncpy(err, e ? e : "dlopen failed", n - 1); }
	return h;
}

#define SYM(d, field, name) d->field = (void*)mm_sym(d->h, name, miss, n)

static void mm_driver_bind(mm_driver* d, char* miss, size_t n) {
	SYM(d, cuInit, "cuInit");
	SYM(d, cuDriverGetVersion, "cuDriverGetVersion");
	SYM(d, cuGetErrorName, "cuGetErrorName");
	SYM(d, cuDeviceGetCount, "cuDeviceGetCount");
	SYM(d, cuDeviceGet, "cuDeviceGet");
	SYM(d, cuDeviceGetName, "cuDeviceGetName");
	SYM(d, cuDeviceGetAttribute, "cuDeviceGetAttribute");
	SYM(d, cuDeviceTotalMem, "cuDeviceTotalMem_v2");
	SYM(d, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(d, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
	SYM(d, cuCtxSetCurrent, "cuCtxSetCurrent");
	SYM(d, cuCtxSynchronize, "cuCtxSynchronize");
	SYM(d, cuMemGetInfo, "cuMemGetInfo_v2");
	SYM(d, cuMemAlloc, "cuMemAlloc_v2");
	SYM(d, cuMemFree, "cuMemFree_v2");
	SYM(d, cuMemHostAlloc, "cuMemHostAlloc");
	SYM(d, cuMemFreeHost, "cuMemFreeHost");
	SYM(d, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
	SYM(d, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
	SYM(d, cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
	SYM(d, cuMemsetD8Async, "cuMemsetD8Async");
	SYM(d, cuMemsetD32Async, "cuMemsetD32Async");
	SYM(d, cuStreamCreate, "cuStreamCreate");
	SYM(d, cuStreamDestroy, "cuStreamDestroy_v2");
	SYM(d, cuStreamSynchronize, "cuStreamSynchronize");
	SYM(d, cuEventCreate, "cuEventCreate");
	SYM(d, cuEventDestroy, "cuEventDestroy_v2");
	SYM(d, cuEventRecord, "cuEventRecord");
	SYM(d, cuStreamWaitEvent, "cuStreamWaitEvent");
	SYM(d, cuEventSynchronize, "cuEventSynchronize");
	SYM(d, cuEventElapsedTime, "cuEventElapsedTime");
	SYM(d, cuModuleLoadData, "cuModuleLoadData");
	SYM(d, cuModuleUnload, "cuModuleUnload");
	SYM(d, cuModuleGetFunction, "cuModuleGetFunction");
	SYM(d, cuFuncSetAttribute, "cuFuncSetAttribute");
	SYM(d, cuFuncGetAttribute, "cuFuncGetAttribute");
	SYM(d, cuLaunchKernel, "cuLaunchKernel");
	SYM(d, cuStreamBeginCapture, "cuStreamBeginCapture_v2");
	SYM(d, cuStreamEndCapture, "cuStreamEndCapture");
	SYM(d, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
	SYM(d, cuGraphLaunch, "cuGraphLaunch");
	SYM(d, cuGraphDestroy, "cuGraphDestroy");
	SYM(d, cuGraphExecDestroy, "cuGraphExecDestroy");
	SYM(d, cuGraphGetNodes, "cuGraphGetNodes");
	d->cuTensorMapEncodeTiled = dlsym(d->h, "cuTensorMapEncodeTiled");
	d->cuLaunchKernelEx = dlsym(d->h, "cuLaunchKernelEx");
}

static void mm_nvrtc_bind(mm_nvrtc* d, char* miss, size_t n) {
	SYM(d, nvrtcVersion, "nvrtcVersion");
	SYM(d, nvrtcGetErrorString, "nvrtcGetErrorString");
	SYM(d, nvrtcCreateProgram, "nvrtcCreateProgram");
	SYM(d, nvrtcCompileProgram, "nvrtcCompileProgram");
	SYM(d, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
	SYM(d, nvrtcGetProgramLog, "nvrtcGetProgramLog");
	SYM(d, nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
	SYM(d, nvrtcGetCUBIN, "nvrtcGetCUBIN");
	SYM(d, nvrtcGetPTXSize, "nvrtcGetPTXSize");
	SYM(d, nvrtcGetPTX, "nvrtcGetPTX");
	SYM(d, nvrtcDestroyProgram, "nvrtcDestroyProgram");
}

// Wrappers. Handles cross the boundary as uintptr_t so Go never converts
// integers to unsafe.Pointer. Context-bound wrappers make ctx current on the
// calling OS thread first, because goroutines move between threads.
typedef uintptr_t H;
#define CTX(d, ctx) do { CUresult r_ = d->cuCtxSetCurrent((CUcontext)(ctx)); if (r_) return r_; } while (0)

static CUresult mmInit(mm_driver* d) { return d->cuInit(0); }
static CUresult mmDriverVersion(mm_driver* d, int* v) { return d->cuDriverGetVersion(v); }
static CUresult mmDeviceCount(mm_driver* d, int* n) { return d->cuDeviceGetCount(n); }
static CUresult mmDeviceGet(mm_driver* d, int* dev, int ord) { return d->cuDeviceGet(dev, ord); }
static CUresult mmDeviceName(mm_driver* d, char* buf, int n, int dev) { return d->cuDeviceGetName(buf, n, dev); }
static CUresult mmDeviceAttr(mm_driver* d, int* v, int a, int dev) { return d->cuDeviceGetAttribute(v, a, dev); }
static CUresult mmDeviceTotalMem(mm_driver* d, size_t* v, int dev) { return d->cuDeviceTotalMem(v, dev); }
static CUresult mmPrimaryRetain(mm_driver* d, H* c, int dev) { CUcontext x = 0; CUresult r = d->cuDevicePrimaryCtxRetain(&x, dev); *c = (H)x; return r; }
static CUresult mmPrimaryRelease(mm_driver* d, int dev) { return d->cuDevicePrimaryCtxRelease(dev); }

static CUresult w_ctxSync(mm_driver* d, H c) { CTX(d, c); return d->cuCtxSynchronize(); }
static CUresult w_memGetInfo(mm_driver* d, H c, size_t* f, size_t* t) { CTX(d, c); return d->cuMemGetInfo(f, t); }
static CUresult w_memAlloc(mm_driver* d, H c, CUdeviceptr* p, size_t n) { CTX(d, c); return d->cuMemAlloc(p, n); }
static CUresult w_memFree(mm_driver* d, H c, CUdeviceptr p) { CTX(d, c); return d->cuMemFree(p); }
static CUresult w_memHostAlloc(mm_driver* d, H c, void** p, size_t n, unsigned int fl) { CTX(d, c); return d->cuMemHostAlloc(p, n, fl); }
static CUresult w_memFreeHost(mm_driver* d, H c, void* p) { CTX(d, c); return d->cuMemFreeHost(p); }
static CUresult w_htod(mm_driver* d, H c, CUdeviceptr dst, const void* src, size_t n, H s) { CTX(d, c); return d->cuMemcpyHtoDAsync(dst, src, n, (CUstream)s); }
static CUresult w_dtoh(mm_driver* d, H c, void* dst, CUdeviceptr src, size_t n, H s) { CTX(d, c); return d->cuMemcpyDtoHAsync(dst, src, n, (CUstream)s); }
static CUresult w_dtod(mm_driver* d, H c, CUdeviceptr dst, CUdeviceptr src, size_t n, H s) { CTX(d, c); return d->cuMemcpyDtoDAsync(dst, src, n, (CUstream)s); }
static CUresult w_memset8(mm_driver* d, H c, CUdeviceptr dst, unsigned char v, size_t n, H s) { CTX(d, c); return d->cuMemsetD8Async(dst, v, n, (CUstream)s); }
static CUresult w_memset32(mm_driver* d, H c, CUdeviceptr dst, unsigned int v, size_t n, H s) { CTX(d, c); return d->cuMemsetD32Async(dst, v, n, (CUstream)s); }
static CUresult w_streamCreate(mm_driver* d, H c, H* s, unsigned int fl) { CTX(d, c); CUstream x = 0; CUresult r = d->cuStreamCreate(&x, fl); *s = (H)x; return r; }
static CUresult w_streamDestroy(mm_driver* d, H c, H s) { CTX(d, c); return d->cuStreamDestroy((CUstream)s); }
static CUresult w_streamSync(mm_driver* d, H c, H s) { CTX(d, c); return d->cuStreamSynchronize((CUstream)s); }
static CUresult w_eventCreate(mm_driver* d, H c, H* e, unsigned int fl) { CTX(d, c); CUevent x = 0; CUresult r = d->cuEventCreate(&x, fl); *e = (H)x; return r; }
static CUresult w_eventDestroy(mm_driver* d, H c, H e) { CTX(d, c); return d->cuEventDestroy((CUevent)e); }
static CUresult w_eventRecord(mm_driver* d, H c, H e, H s) { CTX(d, c); return d->cuEventRecord((CUevent)e, (CUstream)s); }
static CUresult w_streamWaitEvent(mm_driver* d, H c, H s, H e) { CTX(d, c); return d->cuStreamWaitEvent((CUstream)s, (CUevent)e, 0); }
static CUresult w_eventSync(mm_driver* d, H c, H e) { CTX(d, c); return d->cuEventSynchronize((CUevent)e); }
static CUresult w_eventElapsed(mm_driver* d, H c, float* ms, H a, H b) { CTX(d, c); return d->cuEventElapsedTime(ms, (CUevent)a, (CUevent)b); }
static CUresult w_moduleLoad(mm_driver* d, H c, H* m, const void* img) { CTX(d, c); CUmodule x = 0; CUresult r = d->cuModuleLoadData(&x, img); *m = (H)x; return r; }
static CUresult w_moduleUnload(mm_driver* d, H c, H m) { CTX(d, c); return d->cuModuleUnload((CUmodule)m); }
static CUresult w_moduleGetFunction(mm_driver* d, H c, H* f, H m, const char* name) { CTX(d, c); CUfunction x = 0; CUresult r = d->cuModuleGetFunction(&x, (CUmodule)m, name); *f = (H)x; return r; }
static CUresult w_funcSetAttr(mm_driver* d, H c, H f, int a, int v) { CTX(d, c); return d->cuFuncSetAttribute((CUfunction)f, a, v); }
static CUresult w_funcGetAttr(mm_driver* d, H c, int* v, int a, H f) { CTX(d, c); return d->cuFuncGetAttribute(v, a, (CUfunction)f); }
static CUresult w_beginCapture(mm_driver* d, H c, H s, int mode) { CTX(d, c); return d->cuStreamBeginCapture((CUstream)s, mode); }
static CUresult w_endCapture(mm_driver* d, H c, H s, H* g) { CTX(d, c); CUgraph x = 0; CUresult r = d->cuStreamEndCapture((CUstream)s, &x); *g = (H)x; return r; }
static CUresult w_graphInstantiate(mm_driver* d, H c, H* e, H g) { CTX(d, c); CUgraphExec x = 0; CUresult r = d->cuGraphInstantiateWithFlags(&x, (CUgraph)g, 0); *e = (H)x; return r; }
static CUresult w_graphLaunch(mm_driver* d, H c, H e, H s) { CTX(d, c); return d->cuGraphLaunch((CUgraphExec)e, (CUstream)s); }
static CUresult w_graphDestroy(mm_driver* d, H c, H g) { CTX(d, c); return d->cuGraphDestroy((CUgraph)g); }
// w_tensorMap2D encodes a rank-2 tiled tensor map (no context needed);
// 1 (CUDA_ERROR_INVALID_VALUE) without the entry point.
static CUresult w_tensorMap2D(mm_driver* d, H c, void* out, int dtype, CUdeviceptr addr,
		unsigned long long inner, unsigned long long outer, unsigned long long stride,
		unsigned int boxInner, unsigned int boxOuter, int swizzle) {
	if (!d->cuTensorMapEncodeTiled) return (CUresult)1;
	CTX(d, c); // the driver checks for a current context on this thread
	unsigned long long dims[2] = {inner, outer}, strides[1] = {stride};
	unsigned int box[2] = {boxInner, boxOuter}, es[2] = {1, 1};
	// interleave none, L2 promotion 256B, out-of-bounds elements read as zero.
	return d->cuTensorMapEncodeTiled(out, dtype, 2, (void*)addr, dims, strides, box, es, 0, swizzle, 3, 0);
}

// w_tensorMap3D is w_tensorMap2D at rank 3: dims innermost first, strides
// (bytes) of dimensions 1 and 2.
static CUresult w_tensorMap3D(mm_driver* d, H c, void* out, int dtype, CUdeviceptr addr,
		unsigned long long d0, unsigned long long d1, unsigned long long d2,
		unsigned long long s1, unsigned long long s2,
		unsigned int b0, unsigned int b1, unsigned int b2, int swizzle) {
	if (!d->cuTensorMapEncodeTiled) return (CUresult)1;
	CTX(d, c);
	unsigned long long dims[3] = {d0, d1, d2}, strides[2] = {s1, s2};
	unsigned int box[3] = {b0, b1, b2}, es[3] = {1, 1, 1};
	return d->cuTensorMapEncodeTiled(out, dtype, 3, (void*)addr, dims, strides, box, es, 0, swizzle, 3, 0);
}

static CUresult w_graphNodes(mm_driver* d, H c, H g, size_t* n) { CTX(d, c); *n = 0; return d->cuGraphGetNodes((CUgraph)g, NULL, n); }
static CUresult w_graphExecDestroy(mm_driver* d, H c, H e) { CTX(d, c); return d->cuGraphExecDestroy((CUgraphExec)e); }

// CUlaunchAttribute and CUlaunchConfig of cuda.h (12.0+), spelled out: an
// int id padded to 8 bytes, a 64-byte value union; the config's fields in
// cuda.h order.
typedef struct { int id; int pad; union { char raw[64]; int i; } value; } mm_launch_attr;
typedef struct {
	unsigned int gx, gy, gz, bx, by, bz, smem;
	CUstream stream;
	mm_launch_attr* attrs;
	unsigned int nattrs;
} mm_launch_config;

// w_launch passes the kernel parameters as an array of pointers into the
// packed argument block (offs[i] = byte offset of parameter i). The array is
// built here on the C stack, so Go only hands over plain byte memory. Unlike
// CU_LAUNCH_PARAM_BUFFER_POINTER, kernelParams are copied into captured graph
// nodes, so graphs replay with the captured values.
static CUresult w_launch(mm_driver* d, H c, H f,
		unsigned int gx, unsigned int gy, unsigned int gz,
		unsigned int bx, unsigned int by, unsigned int bz,
		unsigned int smem, H s, void* args, const int* offs, int nargs, int pdl) {
	CTX(d, c);
	void* params[64];
	if (nargs > 64) return (CUresult)1; // CUDA_ERROR_INVALID_VALUE
	for (int i = 0; i < nargs; i++) params[i] = (char*)args + offs[i];
	if (pdl && d->cuLaunchKernelEx) {
		mm_launch_attr a;
		memset(&a, 0, sizeof a);
		a.id = 6; // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
		a.value.i = 1;
		mm_launch_config cfg = {gx, gy, gz, bx, by, bz, smem, (CUstream)s, &a, 1};
		return d->cuLaunchKernelEx(&cfg, (CUfunction)f, nargs ? params : NULL, NULL);
	}
	return d->cuLaunchKernel((CUfunction)f, gx, gy, gz, bx, by, bz, smem, (CUstream)s, nargs ? params : NULL, NULL);
}

static const char* w_errorName(mm_driver* d, CUresult r) {
	const char* s = NULL;
	if (d->cuGetErrorName(r, &s) != 0 || s == NULL) return NULL;
	return s;
}

static nvrtcResult mmNvrtcVersion(mm_nvrtc* n, int* a, int* b) { return n->nvrtcVersion(a, b); }
static const char* mmNvrtcErr(mm_nvrtc* n, nvrtcResult r) { const char* s = n->nvrtcGetErrorString(r); return s ? s : "NVRTC_ERROR"; }
static nvrtcResult mmNvrtcCreate(mm_nvrtc* n, H* p, const char* src, const char* name, int nh, char** hs, char** inc) {
	nvrtcProgram x = 0; nvrtcResult r = n->nvrtcCreateProgram(&x, src, name, nh, (const char* const*)hs, (const char* const*)inc); *p = (H)x; return r; }
static nvrtcResult mmNvrtcDestroy(mm_nvrtc* n, H p) { nvrtcProgram x = (nvrtcProgram)p; return n->nvrtcDestroyProgram(&x); }
static nvrtcResult mmNvrtcCompile(mm_nvrtc* n, H p, int no, char** opts) { return n->nvrtcCompileProgram((nvrtcProgram)p, no, (const char* const*)opts); }
static nvrtcResult mmNvrtcLogSize(mm_nvrtc* n, H p, size_t* s) { return n->nvrtcGetProgramLogSize((nvrtcProgram)p, s); }
static nvrtcResult mmNvrtcLog(mm_nvrtc* n, H p, char* b) { return n->nvrtcGetProgramLog((nvrtcProgram)p, b); }
static nvrtcResult mmNvrtcCubinSize(mm_nvrtc* n, H p, size_t* s) { return n->nvrtcGetCUBINSize((nvrtcProgram)p, s); }
static nvrtcResult mmNvrtcCubin(mm_nvrtc* n, H p, char* b) { return n->nvrtcGetCUBIN((nvrtcProgram)p, b); }
static nvrtcResult mmNvrtcPTXSize(mm_nvrtc* n, H p, size_t* s) { return n->nvrtcGetPTXSize((nvrtcProgram)p, s); }
static nvrtcResult mmNvrtcPTX(mm_nvrtc* n, H p, char* b) { return n->nvrtcGetPTX((nvrtcProgram)p, b); }
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// Shared libraries tried in order; MEGAMOE_LIBCUDA / MEGAMOE_NVRTC override.
var (
	driverLibs = []string{"libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}
	nvrtcLibs  = []string{
		"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
		"/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so",
	}
)

func dlopenFirst(env string, names []string) (unsafe.Pointer, string, error) {
	if p := os.Getenv(env); p != "" {
		names = append([]string{p}, names...)
	}
	var errs []string
	for _, name := range names {
		cname := C.CString(name)
		var ebuf [512]C.char
		h := C.mm_open(cname, &ebuf[0], C.size_t(len(ebuf)))
		C.free(unsafe.Pointer(cname))
		if h != nil {
			return h, name, nil
		}
		errs = append(errs, C.GoString(&ebuf[0]))
	}
	return nil, "", fmt.Errorf("dlopen: %s", strings.Join(errs, "; "))
}

type cgoDriver struct {
	d    *C.mm_driver // C memory: the table is read by C code on every call
	path string
}

func openDriver() (driverAPI, error) {
	h, path, err := dlopenFirst("MEGAMOE_LIBCUDA", driverLibs)
	if err != nil {
		return nil, fmt.Errorf("load CUDA driver: %w", err)
	}
	d := (*C.mm_driver)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mm_driver{}))))
	d.h = h
	var miss [128]C.char
	C.mm_driver_bind(d, &miss[0], C.size_t(len(miss)))
	if miss[0] != 0 {
		return nil, fmt.Errorf("load CUDA driver %s: missing symbol %s", path, C.GoString(&miss[0]))
	}
	return &cgoDriver{d: d, path: path}, nil
}

func (g *cgoDriver) libPath() string { return g.path }

func (g *cgoDriver) errorName(r int) string {
	s := C.w_errorName(g.d, C.CUresult(r))
	if s == nil {
		return fmt.Sprintf("CUDA_ERROR_%d", r)
	}
	return C.GoString(s)
}

func h(x uintptr) C.H { return C.H(x) }

func (g *cgoDriver) init() int { return int(C.mmInit(g.d)) }

func (g *cgoDriver) driverVersion() (int, int) {
	var v C.int
	r := C.mmDriverVersion(g.d, &v)
	return int(v), int(r)
}

func (g *cgoDriver) deviceCount() (int, int) {
	var n C.int
	r := C.mmDeviceCount(g.d, &n)
	return int(n), int(r)
}

func (g *cgoDriver) deviceGet(ord int) (int, int) {
	var dev C.int
	r := C.mmDeviceGet(g.d, &dev, C.int(ord))
	return int(dev), int(r)
}

func (g *cgoDriver) deviceName(dev int) (string, int) {
	var buf [256]C.char
	r := C.mmDeviceName(g.d, &buf[0], C.int(len(buf)), C.int(dev))
	return C.GoString(&buf[0]), int(r)
}

func (g *cgoDriver) deviceAttr(attr, dev int) (int, int) {
	var v C.int
	r := C.mmDeviceAttr(g.d, &v, C.int(attr), C.int(dev))
	return int(v), int(r)
}

func (g *cgoDriver) deviceTotalMem(dev int) (uint64, int) {
	var v C.size_t
	r := C.mmDeviceTotalMem(g.d, &v, C.int(dev))
	return uint64(v), int(r)
}

func (g *cgoDriver) primaryCtxRetain(dev int) (uintptr, int) {
	var c C.H
	r := C.mmPrimaryRetain(g.d, &c, C.int(dev))
	return uintptr(c), int(r)
}

func (g *cgoDriver) primaryCtxRelease(dev int) int {
	return int(C.mmPrimaryRelease(g.d, C.int(dev)))
}

func (g *cgoDriver) ctxSynchronize(c uintptr) int { return int(C.w_ctxSync(g.d, h(c))) }

func (g *cgoDriver) memGetInfo(c uintptr) (uint64, uint64, int) {
	var f, t C.size_t
	r := C.w_memGetInfo(g.d, h(c), &f, &t)
	return uint64(f), uint64(t), int(r)
}

func (g *cgoDriver) memAlloc(c uintptr, n int) (DevicePtr, int) {
	var p C.CUdeviceptr
	r := C.w_memAlloc(g.d, h(c), &p, C.size_t(n))
	return DevicePtr(p), int(r)
}

func (g *cgoDriver) memFree(c uintptr, p DevicePtr) int {
	return int(C.w_memFree(g.d, h(c), C.CUdeviceptr(p)))
}

func (g *cgoDriver) memHostAlloc(c uintptr, n int) (unsafe.Pointer, int) {
	var p unsafe.Pointer
	r := C.w_memHostAlloc(g.d, h(c), &p, C.size_t(n), 0)
	return p, int(r)
}

func (g *cgoDriver) memFreeHost(c uintptr, p unsafe.Pointer) int {
	return int(C.w_memFreeHost(g.d, h(c), p))
}

func (g *cgoDriver) memcpyHtoD(c uintptr, dst DevicePtr, src unsafe.Pointer, n int, s uintptr) int {
	return int(C.w_htod(g.d, h(c), C.CUdeviceptr(dst), src, C.size_t(n), h(s)))
}

func (g *cgoDriver) memcpyDtoH(c uintptr, dst unsafe.Pointer, src DevicePtr, n int, s uintptr) int {
	return int(C.w_dtoh(g.d, h(c), dst, C.CUdeviceptr(src), C.size_t(n), h(s)))
}

func (g *cgoDriver) memcpyDtoD(c uintptr, dst, src DevicePtr, n int, s uintptr) int {
	return int(C.w_dtod(g.d, h(c), C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), h(s)))
}

func (g *cgoDriver) memsetD8(c uintptr, dst DevicePtr, v byte, n int, s uintptr) int {
	return int(C.w_memset8(g.d, h(c), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), h(s)))
}

func (g *cgoDriver) memsetD32(c uintptr, dst DevicePtr, v uint32, n int, s uintptr) int {
	return int(C.w_memset32(g.d, h(c), C.CUdeviceptr(dst), C.uint(v), C.size_t(n), h(s)))
}

func (g *cgoDriver) streamCreate(c uintptr, flags uint32) (uintptr, int) {
	var s C.H
	r := C.w_streamCreate(g.d, h(c), &s, C.uint(flags))
	return uintptr(s), int(r)
}

func (g *cgoDriver) streamDestroy(c, s uintptr) int { return int(C.w_streamDestroy(g.d, h(c), h(s))) }

func (g *cgoDriver) streamSynchronize(c, s uintptr) int { return int(C.w_streamSync(g.d, h(c), h(s))) }

func (g *cgoDriver) eventCreate(c uintptr, flags uint32) (uintptr, int) {
	var e C.H
	r := C.w_eventCreate(g.d, h(c), &e, C.uint(flags))
	return uintptr(e), int(r)
}

func (g *cgoDriver) eventDestroy(c, e uintptr) int { return int(C.w_eventDestroy(g.d, h(c), h(e))) }

func (g *cgoDriver) eventRecord(c, e, s uintptr) int {
	return int(C.w_eventRecord(g.d, h(c), h(e), h(s)))
}

func (g *cgoDriver) streamWaitEvent(c, s, e uintptr) int {
	return int(C.w_streamWaitEvent(g.d, h(c), h(s), h(e)))
}

func (g *cgoDriver) eventSynchronize(c, e uintptr) int { return int(C.w_eventSync(g.d, h(c), h(e))) }

func (g *cgoDriver) eventElapsed(c, start, end uintptr) (float32, int) {
	var ms C.float
	r := C.w_eventElapsed(g.d, h(c), &ms, h(start), h(end))
	return float32(ms), int(r)
}

func (g *cgoDriver) moduleLoadData(c uintptr, image []byte) (uintptr, int) {
	// Copy the CUBIN into C memory: the driver wants an aligned image.
	buf := C.malloc(C.size_t(len(image)))
	defer C.free(buf)
	C.memcpy(buf, unsafe.Pointer(&image[0]), C.size_t(len(image)))
	var m C.H
	r := C.w_moduleLoad(g.d, h(c), &m, buf)
	return uintptr(m), int(r)
}

func (g *cgoDriver) moduleUnload(c, m uintptr) int { return int(C.w_moduleUnload(g.d, h(c), h(m))) }

func (g *cgoDriver) moduleGetFunction(c, m uintptr, name string) (uintptr, int) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var f C.H
	r := C.w_moduleGetFunction(g.d, h(c), &f, h(m), cname)
	return uintptr(f), int(r)
}

func (g *cgoDriver) funcSetAttribute(c, f uintptr, attr, v int) int {
	return int(C.w_funcSetAttr(g.d, h(c), h(f), C.int(attr), C.int(v)))
}

func (g *cgoDriver) funcGetAttribute(c, f uintptr, attr int) (int, int) {
	var v C.int
	r := C.w_funcGetAttr(g.d, h(c), &v, C.int(attr), h(f))
	return int(v), int(r)
}

func (g *cgoDriver) launch(c, f uintptr, grid, block Dim3, smem int, s uintptr, args []uint64, offs []int32, pdl bool) int {
	var p unsafe.Pointer
	var o *C.int
	if len(offs) > 0 {
		p = unsafe.Pointer(&args[0])
		o = (*C.int)(unsafe.Pointer(&offs[0]))
	}
	return int(C.w_launch(g.d, h(c), h(f),
		C.uint(grid.X), C.uint(grid.Y), C.uint(grid.Z),
		C.uint(block.X), C.uint(block.Y), C.uint(block.Z),
		C.uint(smem), h(s), p, o, C.int(len(offs)), C.int(b2i(pdl))))
}

func (g *cgoDriver) beginCapture(c, s uintptr, mode int) int {
	return int(C.w_beginCapture(g.d, h(c), h(s), C.int(mode)))
}

func (g *cgoDriver) endCapture(c, s uintptr) (uintptr, int) {
	var gr C.H
	r := C.w_endCapture(g.d, h(c), h(s), &gr)
	return uintptr(gr), int(r)
}

func (g *cgoDriver) graphInstantiate(c, gr uintptr) (uintptr, int) {
	var e C.H
	r := C.w_graphInstantiate(g.d, h(c), &e, h(gr))
	return uintptr(e), int(r)
}

func (g *cgoDriver) graphLaunch(c, e, s uintptr) int {
	return int(C.w_graphLaunch(g.d, h(c), h(e), h(s)))
}

func (g *cgoDriver) graphDestroy(c, gr uintptr) int { return int(C.w_graphDestroy(g.d, h(c), h(gr))) }

func (g *cgoDriver) graphExecDestroy(c, e uintptr) int {
	return int(C.w_graphExecDestroy(g.d, h(c), h(e)))
}

// ---- NVRTC ----

type cgoNVRTC struct {
	n    *C.mm_nvrtc
	path string
}

func openNVRTC() (nvrtcAPI, error) {
	hd, path, err := dlopenFirst("MEGAMOE_NVRTC", nvrtcLibs)
	if err != nil {
		return nil, fmt.Errorf("load NVRTC: %w", err)
	}
	n := (*C.mm_nvrtc)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mm_nvrtc{}))))
	n.h = hd
	var miss [128]C.char
	C.mm_nvrtc_bind(n, &miss[0], C.size_t(len(miss)))
	if miss[0] != 0 {
		return nil, fmt.Errorf("load NVRTC %s: missing symbol %s", path, C.GoString(&miss[0]))
	}
	return &cgoNVRTC{n: n, path: path}, nil
}

func (v *cgoNVRTC) libPath() string { return v.path }

func (v *cgoNVRTC) version() (int, int) {
	var major, minor C.int
	C.mmNvrtcVersion(v.n, &major, &minor)
	return int(major), int(minor)
}

func (v *cgoNVRTC) errString(r int) string { return C.GoString(C.mmNvrtcErr(v.n, C.nvrtcResult(r))) }

// compile runs one NVRTC compilation. It returns the CUBIN, the program log,
// and on failure the failing call and its result code.
func (v *cgoNVRTC) compile(src, name string, headers, includeNames, opts []string) ([]byte, string, string, int) {
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	cs := func(s string) *C.char {
		p := C.CString(s)
		frees = append(frees, unsafe.Pointer(p))
		return p
	}
	// Arrays of C strings live in C memory too.
	arr := func(ss []string) **C.char {
		if len(ss) == 0 {
			return nil
		}
		a := (**C.char)(C.malloc(C.size_t(len(ss)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
		frees = append(frees, unsafe.Pointer(a))
		view := unsafe.Slice(a, len(ss))
		for i, s := range ss {
			view[i] = cs(s)
		}
		return a
	}
	csrc, cname := cs(src), cs(name)
	hdrs, incs, copts := arr(headers), arr(includeNames), arr(opts)
	var prog C.H
	if r := C.mmNvrtcCreate(v.n, &prog, csrc, cname, C.int(len(headers)), hdrs, incs); r != 0 {
		return nil, "", "nvrtcCreateProgram", int(r)
	}
	defer C.mmNvrtcDestroy(v.n, prog)
	cr := C.mmNvrtcCompile(v.n, prog, C.int(len(opts)), copts)
	var logSize C.size_t
	log := ""
	if C.mmNvrtcLogSize(v.n, prog, &logSize) == 0 && logSize > 1 {
		buf := C.malloc(logSize)
		C.mmNvrtcLog(v.n, prog, (*C.char)(buf))
		log = C.GoString((*C.char)(buf))
		C.free(buf)
	}
	if cr != 0 {
		return nil, log, "nvrtcCompileProgram", int(cr)
	}
	var size C.size_t
	if ptxTarget(opts) {
		// A virtual target (compute_XX) has PTX and no CUBIN: the emulator runs it.
		if r := C.mmNvrtcPTXSize(v.n, prog, &size); r != 0 {
			return nil, log, "nvrtcGetPTXSize", int(r)
		}
		buf := C.malloc(size)
		defer C.free(buf)
		if r := C.mmNvrtcPTX(v.n, prog, (*C.char)(buf)); r != 0 {
			return nil, log, "nvrtcGetPTX", int(r)
		}
		return C.GoBytes(buf, C.int(size)), log, "", 0
	}
	if r := C.mmNvrtcCubinSize(v.n, prog, &size); r != 0 {
		return nil, log, "nvrtcGetCUBINSize", int(r)
	}
	buf := C.malloc(size)
	defer C.free(buf)
	if r := C.mmNvrtcCubin(v.n, prog, (*C.char)(buf)); r != 0 {
		return nil, log, "nvrtcGetCUBIN", int(r)
	}
	return C.GoBytes(buf, C.int(size)), log, "", 0
}

func (g *cgoDriver) hasTensorMaps() bool { return g.d.cuTensorMapEncodeTiled != nil }

func (g *cgoDriver) hasLaunchEx() bool { return g.d.cuLaunchKernelEx != nil }

func (g *cgoDriver) tensorMap2D(c uintptr, out *TensorMap, dtype int, addr DevicePtr, inner, outer, stride uint64, boxInner, boxOuter uint32, swizzle int) int {
	return int(C.w_tensorMap2D(g.d, h(c), unsafe.Pointer(&out[0]), C.int(dtype), C.CUdeviceptr(addr),
		C.ulonglong(inner), C.ulonglong(outer), C.ulonglong(stride), C.uint(boxInner), C.uint(boxOuter), C.int(swizzle)))
}

func (g *cgoDriver) tensorMap3D(c uintptr, out *TensorMap, dtype int, addr DevicePtr, dims [3]uint64, strides [2]uint64, box [3]uint32, swizzle int) int {
	return int(C.w_tensorMap3D(g.d, h(c), unsafe.Pointer(&out[0]), C.int(dtype), C.CUdeviceptr(addr),
		C.ulonglong(dims[0]), C.ulonglong(dims[1]), C.ulonglong(dims[2]), C.ulonglong(strides[0]), C.ulonglong(strides[1]),
		C.uint(box[0]), C.uint(box[1]), C.uint(box[2]), C.int(swizzle)))
}

func (g *cgoDriver) graphNodes(c, gr uintptr) (int, int) {
	var n C.size_t
	r := C.w_graphNodes(g.d, h(c), h(gr), &n)
	return int(n), int(r)
}
