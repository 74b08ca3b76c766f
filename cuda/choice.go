package cuda

import "fmt"

// Path names one kernel family of a GEMM launcher.
type Path string

// GEMM paths. PathAuto lets the launcher's planner choose.
const (
	PathAuto  Path = ""
	PathDec   Path = "dec"   // decode-shaped mma.sync kernels (weights as the A operand)
	PathDecWG Path = "decwg" // decode-shaped sm_90a kernels fed by TMA
	PathTiled Path = "tiled" // mma.sync tiles through shared memory (any sm_80+)
	PathWG    Path = "wg"    // sm_90a TMA + wgmma kernels
	// PathTC (tc.go): sm_100a tcgen05 kernels
)

// Decode FP8 linear paths (a linear path only): PathDecSK forces
// linear_fp8_dsk (K split across CTAs) wherever it can run; PathDecCTA is the
// planner without it (linear_fp8_dec or the TMA decode kernels, K split
// inside a CTA only).
const (
	PathDecSK  Path = "decsk"
	PathDecCTA Path = "deccta"
)

// PathDecF16 is moe_fp4_decf16, the MoE decode kernel that unpacks FP4 without
// conversion instructions, on lists of 8-row tiles (a MoE path only).
const PathDecF16 Path = "decf16"

// PathDecMap is moe_fp4_dec's CTA finding its own tile from the offsets
// (moe_fp4_decm), on lists of 8-row tiles: no tile_map launch (a MoE path only).
const PathDecMap Path = "decmap"

// PathDecPre is decmap whose CTAs find their tile and issue their first weight
// loads before the programmatic-launch wait (moe_fp4_decp), on tile lists
// whose offsets are settled (MoETileList.Settled); on others it runs decmap.
const PathDecPre Path = "decpre"

// decMapPath reports whether a MoE path finds its tiles in the kernel.
func decMapPath(p Path) bool { return p == PathDecMap || p == PathDecPre }

// Sparse attention paths (SparseAttnF32): one CTA per (row, head group), the
// keys split over an 8-CTA cluster (sm_90+), or over a plain grid whose
// last CTA combines the splits.
const (
	PathAttnRow     Path = "row"
	PathAttnCluster Path = "cluster"
	PathAttnSplit   Path = "split"
)

// KernelChoice forces the GEMM paths of a context (benchmarks and tests that
// compare the paths on one shape); the zero value lets the planners choose.
type KernelChoice struct {
	Linear     Path // LinearFP8
	MoE        Path // MoEFP4
	Attn       Path // SparseAttnF32
	AttnSplits int  // with Attn PathAttnSplit: CTAs per (row, head group), 1..64 (0: the planner's)
}

// SetKernelChoice forces the GEMM paths for later launches on this context
// where they apply (the decode kernels take only decode shapes; a forced
// wgmma path on a device without TMA is an error at launch).
func (c *Context) SetKernelChoice(k KernelChoice) error {
	if k.Linear == PathDecF16 || decMapPath(k.Linear) {
		return fmt.Errorf("cuda: kernel path %q is a MoE path, not a linear one", k.Linear)
	}
	if _, ok := wgVariantOf(k.MoE); ok && k.MoE != PathWG || k.MoE == PathDecSK || k.MoE == PathDecCTA {
		return fmt.Errorf("cuda: kernel path %q is a linear path, not a MoE one", k.MoE)
	}
	for _, p := range []Path{k.Linear, k.MoE} {
		if _, ok := wgVariantOf(p); ok {
			continue
		}
		switch p {
		case PathAuto, PathDec, PathDecF16, PathDecMap, PathDecPre, PathDecSK, PathDecCTA, PathDecWG, PathTiled, PathTC:
		default:
			return fmt.Errorf("cuda: kernel path %q (want dec, decf16, decmap, decpre, decsk, deccta, decwg, tiled, tc or a wgmma variant: %v)", p, WGPaths())
		}
	}
	switch k.Attn {
	case PathAuto, PathAttnRow, PathAttnCluster, PathAttnSplit:
	default:
		return fmt.Errorf("cuda: sparse attention path %q (want row, cluster or split)", k.Attn)
	}
	if k.AttnSplits < 0 || k.AttnSplits > attnMaxSplits || (k.AttnSplits > 0 && k.Attn != PathAttnSplit) {
		return fmt.Errorf("cuda: %d attention splits (0..%d, with path %q only)", k.AttnSplits, attnMaxSplits, PathAttnSplit)
	}
	c.fnMu.Lock()
	c.choice = k
	c.fnMu.Unlock()
	return nil
}

// KernelChoice returns the context's kernel choice (SetKernelChoice).
func (c *Context) KernelChoice() KernelChoice { return c.kernelChoice() }

func (c *Context) kernelChoice() KernelChoice {
	c.fnMu.Lock()
	defer c.fnMu.Unlock()
	return c.choice
}

// LinearPaths are the paths LinearFP8 can take for m rows on this device
// (the one it picks by itself first).
func (c *Context) LinearPaths(m, n, k int) []Path {
	var ps []Path
	if c.HasTC() {
		ps = append(ps, PathTC)
	}
	if m >= wgMinRow && c.HasTMA() {
		pick := wgPick(m, n, k) // the planner's variant, then the others
		ps = append(ps, pick)
		for _, p := range WGPaths() {
			if p != pick {
				ps = append(ps, p)
			}
		}
	}
	_, dsk := planDSK(m, n, k, c.dev.SMs)
	if dsk && dskWins(m, n, k, c.dev.SMs) {
		ps = append(ps, PathDecSK)
	}
	if planLinear(m, n, k, c.dev.SMs).dec {
		switch {
		case c.HasTMA() && tdecWins(n, k):
			ps = append(ps, PathDecWG, PathDec)
		case c.HasTMA():
			ps = append(ps, PathDec, PathDecWG)
		default:
			ps = append(ps, PathDec)
		}
	}
	if dsk && !dskWins(m, n, k, c.dev.SMs) {
		ps = append(ps, PathDecSK)
	}
	ps = append(ps, PathTiled)
	if m < wgMinRow && c.HasTMA() {
		ps = append(ps, PathWG)
	}
	return ps
}

// MoEPaths are the paths MoEFP4 can take for a shape on this device (the one
// it picks by itself first).
func (c *Context) MoEPaths(sh MoEShape) []Path {
	if c.moeTC(sh) {
		return []Path{PathTC, PathDec}
	}
	if moeDecode(sh) {
		if decF16Fits(sh) {
			return []Path{PathDecMap, PathDecPre, PathDec, PathDecF16}
		}
		return []Path{PathDec}
	}
	if c.HasTMA() {
		return []Path{PathWG, PathTiled, PathDec}
	}
	return []Path{PathTiled, PathDec}
}
