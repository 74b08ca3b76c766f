package cuda

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Context is a device's primary context plus the per-context state built on
// it: the device memory pool and the compiled kernel modules.
type Context struct {
	dev  *Device
	drv  *Driver
	h    uintptr
	pool *Pool

	mu      sync.Mutex
	modules map[string]*Module // by kernel source name
	nvrtc   *NVRTC
	closed  bool

	fnMu   sync.Mutex
	fns    map[string]*Function // "module.function" -> ready kernel
	choice KernelChoice
}

// NewContext retains the device's primary context.
func (dev *Device) NewContext() (*Context, error) {
	h, r := dev.drv.api.primaryCtxRetain(dev.handle)
	if err := dev.drv.check("cuDevicePrimaryCtxRetain", dev.Name, r); err != nil {
		return nil, err
	}
	c := &Context{dev: dev, drv: dev.drv, h: h, modules: map[string]*Module{}, fns: map[string]*Function{}}
	c.pool = &Pool{ctx: c, free: map[int][]DevicePtr{}}
	return c, nil
}

// Device is the context's device.
func (c *Context) Device() *Device { return c.dev }

// Pool is the context's device memory pool.
func (c *Context) Pool() *Pool { return c.pool }

func (c *Context) check(call, what string, r int) error { return c.drv.check(call, what, r) }

// Close frees cached memory, unloads modules and releases the primary context.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for name, m := range c.modules {
		if err := c.check("cuModuleUnload", name, c.drv.api.moduleUnload(c.h, m.h)); err != nil {
			keep(err)
		}
	}
	c.modules = nil
	if err := c.pool.Trim(); err != nil {
		keep(err)
	}
	if err := c.check("cuDevicePrimaryCtxRelease", c.dev.Name, c.drv.api.primaryCtxRelease(c.dev.handle)); err != nil {
		keep(err)
	}
	return first
}

// Synchronize waits for all work in the context.
func (c *Context) Synchronize() error {
	return c.check("cuCtxSynchronize", "", c.drv.api.ctxSynchronize(c.h))
}

// MemInfo returns free and total device memory in bytes (cuMemGetInfo).
func (c *Context) MemInfo() (free, total uint64, err error) {
	f, t, r := c.drv.api.memGetInfo(c.h)
	return f, t, c.check("cuMemGetInfo", "", r)
}

// ---- streams ----

// Stream is a non-blocking CUDA stream.
type Stream struct {
	ctx       *Context
	h         uintptr
	pdl       bool      // launch with programmatic dependent launch (pdl.go)
	capturing bool      // between BeginCapture and EndCapture, or joined to another stream's capture
	origin    *Stream   // the capture this stream records into: its BeginCapture stream
	forks     []*Stream // on an origin: the streams that joined its capture
	captures  int       // BeginCaptures so far: which capture an event belongs to
	afterWait bool      // the next launch follows a WaitEvent: launched without PDL
	fix       *Buffer   // split-K tile counters of the in-kernel fixups (fixup.go)
	fixZero   bool      // fix zeroed by an eager memset
}

const streamNonBlocking = 1

// NewStream creates a stream that does not synchronize with the legacy default stream.
func (c *Context) NewStream() (*Stream, error) {
	s, r := c.drv.api.streamCreate(c.h, streamNonBlocking)
	if err := c.check("cuStreamCreate", "", r); err != nil {
		return nil, err
	}
	return &Stream{ctx: c, h: s, pdl: c.CanPDL()}, nil
}

// Close destroys the stream, first waiting for its work when it holds
// the fixup counters (which then go back to the pool).
func (s *Stream) Close() error {
	var err error
	if s.fix != nil {
		err = s.Synchronize()
	}
	if e := s.ctx.check("cuStreamDestroy", "", s.ctx.drv.api.streamDestroy(s.ctx.h, s.h)); err == nil {
		err = e
	}
	s.fix.Free()
	s.fix = nil
	return err
}

// Synchronize waits for the stream's work.
func (s *Stream) Synchronize() error {
	return s.ctx.check("cuStreamSynchronize", "", s.ctx.drv.api.streamSynchronize(s.ctx.h, s.h))
}

// CopyHtoD copies src to dst, ordered on the stream. With pageable Go memory
// the driver has read src when this returns; with HostBuffer memory the copy
// is truly asynchronous and src must stay untouched until the stream passes it.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	r := s.ctx.drv.api.memcpyHtoD(s.ctx.h, dst, unsafe.Pointer(&src[0]), len(src), s.h)
	return s.ctx.check("cuMemcpyHtoDAsync", "", r)
}

