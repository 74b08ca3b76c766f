package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/megamoe/megamoe/cuda/ptxemu"
)

// EmulatorEnv selects the emulated driver when set (MEGAMOE_EMU=1): kernels
// compile to PTX for compute_80 and run on the CPU through ptxemu. It lets
// the GPU tests of the sm_80 kernels run without a GPU; it says nothing
// about speed, and sm_90 kernels (wgmma, TMA) are not emulated.
const EmulatorEnv = "MEGAMOE_EMU"

// emuDriver implements driverAPI over ptxemu. Every operation completes
// before it returns, so streams and events are trivially ordered; a stream
// in capture mode records its operations into a graph instead.
type emuDriver struct {
	mu      sync.Mutex
	dev     *ptxemu.Device
	next    uintptr
	hosts   map[unsafe.Pointer][]byte
	modules map[uintptr]*ptxemu.Module
	funcs   map[uintptr]*ptxemu.Function
	streams map[uintptr]*emuStream
	events  map[uintptr]time.Time
	graphs  map[uintptr][]func() int
	detail  string // the last failure, for errorName
}

type emuStream struct{ capture []func() int }

// Emulated device: sm_80 instructions, H200-sized shared memory and SMs.
const (
	emuSMs      = 132
	emuSmem     = 232448
	emuTotalMem = 16 << 30
)

func newEmuDriver() *emuDriver {
	return &emuDriver{dev: ptxemu.NewDevice(), next: 1, hosts: map[unsafe.Pointer][]byte{},
		modules: map[uintptr]*ptxemu.Module{}, funcs: map[uintptr]*ptxemu.Function{},
		streams: map[uintptr]*emuStream{0: {}}, events: map[uintptr]time.Time{}, graphs: map[uintptr][]func() int{}}
}

const (
	cuInvalidValue   = 1
	cuOutOfMemory    = 2
	cuInvalidImage   = 200
	cuNotFound       = 500
	cuIllegalAddress = 700
	cuLaunchFailed   = 719
	cuNotSupported   = 801
	cuCaptureInvalid = 901
)

func (e *emuDriver) handle() uintptr { e.next++; return e.next }

func (e *emuDriver) fail(code int, err error) int {
	e.detail = err.Error()
	return code
}

func (e *emuDriver) libPath() string { return "ptxemu (" + EmulatorEnv + ")" }

func (e *emuDriver) errorName(r int) string {
	name := map[int]string{cuInvalidValue: "CUDA_ERROR_INVALID_VALUE", cuOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY",
		cuInvalidImage: "CUDA_ERROR_INVALID_IMAGE", cuNotFound: "CUDA_ERROR_NOT_FOUND",
		cuIllegalAddress: "CUDA_ERROR_ILLEGAL_ADDRESS", cuLaunchFailed: "CUDA_ERROR_LAUNCH_FAILED",
		cuNotSupported: "CUDA_ERROR_NOT_SUPPORTED", cuCaptureInvalid: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}[r]
	if name == "" {
		name = fmt.Sprintf("CUresult %d", r)
	}
	if e.detail != "" {
		name += " (" + e.detail + ")"
	}
	return name
}

func (e *emuDriver) init() int                                   { return 0 }
func (e *emuDriver) driverVersion() (int, int)                   { return 12040, 0 }
func (e *emuDriver) deviceCount() (int, int)                     { return 1, 0 }
func (e *emuDriver) deviceGet(ord int) (int, int)                { return ord, b2r(ord != 0) }
func (e *emuDriver) deviceName(int) (string, int)                { return "ptxemu (emulated sm_80)", 0 }
func (e *emuDriver) deviceTotalMem(int) (uint64, int)            { return emuTotalMem, 0 }
func (e *emuDriver) primaryCtxRetain(int) (uintptr, int)         { return 1, 0 }
func (e *emuDriver) primaryCtxRelease(int) int                   { return 0 }
func (e *emuDriver) ctxSynchronize(uintptr) int                  { return 0 }
func (e *emuDriver) streamSynchronize(_, _ uintptr) int          { return 0 }
func (e *emuDriver) eventSynchronize(_, _ uintptr) int           { return 0 }
func (e *emuDriver) hasTensorMaps() bool                         { return false }
func (e *emuDriver) hasLaunchEx() bool                           { return false }
func (e *emuDriver) funcSetAttribute(_, _ uintptr, _, _ int) int { return 0 }
func (e *emuDriver) moduleUnload(_, m uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if mod := e.modules[m]; mod != nil {
		mod.Unload()
		delete(e.modules, m)
	}
	return 0
}

func b2r(bad bool) int {
	if bad {
		return cuInvalidValue
	}
	return 0
}

