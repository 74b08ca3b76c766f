//go:build megamoe_emu

package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/megamoe/megamoe/cuda/ptxemu"
)

// openEmuDriver returns the emulated driver (MEGAMOE_EMU, see EmulatorEnv).
func openEmuDriver() (driverAPI, error) { return newEmuDriver(), nil }

func isEmuDriver(api driverAPI) bool {
	_, ok := api.(*emuDriver)
	return ok
}

// emuDriver implements driverAPI over ptxemu. Every operation completes
// before it returns, so streams and events are trivially ordered; a stream
// in capture mode records its operations into a graph instead. As on a GPU,
// a stream that waits on an event recorded inside a capture joins that
// capture (a fork), and the capture ends only on its origin stream after
// every forked stream's work has been waited on there (a join): issue order
// is then a valid order of the graph's nodes.
type emuDriver struct {
	mu      sync.Mutex
	major   int  // compute capability reported: 8 (sm_80), 9 (sm_90a) or 10 (sm_100a)
	tma     bool // sm_90a with tensor maps and PDL (MEGAMOE_EMU=sm_90a+tma): the Hopper TMA/wgmma paths
	dev     *ptxemu.Device
	next    uintptr
	hosts   map[unsafe.Pointer][]byte
	modules map[uintptr]*ptxemu.Module
	funcs   map[uintptr]*ptxemu.Function
	streams map[uintptr]*emuStream
	events  map[uintptr]*emuEvent
	graphs  map[uintptr][]func() int
	maxDyn  map[uintptr]int // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set on a function

	detailMu sync.Mutex
	detail   string // the last failure's message, for errorName (once)
}

type emuStream struct {
	capture *emuCapture // the capture this stream records into, if any
	ops     int         // operations recorded into it
}

// emuCapture is one stream capture: its operations in issue order, the
// stream that began it, and the forked streams with work not yet joined.
type emuCapture struct {
	ops      []func() int
	origin   uintptr
	unjoined map[uintptr]bool
}

// emuEvent is an event's last record: its time, or inside a capture the
// capture, the recording stream and how many operations it had recorded.
type emuEvent struct {
	t    time.Time
	cap  *emuCapture
	src  uintptr
	mark int
}

// Emulated device: sm_80 (or sm_90a, with or without TMA) instructions, H200-sized
// shared memory and SMs; with sm_100a, B200's 148 SMs (the same shared
// memory sizes; 256 KB of tensor memory per SM, which no attribute reports).
const (
	emuSMs      = 132
	emuSMs100   = 148
	emuSmem     = 232448 // per block, opted in (227 KB)
	emuSmemSM   = 233472 // per SM (228 KB)
	emuTotalMem = 16 << 30
	emuSmemDflt = 48 << 10 // static + dynamic shared memory without the opt-in attribute
)

func newEmuDriver() *emuDriver {
	dev := ptxemu.NewDevice()
	dev.Limit = emuTotalMem // module globals count too; checked under the device's lock
	major, tma := 8, false
	switch v := os.Getenv(EmulatorEnv); {
	case v == EmulatorHopperTMA:
		major, tma = 9, true // compute_90a PTX with TMA and PDL: the H200's planner choices (wgmma, TMA decode)
	case strings.HasPrefix(v, "sm_90") || v == "90":
		major = 9 // compute_90a PTX: the H200's non-TMA code paths (FP8 mma, e4m3 cvt, clusters)
	case strings.HasPrefix(v, "sm_100") || v == "100":
		major = 10 // compute_100a PTX: tcgen05, tensor memory, TMA, mbarriers
	}
	return &emuDriver{dev: dev, major: major, tma: tma, next: 1, hosts: map[unsafe.Pointer][]byte{},
		modules: map[uintptr]*ptxemu.Module{}, funcs: map[uintptr]*ptxemu.Function{},
		streams: map[uintptr]*emuStream{0: {}}, events: map[uintptr]*emuEvent{}, graphs: map[uintptr][]func() int{},
		maxDyn: map[uintptr]int{}}
}

const (
	cuInvalidValue     = 1
	cuOutOfMemory      = 2
	cuInvalidImage     = 200
	cuNotFound         = 500
	cuIllegalAddress   = 700
	cuLaunchFailed     = 719
	cuNotSupported     = 801
	cuCaptureInvalid   = 901
	cuCaptureUnjoined  = 904
	cuCaptureIsolation = 905
)

func (e *emuDriver) handle() uintptr { e.next++; return e.next }

// fail records why the call that returns code failed; errorName appends it
// to the code's name. Every failing path records its reason (or none), so a
// message never describes an earlier failure.
func (e *emuDriver) fail(code int, err error) int {
	e.detailMu.Lock()
	defer e.detailMu.Unlock()
	e.detail = ""
	if err != nil {
		e.detail = err.Error()
	}
	return code
}

