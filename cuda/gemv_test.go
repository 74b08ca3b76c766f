package cuda

import (
	"fmt"
	"strings"
	"testing"
)

// TestGemvLaunch: the decode GEMV's rows per CTA at the DeepSeek-V4 shapes,
// and every kernel the launcher names exists in linear_f32.cu for its format
// and row bound.
func TestGemvLaunch(t *testing.T) {
	for _, c := range []struct{ n, lrpc int }{
		{129280, 3}, // head: 16160 CTAs of 8 rows
		{8192, 2},   // grouped output projection: 2048 CTAs, 2 warps a row
		{4096, 1}, {2048, 0}, {1024, 0}, {512, 0}, {256, 0}, {7, 0}, {1 << 20, 3},
	} {
		if got := gemvLogRowsPerCTA(c.n); got != c.lrpc {
			t.Errorf("gemvLogRowsPerCTA(%d) = %d, want %d", c.n, got, c.lrpc)
		}
	}
	src, err := KernelSource("linear_f32")
	if err != nil {
		t.Fatal(err)
	}
	for i, mm := range []int{1, 8} {
		for f, name := range gemvKernels[i] {
			if decl := fmt.Sprintf("GEMV_KERNEL(%s, %d, %d,", name, f, mm); !strings.Contains(src, decl) {
				t.Errorf("linear_f32.cu lacks %s", decl)
			}
		}
	}
	sh := LinearShape{M: 1, N: 8, K: 8, R: 8, LdX: 8, Format: WeightNVFP4 + 1}
	if err := LinearF32Kernel(nil, 0, 0, 0, 0, sh, false); err == nil {
		t.Error("linear_f32 accepted an unknown weight format")
	}
}
