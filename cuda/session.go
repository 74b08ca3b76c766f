package cuda

import "fmt"

// Session is one device's context with a stream: what a command-line tool
// (gpucheck, bench kernels) needs to launch kernels.
type Session struct {
	Driver *Driver
	Device *Device
	Ctx    *Context
	S      *Stream
}

// OpenSession loads the driver and opens device ordinal with one stream.
func OpenSession(ordinal int) (*Session, error) {
	drv, err := Load()
	if err != nil {
		return nil, err
	}
	dev, err := drv.Device(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := dev.NewContext()
	if err != nil {
		return nil, err
	}
	s, err := ctx.NewStream()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	return &Session{Driver: drv, Device: dev, Ctx: ctx, S: s}, nil
}

// Close releases the stream and the context.
func (s *Session) Close() {
	s.S.Close()
	s.Ctx.Close()
}

// LoadModules compiles (or loads from the disk cache) every embedded kernel
// module, so that later timings exclude compilation.
func (c *Context) LoadModules() error {
	for _, name := range KernelSources() {
		if _, err := c.Module(name); err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
	}
	return nil
}
