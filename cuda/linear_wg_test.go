package cuda

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// TestWGVariants: the Go table matches the kernel source's WG_KERNEL list,
// every variant fits an H100/H200's 227 KB of shared memory (PathWG at
// today's 197,728 bytes), every staged variant has a direct one of the same
// tile to fall back to, and every shape's pick names a variant.
func TestWGVariants(t *testing.T) {
	src, err := KernelSource("linear_fp8_wg")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^WG_KERNEL\((\w+), (\d+), (\d+), (true|false)\)$`).FindAllStringSubmatch(src, -1) {
		got = append(got, fmt.Sprintf("%s %s %s %s", m[1], m[2], m[3], m[4]))
	}
	var want []string
	for _, v := range wgVariants {
		if k := fmt.Sprintf("%s %d %d %s", v.fn, v.bn, v.stages, strconv.FormatBool(v.bulk)); !slices.Contains(want, k) {
			want = append(want, k)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("kernel source variants %q, Go table %q", got, want)
	}
	const optin = 227 * 1024
	for _, v := range wgVariants {
		if v.smem() > optin {
			t.Errorf("%s: %d bytes of shared memory, more than %d", v.path, v.smem(), optin)
		}
		if v.bn%64 != 0 || v.bn > 256 || v.stages < 2 {
			t.Errorf("%s: %d columns, %d stages", v.path, v.bn, v.stages)
		}
		if v.bulk && !slices.ContainsFunc(wgVariants, func(d wgVariant) bool { return d.bn == v.bn && d.wave == v.wave && !d.bulk }) {
			t.Errorf("%s: no direct-store variant of %d columns to fall back to", v.path, v.bn)
		}
	}
	if v, _ := wgVariantOf(PathWG); v.smem() != 197728 || v.fn != "linear_fp8_wg" || v.bn != 128 || v.bulk {
		t.Errorf("PathWG is %+v (%d bytes), want today's linear_fp8_wg", v, v.smem())
	}
	if ps := WGPaths(); ps[0] != PathWG || len(ps) != len(wgVariants) {
		t.Errorf("WGPaths() = %v", ps)
	}
	for _, p := range wgPicks {
		for _, path := range []Path{p.small, p.large} {
			if _, ok := wgVariantOf(path); !ok {
				t.Errorf("wgPicks %dx%d: no variant %q", p.n, p.k, path)
			}
		}
	}
	for _, c := range []struct {
		m, n, k int
		want    Path
	}{{512, 1024, 4096, wgPicks[0].small}, {2048, 1024, 4096, wgPicks[0].large}, {4096, 65536, 1536, wgPicks[7].large}, {4096, 1000, 128, PathWG}} {
		if got := wgPick(c.m, c.n, c.k); got != c.want {
			t.Errorf("wgPick(%d, %d, %d) = %q, want %q", c.m, c.n, c.k, got, c.want)
		}
	}
}

// TestWGKernelChoice: the variants are linear paths only.
func TestWGKernelChoice(t *testing.T) {
	c := &Context{dev: &Device{SMs: hopperSMs}}
	for _, tc := range []struct {
		k  KernelChoice
		ok bool
	}{
		{KernelChoice{Linear: PathWGN192}, true}, {KernelChoice{Linear: PathWGBulk, MoE: PathWG}, true},
		{KernelChoice{MoE: PathWGBulk}, false}, {KernelChoice{Linear: "wg-n256"}, false},
	} {
		if err := c.SetKernelChoice(tc.k); (err == nil) != tc.ok {
			t.Errorf("SetKernelChoice(%+v) = %v, want ok %v", tc.k, err, tc.ok)
		}
	}
}

// TestPlanLinearWGWave: the one-wave plan covers K exactly, never takes
// more slices than planLinearWG (whose scratch LinearFP8ScratchBytes
// sizes), and keeps every split grid within one wave.
func TestPlanLinearWGWave(t *testing.T) {
	for _, c := range []struct {
		m, n, k, sms int
		splits       int // want
	}{
		{512, 1024, 4096, 132, 4}, // Flash wq_a: planLinearWG's 5 slices are 160 CTAs
		{512, 1536, 7168, 132, 2}, // Pro wq_a: 3 slices, 144 CTAs
		{512, 512, 4096, 132, 8},  // Flash wkv: 8 slices of 16 tiles fit
		{512, 512, 7168, 132, 8},  // Pro wkv
		{4096, 1024, 4096, 132, 1},
		{300, 1032, 2048, 132, 4},
		{130, 520, 4224, 132, 7},
		{128 * 80, 128, 4096, 132, 1}, // 80 tiles: one slice a wave
		{512, 1024, 4096, 148, 4},
	} {
		p, q := planLinearWGWave(c.m, c.n, c.k, c.sms), planLinearWG(c.m, c.n, c.k, c.sms)
		nkb, tiles := c.k/128, ceilDiv(c.n, 128)*ceilDiv(c.m, 128)
		if p.splits*p.per < nkb || (p.splits-1)*p.per >= nkb {
			t.Errorf("planLinearWGWave(%d, %d, %d, %d) = %+v: not an exact cover of %d blocks", c.m, c.n, c.k, c.sms, p, nkb)
		}
		if p.splits != c.splits || p.splits > q.splits {
			t.Errorf("planLinearWGWave(%d, %d, %d, %d) = %+v, want %d slices (planLinearWG %+v)", c.m, c.n, c.k, c.sms, p, c.splits, q)
		}
		if p.splits > 1 && p.splits*tiles > c.sms {
			t.Errorf("planLinearWGWave(%d, %d, %d, %d): %d slices x %d tiles > %d SMs", c.m, c.n, c.k, c.sms, p.splits, tiles, c.sms)
		}
	}
}
