package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestShippedDeps: the server binary links no test tooling. The emulator is
// behind the megamoe_emu tag, the op checker and the kernel checks live in
// packages only cmd/gpucheck, cmd/bench and tests import.
func TestShippedDeps(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go tool is not on PATH (%v): cannot list the dependencies", err)
	}
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", ".").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list -deps: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	const mod = "github.com/megamoe/megamoe/"
	// The listing must be the real one: the server and the CUDA backend.
	for _, want := range []string{mod + "cmd/serve", mod + "backend/gpu", mod + "cuda"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps lacks %s; got %d packages:\n%s", want, len(deps), out)
		}
	}
	for _, c := range []struct{ pkg, why string }{
		{mod + "cuda/ptxemu", "the PTX emulator (only with -tags megamoe_emu)"},
		{mod + "cuda/kcheck", "the kernel-vs-CPU checks (cmd/gpucheck, cmd/bench)"},
		{mod + "cuda/cpuref", "the kernels' CPU twins (kcheck, tests)"},
		{mod + "backend/gpu/opcheck", "the op checker (cmd/gpucheck, tests)"},
	} {
		if slices.Contains(deps, c.pkg) {
			t.Errorf("cmd/serve depends on %s, %s", c.pkg, c.why)
		}
	}
}
