// Package cuda is MegaMoE's CUDA backend foundation: it loads the CUDA driver
// (libcuda.so.1) and NVRTC at run time through dlopen, so nothing CUDA is
// needed to build; it manages devices, the primary context, streams, events,
// pooled device memory, pinned host memory, copies and CUDA graphs; it
// compiles the embedded kernels (kernels/*.cu) with NVRTC for the device's
// architecture, caches the CUBINs on disk, and exposes one typed launcher per
// kernel (see kernels.go).
//
// Builds without cgo compile, but every entry point returns ErrNoCGO.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr).
type DevicePtr uint64

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int) DevicePtr { return p + DevicePtr(off) }

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// EmulatorEnv selects the emulated driver when set (MEGAMOE_EMU=1): kernels
// compile to PTX for compute_80 and run on the CPU through ptxemu.
// MEGAMOE_EMU=sm_90a reports a 9.0 device without TMA instead: compute_90a
// PTX, so the Hopper builds of the non-TMA kernels run; MEGAMOE_EMU=sm_90a+tma
// (EmulatorHopperTMA) a 9.0 device with tensor maps and PDL, whose planner
// picks the TMA and wgmma kernels as on an H200; MEGAMOE_EMU=sm_100a
// reports a 10.0 device (B200's 148 SMs) with tensor maps: compute_100a PTX
// with tcgen05, tensor memory, TMA and mbarriers. It lets the GPU tests run
// without a GPU; it says nothing about speed. The emulator is only in builds with the
// megamoe_emu tag (EmulatorTag); elsewhere Load fails while it is set.
const EmulatorEnv = "MEGAMOE_EMU"

// EmulatorHopperTMA is the MEGAMOE_EMU value of the emulated Hopper with TMA.
const EmulatorHopperTMA = "sm_90a+tma"

// EmulatorTag is the build tag that compiles the emulated driver in.
const EmulatorTag = "megamoe_emu"

// ErrNoCGO is returned by every loader in builds without cgo.
var ErrNoCGO = errors.New("cuda: built without cgo (CGO_ENABLED=0); the CUDA backend needs cgo")

// Error is a failed CUDA driver or NVRTC call.
type Error struct {
	Call string // API call, e.g. "cuLaunchKernel"
	What string // object, e.g. the kernel name; may be empty
	Code int    // CUresult / nvrtcResult
	Name string // e.g. "CUDA_ERROR_INVALID_VALUE"
	Log  string // NVRTC program log, when there is one
}

func (e *Error) Error() string {
	s := "cuda: " + e.Call
	if e.What != "" {
		s += "(" + e.What + ")"
	}
	s += ": " + e.Name
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// CUDA_ERROR_OUT_OF_MEMORY, used by the pool to retry after freeing its cache.
const errOutOfMemory = 2

// IsOutOfMemory reports whether err is a CUDA out-of-memory error.
func IsOutOfMemory(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == errOutOfMemory && e.Call != "nvrtcCompileProgram"
}

// driverAPI is the subset of the CUDA driver we use. Results are raw CUresult
// codes; the typed wrappers turn them into *Error. Handles are opaque.
type driverAPI interface {
	libPath() string
	errorName(r int) string
	init() int
	driverVersion() (int, int)
	deviceCount() (int, int)
	deviceGet(ord int) (int, int)
	deviceName(dev int) (string, int)
	deviceAttr(attr, dev int) (int, int)
	deviceTotalMem(dev int) (uint64, int)
	primaryCtxRetain(dev int) (uintptr, int)
	primaryCtxRelease(dev int) int
	ctxSynchronize(c uintptr) int
	memGetInfo(c uintptr) (uint64, uint64, int)
	memAlloc(c uintptr, n int) (DevicePtr, int)
	memFree(c uintptr, p DevicePtr) int
	memHostAlloc(c uintptr, n int) (unsafe.Pointer, int)
	memFreeHost(c uintptr, p unsafe.Pointer) int
	memcpyHtoD(c uintptr, dst DevicePtr, src unsafe.Pointer, n int, s uintptr) int
	memcpyDtoH(c uintptr, dst unsafe.Pointer, src DevicePtr, n int, s uintptr) int
	memcpyDtoD(c uintptr, dst, src DevicePtr, n int, s uintptr) int
	memsetD8(c uintptr, dst DevicePtr, v byte, n int, s uintptr) int
	memsetD32(c uintptr, dst DevicePtr, v uint32, n int, s uintptr) int
	streamCreate(c uintptr, flags uint32) (uintptr, int)
	streamDestroy(c, s uintptr) int
	streamSynchronize(c, s uintptr) int
	eventCreate(c uintptr, flags uint32) (uintptr, int)
	eventDestroy(c, e uintptr) int
	eventRecord(c, e, s uintptr) int
	streamWaitEvent(c, s, e uintptr) int // s's later work waits for e's last record
	eventSynchronize(c, e uintptr) int
	eventElapsed(c, start, end uintptr) (float32, int)
	moduleLoadData(c uintptr, image []byte) (uintptr, int)
	moduleUnload(c, m uintptr) int
	moduleGetFunction(c, m uintptr, name string) (uintptr, int)
	funcSetAttribute(c, f uintptr, attr, v int) int
	funcGetAttribute(c, f uintptr, attr int) (int, int)
	launch(c, f uintptr, grid, block Dim3, smem int, s uintptr, args []uint64, offs []int32, pdl bool) int
	beginCapture(c, s uintptr, mode int) int
	endCapture(c, s uintptr) (uintptr, int)
	graphInstantiate(c, g uintptr) (uintptr, int)
	graphLaunch(c, e, s uintptr) int
	graphDestroy(c, g uintptr) int
	graphNodes(c, g uintptr) (int, int)
	graphExecDestroy(c, e uintptr) int
	hasTensorMaps() bool
	hasLaunchEx() bool
	tensorMap2D(c uintptr, out *TensorMap, dtype int, addr DevicePtr, inner, outer, stride uint64, boxInner, boxOuter uint32, swizzle int) int
	// tensorMap3D: dims innermost first, strides in bytes of dimensions 1 and 2.
	tensorMap3D(c uintptr, out *TensorMap, dtype int, addr DevicePtr, dims [3]uint64, strides [2]uint64, box [3]uint32, swizzle int) int
}

// nvrtcAPI is the subset of NVRTC we use.
type nvrtcAPI interface {
	libPath() string
	version() (int, int)
	errString(r int) string
	compile(src, name string, headers, includeNames, opts []string) (cubin []byte, log, failedCall string, code int)
}

// check turns a CUresult into an error naming the call and object.
func (d *Driver) check(call, what string, r int) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, What: what, Code: r, Name: d.api.errorName(r)}
}