// CopyDtoH copies device memory into dst, ordered on the stream. With pageable
// Go memory the call returns after the copy; with HostBuffer memory read dst
// only after synchronizing.
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	r := s.ctx.drv.api.memcpyDtoH(s.ctx.h, unsafe.Pointer(&dst[0]), src, len(dst), s.h)
	return s.ctx.check("cuMemcpyDtoHAsync", "", r)
}

// CopyDtoD copies n bytes between device buffers.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int) error {
	if n == 0 {
		return nil
	}
	return s.ctx.check("cuMemcpyDtoDAsync", "", s.ctx.drv.api.memcpyDtoD(s.ctx.h, dst, src, n, s.h))
}

// Memset8 sets n bytes at dst to v.
func (s *Stream) Memset8(dst DevicePtr, v byte, n int) error {
	if n == 0 {
		return nil
	}
	return s.ctx.check("cuMemsetD8Async", "", s.ctx.drv.api.memsetD8(s.ctx.h, dst, v, n, s.h))
}

// Memset32 sets n 32-bit words at dst (4-byte aligned) to v.
func (s *Stream) Memset32(dst DevicePtr, v uint32, n int) error {
	if n == 0 {
		return nil
	}
	return s.ctx.check("cuMemsetD32Async", "", s.ctx.drv.api.memsetD32(s.ctx.h, dst, v, n, s.h))
}

// ---- events ----

// Event is a CUDA event (NewEvent: timing enabled).
type Event struct {
	ctx    *Context
	h      uintptr
	origin *Stream // the capture of its last Record, if any: its origin
	nth    int     // and which of the origin's captures
}

// NewEvent creates a timing event.
func (c *Context) NewEvent() (*Event, error) {
	e, r := c.drv.api.eventCreate(c.h, 0)
	if err := c.check("cuEventCreate", "", r); err != nil {
		return nil, err
	}
	return &Event{ctx: c, h: e}, nil
}

// NewSyncEvent creates an event for ordering streams only (no timing,
// which makes its record and wait cheaper).
func (c *Context) NewSyncEvent() (*Event, error) {
	e, r := c.drv.api.eventCreate(c.h, eventDisableTiming)
	if err := c.check("cuEventCreate", "", r); err != nil {
		return nil, err
	}
	return &Event{ctx: c, h: e}, nil
}

const eventDisableTiming = 2 // CU_EVENT_DISABLE_TIMING

// Record enqueues the event on s.
func (e *Event) Record(s *Stream) error {
	err := e.ctx.check("cuEventRecord", "", e.ctx.drv.api.eventRecord(e.ctx.h, e.h, s.h))
	if err == nil {
		e.origin = s.origin
		if e.origin != nil {
			e.nth = e.origin.captures
		}
	}
	return err
}

// WaitEvent makes s's later work wait for e's last Record (cuStreamWaitEvent).
// An event recorded inside a capture pulls s into that capture (a fork); the
// capture's origin must wait on every forked stream's last work (a join)
// before EndCapture. The next kernel on s is launched without programmatic
// dependent launch, so that it waits for e like any stream order.
func (s *Stream) WaitEvent(e *Event) error {
	o := e.origin
	join := o != nil && o.capturing && o.captures == e.nth && s.origin == nil
	if join {
		if err := s.zeroFixup(); err != nil {
			return err
		}
	}
	if err := s.ctx.check("cuStreamWaitEvent", "", s.ctx.drv.api.streamWaitEvent(s.ctx.h, s.h, e.h)); err != nil {
		return err
	}
	s.afterWait = true
	if join {
		s.capturing, s.origin = true, o
		o.forks = append(o.forks, s)
	}
	return nil
}

// Synchronize waits until the event has completed.
func (e *Event) Synchronize() error {
	return e.ctx.check("cuEventSynchronize", "", e.ctx.drv.api.eventSynchronize(e.ctx.h, e.h))
}

// ElapsedMs is the time in milliseconds from start to e (both recorded and completed).
func (e *Event) ElapsedMs(start *Event) (float32, error) {
	ms, r := e.ctx.drv.api.eventElapsed(e.ctx.h, start.h, e.h)
	return ms, e.ctx.check("cuEventElapsedTime", "", r)
}

