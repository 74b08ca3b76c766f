//go:build !megamoe_emu

package cuda

import (
	"strings"
	"testing"
)

// TestEmulatorNeedsTag: without the tag, MEGAMOE_EMU must fail Load with a
// message naming the tag rather than fall back to a real driver.
func TestEmulatorNeedsTag(t *testing.T) {
	for _, mode := range []string{"1", "sm_90a"} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv(EmulatorEnv, mode)
			d, err := Load()
			if err == nil {
				t.Fatalf("Load with %s=%s succeeded (%s); want an error", EmulatorEnv, mode, d.Path())
			}
			if !strings.Contains(err.Error(), "-tags "+EmulatorTag) {
				t.Errorf("error %q does not name the build tag %s", err, EmulatorTag)
			}
		})
	}
}
