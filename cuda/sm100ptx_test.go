package cuda

import (
	"strings"
	"testing"
)

// Every sm_100a fixture was generated from the kernel sources as they are:
// a source (or included header) change without `gpucheck --compile-only
// --arch sm_100a --ptx-out cuda/kernels/sm100` fails here.
func TestSM100FixturesFresh(t *testing.T) {
	for _, name := range SM100Kernels {
		f, err := LoadSM100Fixture(name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := KernelSourceHash(name)
		if err != nil {
			t.Fatal(err)
		}
		if f.SourceHash != want {
			t.Errorf("%s: fixture built from sources %s, they are now %s: regenerate with "+
				"go run ./cmd/gpucheck --compile-only --arch sm_100a --ptx-out cuda/kernels/sm100", name, f.SourceHash[:12], want[:12])
		}
		if !strings.Contains(f.PTX, "\n.target sm_100a") || !strings.Contains(f.PTX, "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale") {
			t.Errorf("%s: fixture is not sm_100a PTX with the block-scaled MMA", name)
		}
		if f.Provisional {
			t.Logf("%s: provisional fixture (NVRTC %s); regenerate with NVRTC 13", name, f.NVRTC)
		}
	}
	if _, err := ParseSM100Fixture("//\n.version 8.7\n"); err == nil {
		t.Error("a text without the fixture header parsed")
	}
}

// The hash covers the included headers, not only the .cu file.
func TestKernelSourceHashIncludes(t *testing.T) {
	a, err := KernelSourceHash("moe_fp4_sm100")
	if err != nil {
		t.Fatal(err)
	}
	b, err := KernelSourceHash("linear_fp8_sm100")
	if err != nil || a == b || len(a) != 64 {
		t.Fatalf("hashes %q %q: %v", a, b, err)
	}
	src, _ := KernelSource("moe_fp4_sm100")
	if !strings.Contains(src, `#include "tc_gemm.cuh"`) {
		t.Fatal("moe_fp4_sm100.cu no longer includes tc_gemm.cuh; update this test")
	}
}
