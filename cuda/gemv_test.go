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

// TestPlanBF16Dec: linear_bf16_dec's K slices at the wo_a shapes (a wave of
// two CTAs an SM on 132 SMs) and where K does not split.
func TestPlanBF16Dec(t *testing.T) {
	for _, c := range []struct {
		m, n, k, kc, splits int
		ok                  bool
	}{
		{1, 8192, 4096, 1024, 4, true},    // Flash: 64 row tiles x 4
		{8, 16384, 4096, 2048, 2, true},   // Pro: 128 x 2
		{17, 16384, 4096, 512, 8, true},   // four token tiles: slices of at most 512
		{1, 1024, 384, 384, 1, true},      // 384 does not halve into 128-multiples
		{20, 128, 640, 0, 0, false},       // 640 > 512 and does not halve
		{8, 129280, 4096, 2048, 2, true},  // head: 1010 row tiles x 2
		{8, 1 << 18, 4096, 0, 0, false},   // a split grid with more row tiles than counters
		{8, 1 << 18, 2048, 2048, 1, true}, // one slice: no counters
		{1, 1024, 200, 0, 0, false},
	} {
		kc, splits, ok := planBF16Dec(c.m, c.n, c.k, hopperSMs)
		if ok != c.ok || ok && (kc != c.kc || splits != c.splits) {
			t.Errorf("planBF16Dec(%d, %d, %d) = %d x %d, %v; want %d x %d, %v", c.m, c.n, c.k, kc, splits, ok, c.kc, c.splits, c.ok)
		}
	}
	sh := LinearShape{M: 1, N: 1024, K: 256, R: 192, LdX: 256 * 6, Format: WeightFP8Block}
	if BF16DecFits(sh, 0, 0) {
		t.Error("linear_bf16_dec took groups of 192 rows (tiles of 128)")
	}
}
