package cuda

import (
	"errors"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func TestClassSize(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{1, 512}, {512, 512}, {513, 640}, {1024, 1024}, {1025, 1280}, {1536, 1536}, {1537, 1792}, {3000, 3072}, {1 << 30, 1 << 30},
	} {
		if got := classSize(tc.n); got != tc.want {
			t.Errorf("classSize(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
	for n := 1; n < 1<<16; n += 37 {
		c := classSize(n)
		if c < n || (n > 512 && float64(c) > 1.25*float64(n)+1) {
			t.Fatalf("classSize(%d) = %d: outside [n, 1.25n]", n, c)
		}
	}
}

func TestArgsLayout(t *testing.T) {
	a := new(Args).I32(7).Ptr(0x1122334455667788).F32(1.5).I32(-1)
	if a.err != nil || a.n != 24 {
		t.Fatalf("n = %d, err = %v; want 24 bytes (int, pad, ptr, float, int)", a.n, a.err)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&a.buf[0])), 24)
	if b[0] != 7 || b[8] != 0x88 || b[15] != 0x11 {
		t.Errorf("bad packing % x", b)
	}
	if f := math.Float32frombits(uint32(b[16]) | uint32(b[17])<<8 | uint32(b[18])<<16 | uint32(b[19])<<24); f != 1.5 {
		t.Errorf("float at 16 = %v", f)
	}
	var m TensorMap
	for i := range m {
		m[i] = uint64(i + 1)
	}
	tm := new(Args).I32(3).Map(&m).I32(4)
	if tm.err != nil || tm.na != 3 || tm.offs[1] != 64 || tm.offs[2] != 192 || tm.buf[8] != 1 || tm.buf[23] != 16 {
		t.Errorf("tensor map parameter: err %v, %d params at %v, words %v", tm.err, tm.na, tm.offs[:tm.na], tm.buf[8:24])
	}
	big := new(Args)
	for i := 0; i < 70; i++ {
		big.Ptr(0)
	}
	if big.err == nil {
		t.Error("oversized argument block accepted")
	}
}

func TestArchFor(t *testing.T) {
	for _, tc := range []struct {
		maj, min int
		want     string
	}{{8, 0, "sm_80"}, {8, 9, "sm_89"}, {9, 0, "sm_90a"}, {10, 0, "sm_100a"}} {
		if got := ArchFor(tc.maj, tc.min); got != tc.want {
			t.Errorf("ArchFor(%d,%d) = %s, want %s", tc.maj, tc.min, got, tc.want)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	e := &Error{Call: "cuLaunchKernel", What: "rmsnorm_bf16", Code: 1, Name: "CUDA_ERROR_INVALID_VALUE"}
	if got := e.Error(); got != "cuda: cuLaunchKernel(rmsnorm_bf16): CUDA_ERROR_INVALID_VALUE" {
		t.Errorf("Error() = %q", got)
	}
	oom := error(&Error{Call: "cuMemAlloc", Code: errOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"})
	if !IsOutOfMemory(oom) || IsOutOfMemory(errors.New("x")) {
		t.Error("IsOutOfMemory misclassifies")
	}
}

func TestLoadWithoutDriverFailsCleanly(t *testing.T) {
	t.Setenv("MEGAMOE_LIBCUDA", "/nonexistent/libcuda.so.1")
	d, err := Load()
	if err == nil {
		t.Skipf("a CUDA driver is present (%s)", d.Path())
	}
	t.Logf("Load() without driver: %v", err)
}

func TestLauncherShapeChecks(t *testing.T) {
	// Bad shapes are rejected before any driver call, so a nil stream is fine.
	for name, err := range map[string]error{
		"rmsnorm odd":  RMSNorm(nil, 0, 0, 0, 1, 7, 1e-6),
		"quant cols":   QuantFP8Act(nil, 0, 0, 0, 1, 100),
		"linear k":     LinearFP8(nil, 0, 0, 0, 0, 0, 1, 8, 100, 0),
		"linear n":     LinearFP8(nil, 0, 0, 0, 0, 0, 1, 7, 128, 0),
		"moe k":        MoEFP4(nil, 0, 0, 0, 0, 0, 0, 0, MoEShape{Experts: 8, Rows: 1, N: 8, K: 64}, 0),
		"moe nvfp4 gs": MoEFP4(nil, 0, 0, 0, 0, 0, 0, 0, MoEShape{Experts: 8, Rows: 1, N: 8, K: 128, Format: NVFP4}, 0),
		"swiglu ld":    SwiGLU(nil, 0, 0, 0, 2, 0, 1, 4, 10),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := LinearFP8(nil, 0, 0, 0, 0, 0, 0, 8, 128, 0); err != nil {
		t.Errorf("m = 0 must be a no-op: %v", err)
	}
}

// hopperSMs is the SM count of the H100 and H200 (SXM), which the plans
// below were tuned on.
const hopperSMs = 132

// hopper is the H100's and H200's SM count and shared memory.
var hopper = &Device{SMs: hopperSMs, SmemOptin: 227 * 1024, SmemSM: 228 * 1024}

// planStream is a stream of a device with sms SMs and no driver, for the
// planners' host-side entry points.
func planStream(sms int) *Stream { return &Stream{ctx: &Context{dev: &Device{SMs: sms}}} }

// TestSplitK: every split covers a non-empty run of K blocks and together
// they cover all; decode shapes split, prefill shapes and big grids do not;
// decode-shaped MoE lists take moe_fp4_dec.
func TestSplitK(t *testing.T) {
	for _, c := range []struct {
		tiles, nkb, sms int
		split           bool
	}{
		{8, 32, 132, true}, {1, 1, 132, false}, {2, 8, 132, true}, {131, 64, 132, true}, {132, 64, 132, false},
		{4096, 64, 132, false}, {7, 56, 132, true}, {140, 64, 148, true}, {148, 64, 148, false}, {100, 64, 108, true},
	} {
		sp, per := splitK(c.tiles, c.nkb, c.sms)
		if sp < 1 || per < 1 || sp*per < c.nkb || (sp-1)*per >= c.nkb {
			t.Errorf("splitK(%d, %d, %d) = %d x %d blocks: not an exact cover", c.tiles, c.nkb, c.sms, sp, per)
		}
		if (sp > 1) != c.split {
			t.Errorf("splitK(%d, %d, %d) = %d splits, want split %v", c.tiles, c.nkb, c.sms, sp, c.split)
		}
	}
	// linear_fp8_wg splits below 2/3 of the SMs in tiles.
	for _, c := range []struct {
		m, sms int
		split  bool
	}{{128 * 87, 132, true}, {128 * 88, 132, false}, {128 * 98, 148, true}, {128 * 99, 148, false}} {
		if p := planLinearWG(c.m, 128, 4096, c.sms); (p.splits > 1) != c.split {
			t.Errorf("planLinearWG(%d, 128, 4096, %d) = %+v, want split %v", c.m, c.sms, p, c.split)
		}
	}
	s := planStream(hopperSMs)
	if LinearFP8ScratchBytes(s, 1, 1024, 4096) != dskScratchBytes(1, 1024, 4096, hopperSMs) || LinearFP8ScratchBytes(s, 17, 1024, 4096) == 0 || LinearFP8ScratchBytes(s, 4096, 1024, 4096) != 0 {
		t.Error("linear_fp8 split: want scratch at m=17 and linear_fp8_dsk's partials only")
	}
	for _, c := range []struct {
		m, n, k    int
		dec, split bool
	}{{1, 1024, 4096, true, false}, {16, 65536, 1536, true, false}, {1, 32768, 1024, true, false}, {17, 1024, 4096, false, true}, {65, 1024, 4096, false, false}, {8, 512, 128, true, false}, {1, 1 << 20, 8192, false, false}} {
		p := planLinear(c.m, c.n, c.k, hopperSMs)
		if p.dec != c.dec || (p.splits > 1) != c.split || p.splits*p.per < c.k/128 || (p.splits-1)*p.per >= c.k/128 {
			t.Errorf("planLinear(%d, %d, %d) = %+v, want decode kernel %v, split %v", c.m, c.n, c.k, p, c.dec, c.split)
		}
	}
	for _, c := range []struct {
		sh         MoEShape
		dec, split bool // on the tiled mma.sync path where not decode-shaped
		bm         int  // wgmma token tile, or the decode kernel's
	}{
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, true, true, 8},           // decode, batch 1
		{MoEShape{Experts: 256, Rows: 64 * 6, N: 4096, K: 4096}, true, false, 8},     // 64 tokens
		{MoEShape{Experts: 256, Rows: 2048, N: 4096, K: 4096}, true, false, 8},       // 8 rows per expert
		{MoEShape{Experts: 256, Rows: 512 * 6, N: 4096, K: 4096}, true, false, 16},   // 12 rows per expert: 16-row tiles
		{MoEShape{Experts: 256, Rows: 1024 * 6, N: 4096, K: 4096}, false, false, 32}, // 24 rows per expert
		{MoEShape{Experts: 256, Rows: 4096 * 6, N: 4096, K: 4096}, false, false, 128},
		{MoEShape{Experts: 8, Rows: 600, N: 256, K: 256}, false, true, 128},
		{MoEShape{Experts: 48, Rows: 1500, N: 256, K: 256}, false, true, 32},
		{MoEShape{Experts: 16, Rows: 300, N: 256, K: 256}, false, true, 32}, // 19 rows per expert
	} {
		paths := moePaths(c.sh)
		if (paths[0] == PathDec) != c.dec {
			t.Errorf("moePaths(%+v) = %v, want decode %v", c.sh, paths, c.dec)
		}
		p := planMoE(c.sh, paths[0], hopperSMs)
		if (p.splits > 1) != c.split || p.splits*p.per < c.sh.K/128 || (p.splits-1)*p.per >= c.sh.K/128 {
			t.Errorf("planMoE(%+v, %s) = %+v, want split %v", c.sh, paths[0], p, c.split)
		}
		sb := MoEScratchBytes(s, c.sh)
		for _, path := range paths {
			if need := planMoE(c.sh, path, hopperSMs).scratchBytes(c.sh); sb < need {
				t.Errorf("MoEScratchBytes(%+v) = %d, path %s needs %d", c.sh, sb, path, need)
			}
		}
		if c.dec {
			if p.bm != c.bm || p.colsPC != 64 {
				t.Errorf("planMoE(%+v, dec) = %+v, want %d-row tiles", c.sh, p, c.bm)
			}
			continue
		}
		wg := planMoE(c.sh, PathWG, hopperSMs)
		if wg.bm != c.bm || wg.splits != 1 || wg.maxTiles < ceilDiv(c.sh.Rows, wg.bm) {
			t.Errorf("planMoE(%+v, wg) = %+v, want bm %d unsplit", c.sh, wg, c.bm)
		}
		if sb < wg.tileBytes()+2*c.sh.Rows*c.sh.K {
			t.Errorf("MoEScratchBytes(%+v) = %d lacks the bf16 activations", c.sh, sb)
		}
		if smem := moeWGSmem(wg.bm); smem > hopper.SmemOptin {
			t.Errorf("moe_fp4_wg%d needs %d bytes of shared memory", wg.bm, smem)
		}
	}
}

// TestMoEDecF16Path: a forced decf16 runs moe_fp4_decf16 on decode lists of
// 8-row tiles with moe_fp4_dec's plan (so the scratch the shape was given),
// moe_fp4_dec on 16-row ones; it is no linear path.
func TestMoEDecF16Path(t *testing.T) {
	s := planStream(hopperSMs)
	for _, c := range []struct {
		sh   MoEShape
		want Path
	}{
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, PathDecF16},                 // Flash w13, 1 token
		{MoEShape{Experts: 256, Rows: 48, N: 4096, K: 2048, Format: NVFP4}, PathDecF16}, // w2, 8 tokens
		{MoEShape{Experts: 384, Rows: 48, N: 6144, K: 7168}, PathDecF16},                // Pro w13, 8 tokens
		{MoEShape{Experts: 256, Rows: 2048, N: 4096, K: 4096}, PathDecF16},              // 8 rows an expert
		{MoEShape{Experts: 256, Rows: 512 * 6, N: 4096, K: 4096}, PathDec},              // 16-row tiles
	} {
		if err := s.ctx.SetKernelChoice(KernelChoice{MoE: PathDecF16}); err != nil {
			t.Fatal(err)
		}
		got := s.moePath(c.sh)
		if got != c.want {
			t.Errorf("moePath(%+v) forced decf16 = %q, want %q", c.sh, got, c.want)
		}
		if got == PathDecF16 {
			if f, d := planMoE(c.sh, PathDecF16, hopperSMs), planMoE(c.sh, PathDec, hopperSMs); f.bm != 8 || f.maxTiles != d.maxTiles || f.splits != d.splits || f.per != d.per {
				t.Errorf("planMoE(%+v): decf16 %+v, dec %+v: want the same 8-row plan", c.sh, f, d)
			}
		}
		if err := s.ctx.SetKernelChoice(KernelChoice{}); err != nil {
			t.Fatal(err)
		}
		if got := s.moePath(c.sh); got == PathDecF16 {
			t.Errorf("moePath(%+v) = decf16 without being forced", c.sh)
		}
	}
	if err := s.ctx.SetKernelChoice(KernelChoice{Linear: PathDecF16}); err == nil {
		t.Error("SetKernelChoice(Linear: decf16): no error")
	}
}

// TestMoEDecMapPath: decode lists of 8-row tiles take decmap by default
// (moe_fp4_dec's plan, so the scratch the shape was given), 16-row ones and
// a forced dec moe_fp4_dec; decmap is no linear path.
func TestMoEDecMapPath(t *testing.T) {
	s := planStream(hopperSMs)
	for _, c := range []struct {
		sh           MoEShape
		forced, want Path
	}{
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, PathAuto, PathDecMap},                 // Flash w13, 1 token
		{MoEShape{Experts: 256, Rows: 48, N: 4096, K: 2048, Format: NVFP4}, PathAuto, PathDecMap}, // w2, 8 tokens
		{MoEShape{Experts: 384, Rows: 48, N: 6144, K: 7168}, PathAuto, PathDecMap},                // Pro w13, 8 tokens
		{MoEShape{Experts: 256, Rows: 2048, N: 4096, K: 4096}, PathAuto, PathDecMap},              // 8 rows an expert
		{MoEShape{Experts: 256, Rows: 512 * 6, N: 4096, K: 4096}, PathAuto, PathDec},              // 16-row tiles
		{MoEShape{Experts: 256, Rows: 512 * 6, N: 4096, K: 4096}, PathDecMap, PathDec},
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, PathDec, PathDec},
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, PathDecMap, PathDecMap},
		{MoEShape{Experts: 256, Rows: 6, N: 4096, K: 4096}, PathDecPre, PathDecPre},
		{MoEShape{Experts: 256, Rows: 512 * 6, N: 4096, K: 4096}, PathDecPre, PathDec},
	} {
		if err := s.ctx.SetKernelChoice(KernelChoice{MoE: c.forced}); err != nil {
			t.Fatal(err)
		}
		got := s.moePath(c.sh)
		if got != c.want {
			t.Errorf("moePath(%+v) forced %q = %q, want %q", c.sh, c.forced, got, c.want)
		}
		if decMapPath(got) {
			if m, d := planMoE(c.sh, got, hopperSMs), planMoE(c.sh, PathDec, hopperSMs); m != (moePlan{got, 8, d.maxTiles, d.colsPC, d.splits, d.per}) {
				t.Errorf("planMoE(%+v): %s %+v, dec %+v: want the same 8-row plan", c.sh, got, m, d)
			}
			if ps := s.ctx.MoEPaths(c.sh); ps[0] != PathDecMap || !slices.Contains(ps, PathDecPre) {
				t.Errorf("MoEPaths(%+v) = %v, want decmap first, decpre among them", c.sh, ps)
			}
		}
	}
	for _, p := range []Path{PathDecMap, PathDecPre} {
		if err := s.ctx.SetKernelChoice(KernelChoice{Linear: p}); err == nil {
			t.Errorf("SetKernelChoice(Linear: %s): no error", p)
		}
	}
}

// TestDecKernel: decpre runs moe_fp4_decp (weights before the PDL wait) only
// on settled tile lists, decmap's kernel on others.
func TestDecKernel(t *testing.T) {
	for _, c := range []struct {
		path    Path
		bm      int
		nv      bool
		settled bool
		mod, fn string
	}{
		{PathDecPre, 8, false, true, "moe_fp4_dec", "moe_fp4_decp"},
		{PathDecPre, 8, true, true, "moe_fp4_dec", "moe_fp4_decp_nv"},
		{PathDecPre, 8, false, false, "moe_fp4_dec", "moe_fp4_decm"},
		{PathDecMap, 8, true, true, "moe_fp4_dec", "moe_fp4_decm_nv"},
		{PathDec, 8, false, true, "moe_fp4_dec", "moe_fp4_dec"},
		{PathDec, 16, true, false, "moe_fp4_dec", "moe_fp4_dec16_nv"},
		{PathDecF16, 8, false, true, "moe_fp4_decf16", "moe_fp4_decf16"},
	} {
		if mod, fn := decKernel(c.path, c.bm, c.nv, c.settled); mod != c.mod || fn != c.fn {
			t.Errorf("decKernel(%s, %d, nv %v, settled %v) = %s.%s, want %s.%s", c.path, c.bm, c.nv, c.settled, mod, fn, c.mod, c.fn)
		}
	}
}

// TestPlanLinearDec: decode shapes run linear_fp8_dec in one wave of warps
// where the K slices allow it, each slice at least 2 blocks, the CTA's warps
// an exact multiple of its slices.
func TestPlanLinearDec(t *testing.T) {
	for _, c := range []struct {
		m, n, k      int
		slices, ctas int
	}{
		{1, 1024, 4096, 16, 64},   // wq_a
		{1, 32768, 1024, 1, 256},  // wq_b
		{1, 512, 4096, 16, 32},    // wkv
		{8, 4096, 8192, 8, 256},   // wo_b
		{16, 4096, 4096, 8, 256},  // shared_w13
		{1, 4096, 2048, 8, 256},   //
		{16, 7168, 16384, 4, 224}, // Pro wo_b
		{1, 8, 128, 1, 1},         // one K block, half a row group
		{3, 65528, 256, 1, 512},   // odd row groups
	} {
		p := planLinear(c.m, c.n, c.k, hopperSMs)
		warps, groups := decGeometry(p.slices)
		ctas := ceilDiv(ceilDiv(c.n, 16), groups)
		if !p.dec || p.splits != 1 || p.slices != c.slices || ctas != c.ctas {
			t.Errorf("planLinear(%d, %d, %d) = %+v, %d CTAs, want dec with %d slices, %d CTAs", c.m, c.n, c.k, p, ctas, c.slices, c.ctas)
		}
		nkb := c.k / 128
		if warps%p.slices != 0 || warps > 16 || (p.slices > 1 && (2*p.slices > nkb || ctas*warps > decWarpsPerSM*hopperSMs)) {
			t.Errorf("planLinear(%d, %d, %d): %d slices of %d blocks in %d CTAs of %d warps", c.m, c.n, c.k, p.slices, nkb, ctas, warps)
		}
		if got, want := LinearFP8ScratchBytes(planStream(hopperSMs), c.m, c.n, c.k), dskScratchBytes(c.m, c.n, c.k, hopperSMs); got != want {
			t.Errorf("LinearFP8ScratchBytes(%d, %d, %d) = %d, want linear_fp8_dsk's %d (linear_fp8_dec needs none)", c.m, c.n, c.k, got, want)
		}
	}
}

// TestPlanDSK: linear_fp8_dsk gives a warp the most K blocks that still put
// a CTA on every SM, its grid covers K exactly, and the planner takes it
// where it runs unsplit (wq_b, shared w2 at one token), not where it splits
// K or past the counters.
func TestPlanDSK(t *testing.T) {
	for _, c := range []struct {
		m, n, k  int
		kb, z    int
		ok, wins bool
		scratch  int
	}{
		{1, 1024, 4096, 2, 4, true, false, 4 * 4 * 1024}, // Flash wq_a
		{16, 1024, 4096, 2, 4, true, false, 4 * 4 * 16 * 1024},
		{1, 512, 4096, 1, 8, true, false, 4 * 8 * 512},   // Flash wkv
		{1, 2048, 4096, 4, 2, true, false, 4 * 2 * 2048}, // Flash shared w1, w3
		{1, 4096, 2048, 4, 1, true, true, 0},             // Flash shared w2
		{16, 4096, 2048, 2, 2, true, false, 4 * 2 * 16 * 4096},
		{1, 1536, 7168, 4, 4, true, false, 4 * 4 * 1536}, // Pro wq_a
		{1, 512, 7168, 2, 7, true, false, 4 * 7 * 512},   // Pro wkv
		{1, 4096, 8192, 4, 4, true, false, 4 * 4 * 4096}, // Flash wo_b
		{1, 32768, 1024, 4, 1, true, true, 0},            // Flash wq_b
		{1, 32768, 4096, 4, 2, false, false, 0},          // 2048 row groups split: past the counters
		{17, 1024, 4096, 0, 0, false, false, 0},          // not a decode shape
		{1, 8, 128, 1, 1, true, true, 0},                 // one K block, half a row group
	} {
		p, ok := planDSK(c.m, c.n, c.k, hopperSMs)
		if ok != c.ok || ok && (p.kb != c.kb || p.z != c.z) || dskWins(c.m, c.n, c.k, hopperSMs) != c.wins || dskScratchBytes(c.m, c.n, c.k, hopperSMs) != c.scratch {
			t.Errorf("planDSK(%d, %d, %d) = %+v, %v, wins %v, scratch %d; want kb %d, z %d, %v, wins %v, scratch %d", c.m, c.n, c.k, p, ok,
				dskWins(c.m, c.n, c.k, hopperSMs), dskScratchBytes(c.m, c.n, c.k, hopperSMs), c.kb, c.z, c.ok, c.wins, c.scratch)
		}
		if !ok {
			continue
		}
		nkb, ns := c.k/128, ceilDiv(c.k/128, p.kb)
		if ns*p.kb < nkb || (ns-1)*p.kb >= nkb || p.z != ceilDiv(ns, dskWarps) || c.m > 8 && p.kb > dskMaxKBT2 {
			t.Errorf("planDSK(%d, %d, %d) = %+v: %d slices do not cover %d blocks exactly", c.m, c.n, c.k, p, ns, nkb)
		}
	}
}

// TestDSKPaths: the planner's choice of linear_fp8_dsk shows in LinearPaths
// (first where it wins, after the in-CTA kernels elsewhere), and the linear
// paths decsk and deccta are refused as MoE paths.
func TestDSKPaths(t *testing.T) {
	ctx := &Context{dev: &Device{SMs: hopperSMs}}
	for _, c := range []struct {
		m, n, k int
		want    []Path
	}{
		{1, 4096, 2048, []Path{PathDecSK, PathDec, PathTiled}},
		{1, 1024, 4096, []Path{PathDec, PathDecSK, PathTiled}},
		{1, 4096, 8192, []Path{PathDec, PathDecSK, PathTiled}},
		{17, 1024, 4096, []Path{PathTiled}},
	} {
		if got := ctx.LinearPaths(c.m, c.n, c.k); !slices.Equal(got, c.want) {
			t.Errorf("LinearPaths(%d, %d, %d) = %v, want %v", c.m, c.n, c.k, got, c.want)
		}
	}
	for _, p := range []Path{PathDecSK, PathDecCTA} {
		if err := ctx.SetKernelChoice(KernelChoice{MoE: p}); err == nil {
			t.Errorf("SetKernelChoice(MoE: %s): no error", p)
		}
		if err := ctx.SetKernelChoice(KernelChoice{Linear: p}); err != nil {
			t.Errorf("SetKernelChoice(Linear: %s): %v", p, err)
		}
	}
}

// TestDecPair: linear_fp8_dec2 pairs the decode linears of one input whose
// CTAs have one size (Flash and Pro wq_a|wkv and shared w1|w3), each grid
// with the CTAs of its own launch, and refuses CTAs of two sizes.
func TestDecPair(t *testing.T) {
	for _, c := range []struct {
		m, na, nb, k  int
		warps, ca, cb int
		ok            bool
	}{
		{1, 1024, 512, 4096, 16, 64, 32, true},     // Flash wq_a|wkv
		{16, 2048, 2048, 4096, 16, 128, 128, true}, // Flash shared w1|w3
		{1, 1536, 512, 7168, 16, 96, 32, true},     // Pro wq_a|wkv
		{3, 3072, 3072, 7168, 8, 192, 192, true},   // Pro shared w1|w3
		{1, 128, 128, 256, 8, 1, 1, true},          // small wq_a|wkv: one CTA each
		{1, 1024, 4096, 4096, 16, 64, 0, false},    // 16 slices against 8
	} {
		pa, pb := planLinear(c.m, c.na, c.k, hopperSMs), planLinear(c.m, c.nb, c.k, hopperSMs)
		warps, ca, cb, ok := decPair(pa, pb, c.na, c.nb)
		if !pa.dec || !pb.dec || ok != c.ok || ok && (warps != c.warps || ca != c.ca || cb != c.cb) {
			t.Errorf("decPair(%d, %d|%d, %d) = %d warps, %d+%d CTAs, %v; want %d, %d+%d, %v", c.m, c.na, c.nb, c.k, warps, ca, cb, ok, c.warps, c.ca, c.cb, c.ok)
		}
	}
}

// TestPlanTDec: linear_fp8_tdec's stage geometry stays inside a CTA's and
// an SM's shared memory, never reads past a warp's slice in a whole chunk,
// and takes the long contiguous reads at the decode shapes it runs.
func TestPlanTDec(t *testing.T) {
	for _, c := range []struct{ m, n, k, kbs int }{
		{1, 4096, 8192, 4}, {8, 4096, 8192, 4}, {16, 4096, 8192, 3}, // Flash wo_b
		{1, 4096, 4096, 4}, {16, 4096, 4096, 3}, // shared w13
		{1, 6144, 7168, 4}, {16, 6144, 7168, 2}, // Pro shared w13
		{1, 65536, 1536, 3}, {16, 65536, 1536, 3}, // Pro wq_b: 3 blocks a slice
		{1, 256, 512, 1}, {9, 264, 1664, 4}, {2, 1040, 14720, 4}, {16, 8, 128, 1},
	} {
		p := planTDec(c.m, c.n, c.k, hopper)
		per := ceilDiv(c.k/128, 4)
		chunks := ceilDiv(per, p.kbs)
		xb := ceilDiv(min(c.m, 16)*p.kbs*128, 1024) * 1024
		switch {
		case p.kbs != c.kbs:
			t.Errorf("planTDec(%d, %d, %d) = %+v: kbs %d, want %d", c.m, c.n, c.k, p, p.kbs, c.kbs)
		case p.kbs < 1 || p.kbs > per || p.kbs > tdecMaxKBS || p.ts < min(2, chunks) || p.ts > chunks:
			t.Errorf("planTDec(%d, %d, %d) = %+v: bad stages for %d blocks a slice", c.m, c.n, c.k, p, per)
		case p.xoff != 2048*p.kbs || p.stride != p.xoff+xb || p.stride%1024 != 0:
			t.Errorf("planTDec(%d, %d, %d) = %+v: bad stage layout", c.m, c.n, c.k, p)
		case p.smem != 4*p.ts*p.stride+32*p.ts+1024 || p.smem+tdecStaticSmem > hopper.SmemOptin:
			t.Errorf("planTDec(%d, %d, %d) = %+v: bad shared memory", c.m, c.n, c.k, p)
		case p.ctas < 1 || p.ctas > tdecMaxCTAs || p.ctas*(p.smem+tdecCTAReserve) > hopper.SmemSM:
			t.Errorf("planTDec(%d, %d, %d) = %+v: %d CTAs do not fit an SM", c.m, c.n, c.k, p, p.ctas)
		}
	}
}

// TestLoadNCCL: without the library the loader says so (no crash); with it
// the version is read and NVLink multicast is off unless set explicitly.
func TestLoadNCCL(t *testing.T) {
	t.Setenv("NCCL_NVLS_ENABLE", "")
	n, err := LoadNCCL()
	if err != nil {
		if !strings.Contains(err.Error(), "NCCL") && !errors.Is(err, ErrNoCGO) {
			t.Errorf("error %q does not name NCCL", err)
		}
		return
	}
	if n.Version <= 0 || n.Path() == "" {
		t.Errorf("NCCL %q version %d", n.Path(), n.Version)
	}
	if v := os.Getenv("NCCL_NVLS_ENABLE"); v != "0" {
		t.Errorf("NCCL_NVLS_ENABLE = %q after LoadNCCL, want 0", v)
	}
}
