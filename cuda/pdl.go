package cuda

// Programmatic dependent launch (sm_90+): every kernel is launched with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, so it may start
// while the kernel before it in the stream is still running. Each kernel
// begins with PDL_ENTRY (kernels/common.cuh): griddepcontrol.wait, which
// holds it until the previous grid has completed and its writes are
// visible, then griddepcontrol.launch_dependents, which lets the next
// kernel be scheduled. What overlaps is the next kernel's launch and CTA
// setup with this kernel's run and tail: at most two grids are live, the
// running one and the waiting one. Anything a kernel does before its wait
// may touch only memory no earlier kernel writes (weights).

// The mode belongs to a stream: the kernels of one stream form the chain
// that griddepcontrol orders, and another stream's work is unaffected.

// CanPDL reports whether the device and driver support programmatic
// dependent launch.
func (c *Context) CanPDL() bool { return c.dev.Major >= 9 && c.drv.api.hasLaunchEx() }

// SetPDL turns programmatic dependent launch on or off for the stream's
// later launches (on by default where supported); it reports whether PDL is
// now on. Like launches, it is for the goroutine that owns the stream.
func (s *Stream) SetPDL(on bool) bool {
	s.pdl = on && s.ctx.CanPDL()
	return s.pdl
}

// PDL reports whether the stream's launches use programmatic dependent launch.
func (s *Stream) PDL() bool { return s.pdl }
