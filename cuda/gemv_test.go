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

// TestGemvRowsVariants: the planner's gemvr pick by row count (none outside
// 2..8), which shapes it takes, and every variant exists in linear_f32.cu.
func TestGemvRowsVariants(t *testing.T) {
	for _, c := range []struct {
		m    int
		pick GemvRows
	}{{0, GemvRows{}}, {1, GemvRows{}}, {2, GemvRows{2, 4, 2}}, {3, GemvRows{4, 4, 2}}, {4, GemvRows{4, 4, 2}},
		{5, GemvRows{8, 4, 1}}, {8, GemvRows{8, 4, 1}}, {9, GemvRows{}}} {
		gs := GemvRowsVariants(c.m)
		var got GemvRows // none
		if len(gs) > 0 {
			got = gs[0]
		}
		if got != c.pick {
			t.Errorf("GemvRowsVariants(%d) starts with %v, want %v", c.m, got, c.pick)
		}
		for _, g := range gs {
			if g.MM < c.m {
				t.Errorf("GemvRowsVariants(%d) has %v (at most %d rows)", c.m, g, g.MM)
			}
		}
	}
	head := LinearShape{M: 3, N: 129280, K: 4096, R: 129280, LdX: 4096, Format: WeightBF16}
	for _, c := range []struct {
		name string
		edit func(*LinearShape)
		g    GemvRows
		ok   bool
	}{
		{"head", func(*LinearShape) {}, GemvRows{4, 4, 2}, true},
		{"fp32 weights", func(s *LinearShape) { s.Format = WeightF32 }, GemvRows{4, 4, 2}, false},
		{"more rows than MM", func(s *LinearShape) { s.M = 5 }, GemvRows{4, 4, 2}, false},
		{"one row", func(s *LinearShape) { s.M = 1 }, GemvRows{2, 4, 2}, false},
		{"groups of 2 rows, 4 a warp", func(s *LinearShape) { s.N, s.R = 1026, 2 }, GemvRows{4, 4, 2}, false},
		{"groups of 2 rows, 2 a warp", func(s *LinearShape) { s.N, s.R = 1026, 2 }, GemvRows{4, 2, 2}, true},
		{"a variant not compiled", func(*LinearShape) {}, GemvRows{4, 8, 2}, false},
	} {
		sh := head
		c.edit(&sh)
		if got := gemvRowsFits(c.g, sh); got != c.ok {
			t.Errorf("%s: gemvRowsFits(%v, %+v) = %v, want %v", c.name, c.g, sh, got, c.ok)
		}
	}
	src, err := KernelSource("linear_f32")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gemvRowsKernels {
		if decl := fmt.Sprintf("GEMVR_KERNEL(gemvr_%v, %d, %d, %d)", g, g.MM, g.RW, g.NB); !strings.Contains(src, decl) {
			t.Errorf("linear_f32.cu lacks %s", decl)
		}
	}
	if err := LinearF32Rows(nil, 0, 0, 0, head, false, GemvRows{2, 4, 2}); err == nil {
		t.Error("LinearF32Rows ran 3 rows on a 2-row kernel")
	}
}