// Close destroys the event.
func (e *Event) Close() error {
	return e.ctx.check("cuEventDestroy", "", e.ctx.drv.api.eventDestroy(e.ctx.h, e.h))
}

// ---- pinned host memory ----

// HostBuffer is page-locked host memory (cuMemHostAlloc) for async staging.
type HostBuffer struct {
	ctx *Context
	p   unsafe.Pointer
	n   int
}

// AllocHost allocates n bytes of pinned host memory.
func (c *Context) AllocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: AllocHost(%d): size must be positive", n)
	}
	p, r := c.drv.api.memHostAlloc(c.h, n)
	if err := c.check("cuMemHostAlloc", fmt.Sprint(n), r); err != nil {
		return nil, err
	}
	return &HostBuffer{ctx: c, p: p, n: n}, nil
}

// Bytes views the pinned memory. The view is invalid after Close.
func (b *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(b.p), b.n) }

// Close frees the pinned memory.
func (b *HostBuffer) Close() error {
	if b.p == nil {
		return nil
	}
	err := b.ctx.check("cuMemFreeHost", "", b.ctx.drv.api.memFreeHost(b.ctx.h, b.p))
	b.p = nil
	return err
}

// ---- CUDA graphs ----

// Graph is a captured CUDA graph.
type Graph struct {
	ctx *Context
	h   uintptr
}

// GraphExec is an instantiated graph.
type GraphExec struct {
	ctx *Context
	h   uintptr
}

const captureModeRelaxed = 2 // other goroutines' threads may keep calling the driver

// BeginCapture starts recording the stream's work into a graph.
func (s *Stream) BeginCapture() error {
	if err := s.zeroFixup(); err != nil {
		return err
	}
	err := s.ctx.check("cuStreamBeginCapture", "", s.ctx.drv.api.beginCapture(s.ctx.h, s.h, captureModeRelaxed))
	s.capturing = err == nil
	if s.capturing {
		s.origin = s
		s.captures++
	}
	return err
}

// EndCapture stops recording and returns the graph.
func (s *Stream) EndCapture() (*Graph, error) {
	for _, f := range s.forks {
		f.capturing, f.origin = false, nil
	}
	s.capturing, s.origin, s.forks = false, nil, nil
	g, r := s.ctx.drv.api.endCapture(s.ctx.h, s.h)
	if err := s.ctx.check("cuStreamEndCapture", "", r); err != nil {
		return nil, err
	}
	return &Graph{ctx: s.ctx, h: g}, nil
}

// Instantiate makes the graph launchable.
func (g *Graph) Instantiate() (*GraphExec, error) {
	e, r := g.ctx.drv.api.graphInstantiate(g.ctx.h, g.h)
	if err := g.ctx.check("cuGraphInstantiate", "", r); err != nil {
		return nil, err
	}
	return &GraphExec{ctx: g.ctx, h: e}, nil
}

// Nodes reports how many nodes the graph holds.
func (g *Graph) Nodes() (int, error) {
	n, r := g.ctx.drv.api.graphNodes(g.ctx.h, g.h)
	return n, g.ctx.check("cuGraphGetNodes", "", r)
}

// Close destroys the graph (instantiated copies stay valid).
func (g *Graph) Close() error {
	return g.ctx.check("cuGraphDestroy", "", g.ctx.drv.api.graphDestroy(g.ctx.h, g.h))
}

// Launch replays the graph on s.
func (e *GraphExec) Launch(s *Stream) error {
	return e.ctx.check("cuGraphLaunch", "", e.ctx.drv.api.graphLaunch(e.ctx.h, e.h, s.h))
}

// Close destroys the executable graph.
func (e *GraphExec) Close() error {
	return e.ctx.check("cuGraphExecDestroy", "", e.ctx.drv.api.graphExecDestroy(e.ctx.h, e.h))
}

// ---- kernel launch ----

// Args packs kernel parameters with their natural C alignment, in order.
type Args struct {
	buf  [64]uint64 // 512 bytes, 8-byte aligned
	n    int        // bytes used
	offs [64]int32  // byte offset of each parameter
	na   int        // parameters
	err  error
}

func (a *Args) put(size int, bits uint64) *Args {
	if b := a.slot(size, size); b != nil {
		for i := range b {
			b[i] = byte(bits >> (8 * i))
		}
	}
	return a
}