func (e *emuDriver) failf(code int, format string, args ...any) int {
	return e.fail(code, fmt.Errorf(format, args...))
}

func (e *emuDriver) libPath() string { return "ptxemu (" + EmulatorEnv + ")" }

func (e *emuDriver) errorName(r int) string {
	name := map[int]string{cuInvalidValue: "CUDA_ERROR_INVALID_VALUE", cuOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY",
		cuInvalidImage: "CUDA_ERROR_INVALID_IMAGE", cuNotFound: "CUDA_ERROR_NOT_FOUND",
		cuIllegalAddress: "CUDA_ERROR_ILLEGAL_ADDRESS", cuLaunchFailed: "CUDA_ERROR_LAUNCH_FAILED",
		cuNotSupported: "CUDA_ERROR_NOT_SUPPORTED", cuCaptureInvalid: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
		cuCaptureUnjoined: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", cuCaptureIsolation: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"}[r]
	if name == "" {
		name = fmt.Sprintf("CUresult %d", r)
	}
	e.detailMu.Lock()
	if e.detail != "" {
		name += " (" + e.detail + ")"
		e.detail = ""
	}
	e.detailMu.Unlock()
	return name
}

func (e *emuDriver) init() int                 { return 0 }
func (e *emuDriver) driverVersion() (int, int) { return 12040, 0 }
func (e *emuDriver) deviceCount() (int, int)   { return 1, 0 }

func (e *emuDriver) deviceTotalMem(int) (uint64, int)    { return emuTotalMem, 0 }
func (e *emuDriver) primaryCtxRetain(int) (uintptr, int) { return 1, 0 }
func (e *emuDriver) primaryCtxRelease(int) int           { return 0 }
func (e *emuDriver) ctxSynchronize(uintptr) int          { return 0 }
func (e *emuDriver) streamSynchronize(_, _ uintptr) int  { return 0 }
func (e *emuDriver) eventSynchronize(_, _ uintptr) int   { return 0 }
func (e *emuDriver) hasTensorMaps() bool                 { return e.major == 10 || e.tma }
func (e *emuDriver) hasLaunchEx() bool                   { return e.tma } // launches complete in order: PDL changes nothing
func (e *emuDriver) moduleUnload(_, m uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if mod := e.modules[m]; mod != nil {
		mod.Unload()
		delete(e.modules, m)
	}
	return 0
}

func (e *emuDriver) deviceName(int) (string, int) {
	if e.major == 10 {
		return "ptxemu (emulated sm_100a)", 0
	}
	if e.tma {
		return "ptxemu (emulated sm_90a with TMA)", 0
	}
	if e.major == 9 {
		return "ptxemu (emulated sm_90a, no TMA)", 0
	}
	return "ptxemu (emulated sm_80)", 0
}

func (e *emuDriver) deviceGet(ord int) (int, int) {
	if ord != 0 {
		return 0, e.failf(cuInvalidValue, "no device %d: ptxemu has one", ord)
	}
	return 0, 0
}

func (e *emuDriver) deviceAttr(attr, dev int) (int, int) {
	switch attr {
	case attrMultiprocessorCount:
		if e.major == 10 {
			return emuSMs100, 0
		}
		return emuSMs, 0
	case attrComputeMajor:
		return e.major, 0
	case attrComputeMinor:
		return 0, 0
	case attrMaxSmemOptin:
		return emuSmem, 0
	case attrMaxSmemPerSM:
		return emuSmemSM, 0
	}
	return 0, e.failf(cuInvalidValue, "device attribute %d not emulated", attr)
}

func (e *emuDriver) memGetInfo(uintptr) (uint64, uint64, int) {
	return emuTotalMem - e.dev.Used(), emuTotalMem, 0
}

func (e *emuDriver) memAlloc(_ uintptr, n int) (DevicePtr, int) {
	p, err := e.dev.Alloc(n)
	if errors.Is(err, ptxemu.ErrOutOfMemory) {
		return 0, e.failf(cuOutOfMemory, "%d bytes with %d of %d in use", n, e.dev.Used(), uint64(emuTotalMem))
	}
	if err != nil {
		return 0, e.fail(cuInvalidValue, err)
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
		return e.failf(cuInvalidValue, "%p is not pinned host memory", p)
	}
	delete(e.hosts, p)
	return 0
}

// enqueue runs op now, or records it while s is capturing.
func (e *emuDriver) enqueue(s uintptr, op func() int) int {
	e.mu.Lock()
	st := e.streams[s]
	if st == nil {
		e.mu.Unlock()
		return e.failf(cuInvalidValue, "no stream %#x", s)
	}
	if c := st.capture; c != nil { // under e.mu, as beginCapture/endCapture change it
		c.ops = append(c.ops, op)
		st.ops++
		if s != c.origin {
			c.unjoined[s] = true
		}
		e.mu.Unlock()
		return 0
	}
	e.mu.Unlock()
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
	e.events[h] = &emuEvent{t: time.Now()}
	return h, 0
}