func (e *emuDriver) deviceAttr(attr, dev int) (int, int) {
	switch attr {
	case attrMultiprocessorCount:
		return emuSMs, 0
	case attrComputeMajor:
		return 8, 0
	case attrComputeMinor:
		return 0, 0
	case attrMaxSmemOptin:
		return emuSmem, 0
	}
	return 0, cuInvalidValue
}

func (e *emuDriver) memGetInfo(uintptr) (uint64, uint64, int) {
	return emuTotalMem - e.dev.Used(), emuTotalMem, 0
}

func (e *emuDriver) memAlloc(_ uintptr, n int) (DevicePtr, int) {
	if uint64(n)+e.dev.Used() > emuTotalMem {
		return 0, cuOutOfMemory
	}
	p, err := e.dev.Alloc(n)
	if err != nil {
		return 0, e.fail(cuOutOfMemory, err)
	}
	return DevicePtr(p), 0
}

func (e *emuDriver) memFree(_ uintptr, p DevicePtr) int {
	if err := e.dev.Free(uint64(p)); err != nil {
		return e.fail(cuInvalidValue, err)
	}
	return 0
}

func (e *emuDriver) memHostAlloc(_ uintptr, n int) (unsafe.Pointer, int) {
	b := make([]byte, max(n, 1))
	p := unsafe.Pointer(&b[0])
	e.mu.Lock()
	e.hosts[p] = b // kept reachable until freed; the GC does not move it
	e.mu.Unlock()
	return p, 0
}

func (e *emuDriver) memFreeHost(_ uintptr, p unsafe.Pointer) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.hosts[p]; !ok {
		return cuInvalidValue
	}
	delete(e.hosts, p)
	return 0
}

// enqueue runs op now, or records it while s is capturing.
func (e *emuDriver) enqueue(s uintptr, op func() int) int {
	e.mu.Lock()
	st := e.streams[s]
	e.mu.Unlock()
	if st == nil {
		return cuInvalidValue
	}
	if st.capture != nil {
		st.capture = append(st.capture, op)
		return 0
	}
	return op()
}

func (e *emuDriver) devBytes(p DevicePtr, n int) ([]byte, int) {
	b, err := e.dev.Bytes(uint64(p), n)
	if err != nil {
		return nil, e.fail(cuInvalidValue, err)
	}
	return b, 0
}

func (e *emuDriver) memcpyHtoD(_ uintptr, dst DevicePtr, src unsafe.Pointer, n int, s uintptr) int {
	return e.enqueue(s, func() int {
		d, r := e.devBytes(dst, n)
		if r == 0 && n > 0 {
			copy(d, unsafe.Slice((*byte)(src), n))
		}
		return r
	})
}

func (e *emuDriver) memcpyDtoH(_ uintptr, dst unsafe.Pointer, src DevicePtr, n int, s uintptr) int {
	return e.enqueue(s, func() int {
		b, r := e.devBytes(src, n)
		if r == 0 && n > 0 {
			copy(unsafe.Slice((*byte)(dst), n), b)
		}
		return r
	})
}

func (e *emuDriver) memcpyDtoD(_ uintptr, dst, src DevicePtr, n int, s uintptr) int {
	return e.enqueue(s, func() int {
		d, r := e.devBytes(dst, n)
		if r != 0 {
			return r
		}
		b, r := e.devBytes(src, n)
		if r == 0 {
			copy(d, b)
		}
		return r
	})
}

func (e *emuDriver) memsetD8(_ uintptr, dst DevicePtr, v byte, n int, s uintptr) int {
	return e.enqueue(s, func() int {
		d, r := e.devBytes(dst, n)
		for i := range d {
			d[i] = v
		}
		return r
	})
}

func (e *emuDriver) memsetD32(_ uintptr, dst DevicePtr, v uint32, n int, s uintptr) int {
	return e.enqueue(s, func() int {
		d, r := e.devBytes(dst, 4*n)
		for i := 0; i+4 <= len(d); i += 4 {
			d[i], d[i+1], d[i+2], d[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		}
		return r
	})
}

func (e *emuDriver) streamCreate(uintptr, uint32) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.handle()
	e.streams[h] = &emuStream{}
	return h, 0
}

func (e *emuDriver) streamDestroy(_, s uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.streams, s)
	return 0
}

func (e *emuDriver) eventCreate(uintptr, uint32) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.handle()
	e.events[h] = time.Now()
	return h, 0
}

func (e *emuDriver) eventDestroy(_, ev uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.events, ev)
	return 0
}

func (e *emuDriver) eventRecord(_, ev, s uintptr) int {
	return e.enqueue(s, func() int {
		e.mu.Lock()
		e.events[ev] = time.Now()
		e.mu.Unlock()
		return 0
	})
}