// slot reserves the next parameter, size bytes aligned to align, and returns
// its bytes (nil after an error).
func (a *Args) slot(size, align int) []byte {
	if a.err != nil {
		return nil
	}
	n := (a.n + align - 1) &^ (align - 1)
	if n+size > len(a.buf)*8 {
		a.err = fmt.Errorf("cuda: kernel arguments exceed %d bytes", len(a.buf)*8)
		return nil
	}
	if a.na == len(a.offs) {
		a.err = fmt.Errorf("cuda: more than %d kernel arguments", len(a.offs))
		return nil
	}
	a.offs[a.na] = int32(n)
	a.na++
	a.n = n + size
	return unsafe.Slice((*byte)(unsafe.Pointer(&a.buf[0])), len(a.buf)*8)[n : n+size]
}

// Ptr appends a device pointer.
func (a *Args) Ptr(p DevicePtr) *Args { return a.put(8, uint64(p)) }

// I32 appends an int.
func (a *Args) I32(v int) *Args { return a.put(4, uint64(uint32(int32(v)))) }

// F32 appends a float.
func (a *Args) F32(v float32) *Args { return a.put(4, uint64(math.Float32bits(v))) }

// Function is a kernel entry point in a loaded module.
type Function struct {
	ctx      *Context
	h        uintptr
	Name     string
	maxSmem  int  // dynamic shared memory limit raised so far
	carveout bool // preferMaxShared done
}

// Launch enqueues f on s. Errors name the kernel.
func (s *Stream) Launch(f *Function, grid, block Dim3, smem int, a *Args) error {
	if a.err != nil {
		return fmt.Errorf("launch %s: %w", f.Name, a.err)
	}
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 {
		return fmt.Errorf("cuda: cuLaunchKernel(%s): empty grid %v", f.Name, grid)
	}
	r := s.ctx.drv.api.launch(s.ctx.h, f.h, grid, block, smem, s.h, a.buf[:], a.offs[:a.na], s.pdl && !s.afterWait)
	s.afterWait = false
	return s.ctx.check("cuLaunchKernel", f.Name, r)
}

// Function attributes (CUfunction_attribute).
const (
	funcAttrNumRegs         = 4
	funcAttrLocalBytes      = 3
	funcAttrMaxDynamicSmem  = 8
	funcAttrStaticSmemBytes = 1
	funcAttrCarveout        = 9 // CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
)

// Resources reports a kernel's registers per thread, local (spill) bytes per
// thread and static shared memory bytes.
func (f *Function) Resources() (regs, local, smem int, err error) {
	api := f.ctx.drv.api
	var r int
	if regs, r = api.funcGetAttribute(f.ctx.h, f.h, funcAttrNumRegs); r != 0 {
		return 0, 0, 0, f.ctx.check("cuFuncGetAttribute", f.Name, r)
	}
	if local, r = api.funcGetAttribute(f.ctx.h, f.h, funcAttrLocalBytes); r != 0 {
		return 0, 0, 0, f.ctx.check("cuFuncGetAttribute", f.Name, r)
	}
	if smem, r = api.funcGetAttribute(f.ctx.h, f.h, funcAttrStaticSmemBytes); r != 0 {
		return 0, 0, 0, f.ctx.check("cuFuncGetAttribute", f.Name, r)
	}
	return regs, local, smem, nil
}

// preferMaxShared asks for the largest shared-memory carveout for f (once),
// so an SM holds as many of its CTAs as their shared memory allows.
func (f *Function) preferMaxShared() error {
	f.ctx.fnMu.Lock()
	defer f.ctx.fnMu.Unlock()
	if f.carveout {
		return nil
	}
	if err := f.ctx.check("cuFuncSetAttribute", f.Name, f.ctx.drv.api.funcSetAttribute(f.ctx.h, f.h, funcAttrCarveout, 100)); err != nil {
		return err
	}
	f.carveout = true
	return nil
}

// SetMaxDynamicSmem allows launches of f with up to n bytes of dynamic shared memory.
func (f *Function) SetMaxDynamicSmem(n int) error {
	if err := f.ctx.check("cuFuncSetAttribute", f.Name, f.ctx.drv.api.funcSetAttribute(f.ctx.h, f.h, funcAttrMaxDynamicSmem, n)); err != nil {
		return err
	}
	f.maxSmem = n
	return nil
}

// I64 appends a 64-bit int.
func (a *Args) I64(v int64) *Args { return a.put(8, uint64(v)) }