func (e *emuDriver) eventDestroy(_, ev uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.events, ev)
	return 0
}

func (e *emuDriver) eventRecord(_, ev, s uintptr) int {
	e.mu.Lock()
	x, st := e.events[ev], e.streams[s]
	if x == nil || st == nil {
		e.mu.Unlock()
		return e.failf(cuInvalidValue, "no event %#x or stream %#x", ev, s)
	}
	e.mu.Unlock()
	if r := e.enqueue(s, func() int {
		e.mu.Lock()
		x.t = time.Now()
		e.mu.Unlock()
		return 0
	}); r != 0 {
		return r
	}
	e.mu.Lock()
	x.cap, x.src, x.mark = st.capture, s, st.ops // the record itself counted
	e.mu.Unlock()
	return 0
}

// streamWaitEvent: operations complete when issued, so an eager wait has
// nothing to wait for. An event recorded inside a live capture makes s join
// it; the origin waiting on a forked stream's latest record joins that
// stream back.
func (e *emuDriver) streamWaitEvent(_, s, ev uintptr) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, st := e.events[ev], e.streams[s]
	if x == nil || st == nil {
		return e.failf(cuInvalidValue, "no event %#x or stream %#x", ev, s)
	}
	c := x.cap
	if c != nil && e.streams[c.origin] != nil && e.streams[c.origin].capture != c {
		c = nil // that capture has ended: the record was a graph node, nothing to wait for now
	}
	switch {
	case c == nil && st.capture != nil:
		return e.failf(cuCaptureIsolation, "capturing stream %#x waits on an event recorded outside its capture", s)
	case c == nil:
		return 0
	case st.capture == nil:
		st.capture, st.ops = c, 0
	case st.capture != c:
		return e.failf(cuCaptureIsolation, "stream %#x waits on an event of another capture", s)
	}
	if s == c.origin && x.src != s && e.streams[x.src] != nil && e.streams[x.src].ops == x.mark {
		delete(c.unjoined, x.src)
	}
	return 0
}

func (e *emuDriver) eventElapsed(_, start, end uintptr) (float32, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t0, ok0 := e.events[start]
	t1, ok1 := e.events[end]
	if !ok0 || !ok1 {
		return 0, e.failf(cuInvalidValue, "no event %#x or %#x", start, end)
	}
	return float32(t1.t.Sub(t0.t).Seconds() * 1e3), 0
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
		return 0, e.failf(cuInvalidValue, "no module %#x", m)
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
		return 0, e.failf(cuInvalidValue, "no function %#x", f)
	}
	switch attr {
	case funcAttrNumRegs:
		return min(fn.Registers(), 255), 0 // virtual registers: an upper bound, not ptxas' count
	case funcAttrLocalBytes:
		return fn.LocalBytes(), 0
	case funcAttrStaticSmemBytes:
		return fn.StaticShared(), 0
	case funcAttrMaxDynamicSmem:
		return e.maxDynSmem(f, fn), 0
	}
	return 0, 0
}

// maxDynSmem is f's dynamic shared memory limit: what was set, else the
// driver's default, 48 KB less the static shared memory.
func (e *emuDriver) maxDynSmem(f uintptr, fn *ptxemu.Function) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n, ok := e.maxDyn[f]; ok {
		return n
	}
	return max(emuSmemDflt-fn.StaticShared(), 0)
}

// funcSetAttribute checks and records the dynamic shared memory limit, as
// the driver does: launches above it fail, so a launcher that forgets to
// raise it fails here as it would on the GPU. The carveout is a hint.
func (e *emuDriver) funcSetAttribute(_, f uintptr, attr, v int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	fn := e.funcs[f]
	if fn == nil {
		return e.failf(cuInvalidValue, "no function %#x", f)
	}
	switch attr {
	case funcAttrMaxDynamicSmem:
		if v < 0 || v+fn.StaticShared() > emuSmem {
			return e.failf(cuInvalidValue, "%s: dynamic shared memory limit %d + %d static over %d", fn.Name, v, fn.StaticShared(), emuSmem)
		}
		e.maxDyn[f] = v
	case funcAttrCarveout:
		if v < -1 || v > 100 {
			return e.failf(cuInvalidValue, "%s: carveout %d%%", fn.Name, v)
		}
	default:
		return e.failf(cuInvalidValue, "function attribute %d not emulated", attr)
	}
	return 0
}

