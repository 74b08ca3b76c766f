//go:build !megamoe_emu

package cuda

import (
	"fmt"
	"os"
)

// Without the megamoe_emu tag the emulator (cuda/ptxemu) is not linked in,
// so shipped binaries do not carry it; asking for it is an error, not a
// silent fall-back to the real driver.
func openEmuDriver() (driverAPI, error) {
	return nil, fmt.Errorf("cuda: %s=%s asks for the PTX emulator, but this binary was built without it; build with -tags %s",
		EmulatorEnv, os.Getenv(EmulatorEnv), EmulatorTag)
}

func isEmuDriver(driverAPI) bool { return false }
