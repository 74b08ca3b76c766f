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

func (c *Context) canPDL() bool { return c.dev.Major >= 9 && c.drv.api.hasLaunchEx() }

// SetPDL turns programmatic dependent launch on or off for later launches
// (on by default where the device and driver support it); it reports
// whether PDL is now on.
func (c *Context) SetPDL(on bool) bool {
	c.fnMu.Lock()
	defer c.fnMu.Unlock()
	c.pdl = on && c.canPDL()
	return c.pdl
}

// PDL reports whether launches use programmatic dependent launch.
func (c *Context) PDL() bool {
	c.fnMu.Lock()
	defer c.fnMu.Unlock()
	return c.pdl
}
