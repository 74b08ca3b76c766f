package cuda

import (
	"strings"
	"testing"
)

// testArchs are the targets the loaded NVRTC can be expected to support.
func testArchs(n *NVRTC) []string {
	archs := []string{"sm_80"}
	if n.Major >= 12 {
		archs = append(archs, "sm_90a")
	}
	if n.Major > 12 || (n.Major == 12 && n.Minor >= 8) {
		archs = append(archs, "sm_100a")
	}
	return archs
}

func TestCompileEmbeddedKernels(t *testing.T) {
	n, err := LoadNVRTC()
	if err != nil {
		t.Skipf("NVRTC not loadable (set MEGAMOE_NVRTC to a libnvrtc.so): %v", err)
	}
	t.Logf("NVRTC %d.%d from %s", n.Major, n.Minor, n.Path())
	for _, name := range KernelSources() {
		src, err := KernelSource(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, arch := range testArchs(n) {
			cubin, log, err := n.Compile(src, arch)
			if err != nil {
				t.Errorf("%s %s: %v", name, arch, err)
				continue
			}
			if len(cubin) < 64 || string(cubin[1:4]) != "ELF" {
				t.Errorf("%s %s: not an ELF cubin (%d bytes)", name, arch, len(cubin))
			}
			if strings.Contains(log, "warning") {
				t.Logf("%s %s log:\n%s", name, arch, log)
			}
		}
	}
}

func TestCompileErrorCarriesLog(t *testing.T) {
	n, err := LoadNVRTC()
	if err != nil {
		t.Skipf("NVRTC not loadable: %v", err)
	}
	_, _, err = n.Compile(`extern "C" __global__ void broken() { undefined_symbol(); }`, "sm_80")
	if err == nil {
		t.Fatal("compiling a broken kernel succeeded")
	}
	if !strings.Contains(err.Error(), "nvrtcCompileProgram") || !strings.Contains(err.Error(), "undefined_symbol") {
		t.Errorf("error lacks call name or log: %v", err)
	}
}

func TestKernelSourcesEmbedded(t *testing.T) {
	want := []string{"attn_f32", "hc_f32", "linear_bf16", "linear_f32", "linear_fp8", "linear_fp8_dsk", "linear_fp8_sm100", "linear_fp8_tdec", "linear_fp8_tdec3", "linear_fp8_wg", "moe_fp4", "moe_fp4_dec", "moe_fp4_decf16", "moe_fp4_sm100", "moe_fp4_wg", "moe_fused", "moe_route", "ops_f32", "quant", "rmsnorm", "sample", "swiglu"}
	got := KernelSources()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("KernelSources() = %v, want %v", got, want)
	}
}