// Driver is the loaded CUDA driver library.
type Driver struct {
	api     driverAPI
	version int
}

// Load opens libcuda.so.1 (or $MEGAMOE_LIBCUDA) and initializes the driver.
// It fails cleanly on machines without an NVIDIA driver.
func Load() (*Driver, error) {
	var api driverAPI
	var err error
	if os.Getenv(EmulatorEnv) != "" {
		api, err = openEmuDriver()
	} else {
		api, err = openDriver()
	}
	if err != nil {
		return nil, err
	}
	d := &Driver{api: api}
	if err := d.check("cuInit", "", api.init()); err != nil {
		return nil, err
	}
	v, r := api.driverVersion()
	if err := d.check("cuDriverGetVersion", "", r); err != nil {
		return nil, err
	}
	d.version = v
	return d, nil
}

// Version is the driver's CUDA version, e.g. 13000 for 13.0.
func (d *Driver) Version() int { return d.version }

// Path is the library that was opened.
func (d *Driver) Path() string { return d.api.libPath() }

// DeviceCount is the number of CUDA devices.
func (d *Driver) DeviceCount() (int, error) {
	n, r := d.api.deviceCount()
	return n, d.check("cuDeviceGetCount", "", r)
}

// Device attributes (CUdevice_attribute values).
const (
	attrMultiprocessorCount = 16
	attrComputeMajor        = 75
	attrComputeMinor        = 76
	attrMaxSmemPerSM        = 81
	attrMaxSmemOptin        = 97
)

// Device describes one GPU.
type Device struct {
	drv       *Driver
	Ordinal   int
	handle    int
	Name      string
	SMs       int    // multiprocessor count
	Major     int    // compute capability
	Minor     int    //
	TotalMem  uint64 // bytes
	SmemOptin int    // max dynamic shared memory per block after opt-in, bytes
	SmemSM    int    // shared memory of one SM, bytes (all its CTAs together)
}

// Device opens device ordinal and reads its properties.
func (d *Driver) Device(ordinal int) (*Device, error) {
	dev, r := d.api.deviceGet(ordinal)
	if err := d.check("cuDeviceGet", fmt.Sprint(ordinal), r); err != nil {
		return nil, err
	}
	out := &Device{drv: d, Ordinal: ordinal, handle: dev}
	if out.Name, r = d.api.deviceName(dev); r != 0 {
		return nil, d.check("cuDeviceGetName", "", r)
	}
	for _, a := range []struct {
		attr int
		dst  *int
	}{{attrMultiprocessorCount, &out.SMs}, {attrComputeMajor, &out.Major}, {attrComputeMinor, &out.Minor},
		{attrMaxSmemOptin, &out.SmemOptin}, {attrMaxSmemPerSM, &out.SmemSM}} {
		if *a.dst, r = d.api.deviceAttr(a.attr, dev); r != 0 {
			return nil, d.check("cuDeviceGetAttribute", fmt.Sprint(a.attr), r)
		}
	}
	if out.TotalMem, r = d.api.deviceTotalMem(dev); r != 0 {
		return nil, d.check("cuDeviceTotalMem", "", r)
	}
	return out, nil
}

// Arch is the NVRTC target for this device: sm_XY, with the arch-specific
// "a" suffix from compute capability 9.0 on (wgmma, tcgen05 need it).
func (dev *Device) Arch() string {
	if dev.Emulated() { // PTX for ptxemu: compute_80, or compute_90a
		return strings.Replace(ArchFor(dev.Major, dev.Minor), "sm_", "compute_", 1)
	}
	return ArchFor(dev.Major, dev.Minor)
}

// Emulated reports whether the device is ptxemu (MEGAMOE_EMU), not a GPU.
func (dev *Device) Emulated() bool { return isEmuDriver(dev.drv.api) }

// ArchFor returns the NVRTC target for a compute capability.
func ArchFor(major, minor int) string {
	if major >= 9 {
		return fmt.Sprintf("sm_%d%da", major, minor)
	}
	return fmt.Sprintf("sm_%d%d", major, minor)
}