func (e *emuDriver) eventElapsed(_, start, end uintptr) (float32, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return float32(e.events[end].Sub(e.events[start]).Seconds() * 1e3), 0
}

func (e *emuDriver) moduleLoadData(_ uintptr, image []byte) (uintptr, int) {
	m, err := e.dev.Load(bytes.TrimRight(image, "\x00"))
	if err != nil {
		return 0, e.fail(cuInvalidImage, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.handle()
	e.modules[h] = m
	return h, 0
}

func (e *emuDriver) moduleGetFunction(_, m uintptr, name string) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	mod := e.modules[m]
	if mod == nil {
		return 0, cuInvalidValue
	}
	f, err := mod.Function(name)
	if err != nil {
		return 0, e.fail(cuNotFound, err)
	}
	h := e.handle()
	e.funcs[h] = f
	return h, 0
}

func (e *emuDriver) funcGetAttribute(_, f uintptr, attr int) (int, int) {
	e.mu.Lock()
	fn := e.funcs[f]
	e.mu.Unlock()
	if fn == nil {
		return 0, cuInvalidValue
	}
	switch attr {
	case funcAttrNumRegs:
		return min(fn.Registers(), 255), 0 // virtual registers: an upper bound, not ptxas' count
	case funcAttrLocalBytes:
		return fn.LocalBytes(), 0
	case funcAttrStaticSmemBytes:
		return fn.StaticShared(), 0
	case funcAttrMaxDynamicSmem:
		return emuSmem - fn.StaticShared(), 0
	}
	return 0, 0
}

func (e *emuDriver) launch(_, f uintptr, grid, block Dim3, smem int, s uintptr, args []uint64, offs []int32, _ bool) int {
	e.mu.Lock()
	fn := e.funcs[f]
	e.mu.Unlock()
	if fn == nil {
		return cuInvalidValue
	}
	if smem+fn.StaticShared() > emuSmem {
		return e.fail(cuInvalidValue, fmt.Errorf("%s: %d bytes of shared memory over %d", fn.Name, smem+fn.StaticShared(), emuSmem))
	}
	params := make([]byte, len(args)*8)
	copy(params, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(args))), len(args)*8))
	return e.enqueue(s, func() int {
		err := e.dev.Launch(fn, ptxemu.Dim{X: grid.X, Y: grid.Y, Z: grid.Z}, ptxemu.Dim{X: block.X, Y: block.Y, Z: block.Z}, smem, params)
		if err == nil {
			return 0
		}
		var le *ptxemu.LaunchError
		if errors.As(err, &le) && le.Illegal {
			return e.fail(cuIllegalAddress, err)
		}
		return e.fail(cuLaunchFailed, err)
	})
}

func (e *emuDriver) beginCapture(_, s uintptr, _ int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.streams[s]
	if st == nil || st.capture != nil {
		return cuInvalidValue
	}
	st.capture = []func() int{}
	return 0
}

func (e *emuDriver) endCapture(_, s uintptr) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.streams[s]
	if st == nil || st.capture == nil {
		return 0, cuCaptureInvalid
	}
	h := e.handle()
	e.graphs[h] = st.capture
	st.capture = nil
	return h, 0
}

func (e *emuDriver) graphInstantiate(_, g uintptr) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ops, ok := e.graphs[g]
	if !ok {
		return 0, cuInvalidValue
	}
	h := e.handle()
	e.graphs[h] = append([]func() int(nil), ops...)
	return h, 0
}

func (e *emuDriver) graphLaunch(_, g, s uintptr) int {
	e.mu.Lock()
	ops, ok := e.graphs[g]
	e.mu.Unlock()
	if !ok {
		return cuInvalidValue
	}
	return e.enqueue(s, func() int {
		for _, op := range ops {
			if r := op(); r != 0 {
				return r
			}
		}
		return 0
	})
}

func (e *emuDriver) graphNodes(_, g uintptr) (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.graphs[g]), 0
}

func (e *emuDriver) graphDestroy(_, g uintptr) int     { return e.dropGraph(g) }
func (e *emuDriver) graphExecDestroy(_, g uintptr) int { return e.dropGraph(g) }

func (e *emuDriver) dropGraph(g uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.graphs, g)
	return 0
}

func (e *emuDriver) tensorMap2D(uintptr, *TensorMap, int, DevicePtr, uint64, uint64, uint64, uint32, uint32, int) int {
	return cuNotSupported
}

func (e *emuDriver) tensorMap3D(uintptr, *TensorMap, int, DevicePtr, [3]uint64, [2]uint64, [3]uint32, int) int {
	return cuNotSupported
}
