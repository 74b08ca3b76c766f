//go:build cgo

package cuda

/*
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

// Minimal NCCL declarations (no header): results and enums as ints,
// communicators and streams as opaque pointers.
typedef int ncclResult_t;
typedef void* ncclComm_t;
typedef unsigned long long CUdeviceptrN;
typedef uintptr_t HN;
enum { ncclFloat32_ = 7, ncclSum_ = 0 };

typedef struct {
	void* h;
	ncclResult_t (*ncclGetVersion)(int*);
	const char* (*ncclGetErrorString)(ncclResult_t);
	ncclResult_t (*ncclCommInitAll)(ncclComm_t*, int, const int*);
	ncclResult_t (*ncclCommDestroy)(ncclComm_t);
	ncclResult_t (*ncclCommAbort)(ncclComm_t);
	ncclResult_t (*ncclAllReduce)(const void*, void*, size_t, int, int, ncclComm_t, void*);
	ncclResult_t (*ncclAllGather)(const void*, void*, size_t, int, ncclComm_t, void*);
} mm_nccl;

#define NSYM(d, f, name) do { *(void**)(&(d)->f) = dlsym((d)->h, name); \
	if (!(d)->f && !miss[0]) { strncpy(miss, name, n - 1); miss[n - 1] = 0; } } while (0)

static void mm_nccl_bind(mm_nccl* d, char* miss, size_t n) {
	NSYM(d, ncclGetVersion, "ncclGetVersion");
	NSYM(d, ncclGetErrorString, "ncclGetErrorString");
	NSYM(d, ncclCommInitAll, "ncclCommInitAll");
	NSYM(d, ncclCommDestroy, "ncclCommDestroy");
	NSYM(d, ncclCommAbort, "ncclCommAbort");
	NSYM(d, ncclAllReduce, "ncclAllReduce");
	NSYM(d, ncclAllGather, "ncclAllGather");
}

static ncclResult_t mmNcclVersion(mm_nccl* d, int* v) { return d->ncclGetVersion(v); }
static const char* mmNcclErr(mm_nccl* d, ncclResult_t r) { const char* s = d->ncclGetErrorString(r); return s ? s : "NCCL_ERROR"; }
static ncclResult_t mmNcclInitAll(mm_nccl* d, HN* out, int n, const int* devs) {
	ncclComm_t cs[64];
	if (n > 64) return 4; // ncclInvalidArgument
	ncclResult_t r = d->ncclCommInitAll(cs, n, devs);
	for (int i = 0; i < n; i++) out[i] = r ? 0 : (HN)cs[i];
	return r;
}
static ncclResult_t mmNcclDestroy(mm_nccl* d, HN c) { return d->ncclCommDestroy((ncclComm_t)c); }
static ncclResult_t mmNcclAbort(mm_nccl* d, HN c) { return d->ncclCommAbort((ncclComm_t)c); }
static ncclResult_t mmNcclAllReduce(mm_nccl* d, CUdeviceptrN s, CUdeviceptrN r, size_t n, HN c, HN st) {
	return d->ncclAllReduce((const void*)(uintptr_t)s, (void*)(uintptr_t)r, n, ncclFloat32_, ncclSum_, (ncclComm_t)c, (void*)st); }
static ncclResult_t mmNcclAllGather(mm_nccl* d, CUdeviceptrN s, CUdeviceptrN r, size_t n, HN c, HN st) {
	return d->ncclAllGather((const void*)(uintptr_t)s, (void*)(uintptr_t)r, n, ncclFloat32_, (ncclComm_t)c, (void*)st); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

var ncclLibs = []string{"libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2", "libnccl.so"}

type cgoNCCL struct {
	d    *C.mm_nccl
	path string
}

func openNCCL() (ncclAPI, error) {
	hd, path, err := dlopenFirst("MEGAMOE_NCCL", ncclLibs)
	if err != nil {
		return nil, fmt.Errorf("load NCCL: %w", err)
	}
	d := (*C.mm_nccl)(C.calloc(1, C.size_t(unsafe.Sizeof(C.mm_nccl{}))))
	d.h = hd
	var miss [128]C.char
	C.mm_nccl_bind(d, &miss[0], C.size_t(len(miss)))
	if miss[0] != 0 {
		return nil, fmt.Errorf("load NCCL %s: missing symbol %s", path, C.GoString(&miss[0]))
	}
	return &cgoNCCL{d: d, path: path}, nil
}

func (n *cgoNCCL) libPath() string { return n.path }

func (n *cgoNCCL) version() (int, int) {
	var v C.int
	r := C.mmNcclVersion(n.d, &v)
	return int(v), int(r)
}

func (n *cgoNCCL) errString(r int) string { return C.GoString(C.mmNcclErr(n.d, C.ncclResult_t(r))) }

func (n *cgoNCCL) commInitAll(devs []int) ([]uintptr, int) {
	if len(devs) > 64 {
		return nil, 4
	}
	cd := make([]C.int, len(devs))
	for i, d := range devs {
		cd[i] = C.int(d)
	}
	out := make([]C.HN, len(devs))
	r := C.mmNcclInitAll(n.d, &out[0], C.int(len(devs)), &cd[0])
	hs := make([]uintptr, len(devs))
	for i := range out {
		hs[i] = uintptr(out[i])
	}
	return hs, int(r)
}

func (n *cgoNCCL) commDestroy(c uintptr) int { return int(C.mmNcclDestroy(n.d, C.HN(c))) }
func (n *cgoNCCL) commAbort(c uintptr) int   { return int(C.mmNcclAbort(n.d, C.HN(c))) }

func (n *cgoNCCL) allReduceSumF32(send, recv DevicePtr, count int, c, s uintptr) int {
	return int(C.mmNcclAllReduce(n.d, C.CUdeviceptrN(send), C.CUdeviceptrN(recv), C.size_t(count), C.HN(c), C.HN(s)))
}

func (n *cgoNCCL) allGatherF32(send, recv DevicePtr, count int, c, s uintptr) int {
	return int(C.mmNcclAllGather(n.d, C.CUdeviceptrN(send), C.CUdeviceptrN(recv), C.size_t(count), C.HN(c), C.HN(s)))
}
