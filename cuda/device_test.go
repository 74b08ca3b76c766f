package cuda

import "testing"

// testDevice opens device 0 (the emulator under MEGAMOE_EMU) with a stream,
// skipping without one.
func testDevice(t *testing.T) (*Context, *Stream) {
	t.Helper()
	drv, err := Load()
	if err != nil {
		t.Skipf("no CUDA driver: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device (count %d): %v", n, err)
	}
	dev, err := drv.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if err := ctx.Close(); err != nil {
			t.Error(err)
		}
	})
	return ctx, s
}

// OpenTestDevice is testDevice for the external tests (package cuda_test).
var OpenTestDevice = testDevice