func (e *emuDriver) launch(_, f uintptr, grid, block Dim3, smem int, s uintptr, args []uint64, offs []int32, _ bool) int {
	e.mu.Lock()
	fn := e.funcs[f]
	e.mu.Unlock()
	if fn == nil {
		return e.failf(cuInvalidValue, "no function %#x", f)
	}
	// The driver checks the configuration when the launch is enqueued (and
	// captured), before anything runs.
	nt := uint64(block.X) * uint64(block.Y) * uint64(block.Z)
	switch {
	case grid.X == 0 || grid.Y == 0 || grid.Z == 0 || grid.X > 1<<31-1 || grid.Y > 65535 || grid.Z > 65535:
		return e.failf(cuInvalidValue, "%s: grid %v outside (2^31-1, 65535, 65535)", fn.Name, grid)
	case nt == 0 || nt > 1024 || block.X > 1024 || block.Y > 1024 || block.Z > 64:
		return e.failf(cuInvalidValue, "%s: block %v outside (1024, 1024, 64), 1024 threads", fn.Name, block)
	case smem < 0 || smem+fn.StaticShared() > emuSmem:
		return e.failf(cuInvalidValue, "%s: %d bytes of shared memory over %d", fn.Name, smem+fn.StaticShared(), emuSmem)
	case smem > e.maxDynSmem(f, fn):
		return e.failf(cuInvalidValue, "%s: %d bytes of dynamic shared memory over the function's limit %d (SetMaxDynamicSmem)",
			fn.Name, smem, e.maxDynSmem(f, fn))
	}
	params := make([]byte, len(args)*8)
	copy(params, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(args))), len(args)*8))
	return e.enqueue(s, func() int {
		err := e.dev.Launch(fn, ptxemu.Dim{X: grid.X, Y: grid.Y, Z: grid.Z}, ptxemu.Dim{X: block.X, Y: block.Y, Z: block.Z}, smem, params)
		if err == nil {
			return 0
		}
		var le *ptxemu.LaunchError
		switch {
		case !errors.As(err, &le):
			return e.fail(cuInvalidValue, err) // a configuration ptxemu refuses (.maxntid)
		case le.Illegal:
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
		return e.failf(cuInvalidValue, "stream %#x: missing or already capturing", s)
	}
	st.capture, st.ops = &emuCapture{ops: []func() int{}, origin: s, unjoined: map[uintptr]bool{}}, 0
	return 0
}

func (e *emuDriver) endCapture(_, s uintptr) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.streams[s]
	if st == nil || st.capture == nil || st.capture.origin != s {
		return 0, e.failf(cuCaptureInvalid, "stream %#x is not the origin of a capture", s)
	}
	c := st.capture
	for _, o := range e.streams {
		if o.capture == c {
			o.capture = nil
		}
	}
	if len(c.unjoined) > 0 {
		return 0, e.failf(cuCaptureUnjoined, "%d forked streams not joined into stream %#x", len(c.unjoined), s)
	}
	h := e.handle()
	e.graphs[h] = c.ops
	return h, 0
}

func (e *emuDriver) graphInstantiate(_, g uintptr) (uintptr, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ops, ok := e.graphs[g]
	if !ok {
		return 0, e.failf(cuInvalidValue, "no graph %#x", g)
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
		return e.failf(cuInvalidValue, "no graph %#x", g)
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

// tensorMap2D and tensorMap3D encode ptxemu's private tensor map
// (ptxemu.EncodeTensorMap) on the devices with TMA (sm_90a+tma, sm_100a).
func (e *emuDriver) tensorMap2D(_ uintptr, out *TensorMap, dtype int, addr DevicePtr, inner, outer, stride uint64, boxInner, boxOuter uint32, swizzle int) int {
	return e.tensorMap(out, ptxemu.TensorMap{DType: dtype, Rank: 2, Addr: uint64(addr), Dims: [5]uint64{inner, outer},
		Strides: [5]uint64{0, stride}, Box: [5]uint32{boxInner, boxOuter}, Swizzle: swizzle})
}

func (e *emuDriver) tensorMap3D(_ uintptr, out *TensorMap, dtype int, addr DevicePtr, dims [3]uint64, strides [2]uint64, box [3]uint32, swizzle int) int {
	return e.tensorMap(out, ptxemu.TensorMap{DType: dtype, Rank: 3, Addr: uint64(addr), Dims: [5]uint64{dims[0], dims[1], dims[2]},
		Strides: [5]uint64{0, strides[0], strides[1]}, Box: [5]uint32{box[0], box[1], box[2]}, Swizzle: swizzle})
}

func (e *emuDriver) tensorMap(out *TensorMap, m ptxemu.TensorMap) int {
	if !e.hasTensorMaps() {
		return e.failf(cuNotSupported, "no TMA on this emulated device (%s=%s or sm_100a)", EmulatorEnv, EmulatorHopperTMA)
	}
	b, err := ptxemu.EncodeTensorMap(m)
	if err != nil {
		return e.fail(cuInvalidValue, err)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), len(b)), b[:])
	return 0
}
