package cuda_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
	"github.com/megamoe/megamoe/cuda/kcheck"
)

// gpu opens device 0 (the emulator under MEGAMOE_EMU) with a stream, or
// skips the test with the reason.
func gpu(t *testing.T) (*cuda.Context, *cuda.Stream) {
	t.Helper()
	return cuda.OpenTestDevice(t)
}

func TestDeviceInfo(t *testing.T) {
	ctx, _ := gpu(t)
	dev := ctx.Device()
	free, total, err := ctx.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s sm_%d%d (%s), %d SMs, %d MiB total, %d MiB free, smem optin %d, smem per SM %d",
		dev.Name, dev.Major, dev.Minor, dev.Arch(), dev.SMs, total>>20, free>>20, dev.SmemOptin, dev.SmemSM)
	if dev.SMs <= 0 || dev.Major < 7 || total == 0 || free > total || dev.Name == "" || dev.SmemOptin <= 0 || dev.SmemSM < dev.SmemOptin {
		t.Errorf("implausible device properties: %+v free=%d total=%d", dev, free, total)
	}
}

func TestCopiesMemsetPinned(t *testing.T) {
	ctx, s := gpu(t)
	const n = 1<<20 + 12
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	a, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free()
	b, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	pin, err := ctx.AllocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	copy(pin.Bytes(), src)
	if err := s.CopyHtoD(a.Ptr, pin.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoD(b.Ptr, a.Ptr, n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b.Ptr); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("H2D(pinned) -> D2D -> D2H round trip differs")
	}
	if err := s.Memset8(b.Ptr.Add(5), 0xAB, 100); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset32(b.Ptr.Add(1024), 0x01020304, 16); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyDtoH(got, b.Ptr); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), src...)
	for i := 5; i < 105; i++ {
		want[i] = 0xAB
	}
	for i := 0; i < 16; i++ {
		copy(want[1024+4*i:], []byte{4, 3, 2, 1})
	}
	if !bytes.Equal(got, want) {
		t.Fatal("memset results differ")
	}
}

func TestPoolReuse(t *testing.T) {
	ctx, _ := gpu(t)
	p := ctx.Pool()
	before := p.Stats()
	a, err := ctx.Alloc(3000)
	if err != nil {
		t.Fatal(err)
	}
	ptr := a.Ptr
	a.Free()
	b, err := ctx.Alloc(2900) // same size class
	if err != nil {
		t.Fatal(err)
	}
	if b.Ptr != ptr {
		t.Errorf("same-class allocation not reused: %#x vs %#x", b.Ptr, ptr)
	}
	b.Free()
	if st := p.Stats(); st.Allocs != before.Allocs+1 || st.Cached == 0 {
		t.Errorf("stats %+v (before %+v)", st, before)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.Cached != 0 {
		t.Errorf("Trim left %d cached bytes", st.Cached)
	}
}

func TestErrorsNameCallAndCode(t *testing.T) {
	ctx, s := gpu(t)
	buf := make([]byte, 16)
	err := s.CopyDtoH(buf, cuda.DevicePtr(8)) // not a device address
	var ce *cuda.Error
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Name, "CUDA_ERROR_") || !strings.Contains(err.Error(), "cuMemcpyDtoHAsync") {
		t.Fatalf("want a named CUDA error from cuMemcpyDtoHAsync, got %v", err)
	}
	f, err := ctx.Kernel("rmsnorm", "rmsnorm_bf16")
	if err != nil {
		t.Fatal(err)
	}
	// 2048 threads per block is invalid on every GPU.
	err = s.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 2048, Y: 1, Z: 1}, 0, new(cuda.Args).Ptr(0).Ptr(0).Ptr(0).I32(2).F32(1e-6))
	if err == nil || !strings.Contains(err.Error(), "cuLaunchKernel(rmsnorm_bf16): CUDA_ERROR_") {
		t.Fatalf("want cuLaunchKernel(rmsnorm_bf16): CUDA_ERROR_..., got %v", err)
	}
	if _, err := ctx.Kernel("rmsnorm", "no_such_kernel"); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_NOT_FOUND") {
		t.Fatalf("want CUDA_ERROR_NOT_FOUND, got %v", err)
	}
}

// TestKernelResources: the GEMM kernels keep their working set in registers.
// moe_fp4_dec runs under a 56-register cap (9 CTAs per SM) without a stack;
// moe_fp4_dec_nv (64 registers, 8 CTAs) and moe_fp4_dec16_nv (80, 6) keep a few words on the stack (two
// LDL per 128-K block, seen in the SASS): allowed, nothing more. linear_fp8
// sits at 255 registers under NVRTC 13.0 and, with its scale bytes loaded a
// block ahead, spills 24 bytes (none under NVRTC 12.4); measured with the
// spill it is faster than without the early scale loads.
func TestKernelResources(t *testing.T) {
	ctx, _ := gpu(t)
	for _, k := range []struct {
		module, name string
		local        int
	}{
		{"linear_fp8", "linear_fp8", 24}, {"linear_fp8", "linear_fp8_dec", 0}, {"linear_fp8", "linear_fp8_dec2", 0}, {"linear_fp8_dsk", "linear_fp8_dsk1_4", 0}, {"linear_fp8_dsk", "linear_fp8_dsk2_2", 0}, {"linear_fp8_dsk", "linear_fp8_dsk1_1", 0}, {"linear_fp8_tdec", "linear_fp8_tdec", 0}, {"linear_fp8_tdec3", "linear_fp8_tdec3", 0},
		{"moe_fp4", "moe_fp4_gemm", 0}, {"moe_fp4_dec", "moe_fp4_dec", 0}, {"moe_fp4_dec", "moe_fp4_dec_nv", 8}, {"moe_fp4_dec", "moe_fp4_dec16", 0}, {"moe_fp4_dec", "moe_fp4_dec16_nv", 16},
		{"moe_fp4_dec", "moe_fp4_decm", 0}, {"moe_fp4_dec", "moe_fp4_decm_nv", 8},
		{"rmsnorm", "rmsnorm_bf16", 0}, {"ops_f32", "rmsnorm_f32", 0},
		{"hc_f32", "hc_pre_part_f32_n4", 0}, {"hc_f32", "hc_pre_fin_f32_n4", 0}, {"hc_f32", "hc_pre_fin_norm_f32_n4", 0},
		{"linear_fp8_wg", "linear_fp8_wg", 0}, {"linear_fp8_wg", "linear_fp8_wg_bulk", 0}, {"linear_fp8_wg", "linear_fp8_wg_n192", 0}, {"linear_fp8_wg", "linear_fp8_wg_n192d", 0}, {"linear_fp8_wg", "linear_fp8_wg_s5", 0},
		{"moe_fp4_wg", "moe_fp4_wg32", 0}, {"moe_fp4_wg", "moe_fp4_wg128", 0},
		{"linear_f32", "gemv1_f32_w1", 0}, {"linear_f32", "gemv_f32_w1", 0}, {"linear_f32", "gemvr_m2_r4_b2", 0}, {"linear_f32", "gemvr_m2_r4_b1", 0},
		{"linear_f32", "gemvr_m2_r2_b2", 0}, {"linear_f32", "gemvr_m4_r4_b2", 0}, {"linear_f32", "gemvr_m4_r4_b1", 0}, {"linear_f32", "gemvr_m4_r2_b2", 0},
		{"linear_f32", "gemvr_m8_r4_b1", 0}, {"linear_f32", "gemvr_m8_r2_b2", 0}, {"linear_bf16", "linear_bf16_w1", 0}, {"linear_bf16", "linear_bf16_w2", 0}, {"linear_bf16", "linear_bf16x3_w1", 0},
		{"attn_f32", "sparse_attn_split_f32", 0}, {"attn_f32", "sparse_attn_split_kv8", 0}, {"attn_f32", "sparse_attn_dec_f32", 0}, {"attn_f32", "sparse_attn_dec_kv8", 0}, {"attn_f32", "sparse_attn_max_kv8", 0}, {"attn_f32", "indexer_scores_kv8", 0}, {"linear_bf16", "linear_bf16_dec1_w2", 0}, {"linear_bf16", "linear_bf16x3_dec1_w1", 0}, {"linear_bf16", "linear_bf16_dec2_w2", 0}, {"linear_bf16", "linear_bf16_dec4_w2", 0}, {"linear_bf16", "linear_bf16_dec4_w1", 0},
		{"moe_fused", "moe_gather_q", 0}, {"moe_fused", "moe_swiglu_q", 0},
		{"ops_f32", "rmsnorm_quant_f32", 0}, {"ops_f32", "swiglu_quant_f32", 0},
		{"moe_route", "router_topk8", 0}, {"moe_route", "router_topk12", 0},
		{"linear_fp8_sm100", "linear_fp8_tc16", 0}, {"linear_fp8_sm100", "linear_fp8_tc128", 0}, {"moe_fp4_sm100", "moe_fp4_tc16", 0}, {"moe_fp4_sm100", "moe_fp4_tc128", 0},
	} {
		if (strings.HasSuffix(k.module, "_wg") || strings.Contains(k.module, "_tdec")) && !ctx.HasTMA() {
			continue
		}
		if strings.HasSuffix(k.module, "_sm100") && !ctx.HasTC() {
			continue
		}
		f, err := ctx.Kernel(k.module, k.name)
		if err != nil {
			t.Fatal(err)
		}
		regs, local, smem, err := f.Resources()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d regs, %d local bytes, %d static smem", k.name, regs, local, smem)
		if local > k.local {
			t.Errorf("%s spills %d bytes to local memory (allowed %d)", k.name, local, k.local)
		}
	}
}

// TestGraphReplay captures rmsnorm into a CUDA graph, replays it on new
// inputs written into the same buffers, and checks it against the twin.
func TestGraphReplay(t *testing.T) {
	ctx, s := gpu(t)
	const rows, dim = 4, 1024
	rng := rand.New(rand.NewPCG(7, 8))
	mk := func(n int) []uint16 {
		v := make([]uint16, n)
		for i := range v {
			v[i] = cpuref.F32ToBF16(float32(rng.NormFloat64()))
		}
		return v
	}
	w := mk(dim)
	x, _ := ctx.Alloc(2 * rows * dim)
	y, _ := ctx.Alloc(2 * rows * dim)
	dw, _ := ctx.Alloc(2 * dim)
	defer x.Free()
	defer y.Free()
	defer dw.Free()
	if err := s.CopyHtoD(dw.Ptr, u16b(w)); err != nil {
		t.Fatal(err)
	}
	// Compile and load outside the capture.
	if _, err := ctx.Kernel("rmsnorm", "rmsnorm_bf16"); err != nil {
		t.Fatal(err)
	}
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := cuda.RMSNorm(s, y.Ptr, x.Ptr, dw.Ptr, rows, dim, 1e-6); err != nil {
		t.Fatal(err)
	}
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if n, err := g.Nodes(); err != nil || n != 1 {
		t.Fatalf("captured graph holds %d nodes (want 1): %v", n, err)
	}
	exec, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()
	for rep := 0; rep < 3; rep++ {
		in := mk(rows * dim)
		if err := s.CopyHtoD(x.Ptr, u16b(in)); err != nil {
			t.Fatal(err)
		}
		if err := s.Memset8(y.Ptr, 0xFF, 2*rows*dim); err != nil {
			t.Fatal(err)
		}
		if rep == 0 {
			// The poison must be in place before the replay.
			pre := download16(t, s, y.Ptr, rows*dim)
			if pre[0] != 0xFFFF || pre[len(pre)-1] != 0xFFFF {
				t.Fatalf("poison not applied: %04x", pre[:4])
			}
		}
		if err := exec.Launch(s); err != nil {
			t.Fatal(err)
		}
		got := download16(t, s, y.Ptr, rows*dim)
		want := make([]uint16, rows*dim)
		cpuref.RMSNorm(want, in, w, rows, dim, 1e-6)
		bad := 0
		for i := range got {
			d := int(got[i]) - int(want[i])
			if d > 1 || d < -1 {
				bad++
			}
		}
		if bad > 0 {
			poison := 0
			for _, v := range got {
				if v == 0xFFFF {
					poison++
				}
			}
			t.Fatalf("replay %d: %d outputs differ by more than one bf16 ulp (%d still poisoned); got[:4]=%04x want[:4]=%04x", rep, bad, poison, got[:4], want[:4])
		}
	}
}

// download16 copies n uint16 values back from the device.
func download16(t *testing.T, s *cuda.Stream, p cuda.DevicePtr, n int) []uint16 {
	t.Helper()
	b := make([]byte, 2*n)
	if err := s.CopyDtoH(b, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	v := make([]uint16, n)
	for i := range v {
		v[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
	}
	return v
}

func u16b(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		b[2*i], b[2*i+1] = byte(x), byte(x>>8)
	}
	return b
}

// TestKernelsVsCPU runs every kernel against its CPU twin on fresh random
// inputs (outputs poisoned before each launch).
// Every GEMM path runs every case it applies to (KernelChoice).
func TestKernelsVsCPU(t *testing.T) {
	ctx, s := gpu(t)
	env := &kcheck.Env{Ctx: ctx, S: s, Seed: rand.Uint64()}
	defer env.Close()
	type choice struct {
		name string
		kc   cuda.KernelChoice
	}
	var choices []choice
	paths := []cuda.Path{cuda.PathAuto, cuda.PathDec, cuda.PathTiled}
	if ctx.HasTMA() {
		paths = append(paths, cuda.PathWG, cuda.PathDecWG)
	}
	if ctx.HasTC() {
		paths = append(paths, cuda.PathTC)
	}
	for _, p := range paths {
		name := string(p)
		if p == cuda.PathAuto {
			name = "auto"
		}
		choices = append(choices, choice{name, cuda.KernelChoice{Linear: p, MoE: p}})
	}
	choices = append(choices, choice{"decf16", cuda.KernelChoice{MoE: cuda.PathDecF16}}, choice{"decmap", cuda.KernelChoice{MoE: cuda.PathDecMap}},
		choice{"decpre", cuda.KernelChoice{MoE: cuda.PathDecPre}},
		choice{"decsk", cuda.KernelChoice{Linear: cuda.PathDecSK}})
	if ctx.HasTMA() { // the other linear_fp8_wg variants (linear only)
		for _, p := range cuda.WGPaths()[1:] {
			choices = append(choices, choice{string(p), cuda.KernelChoice{Linear: p}})
		}
	}
	for _, ch := range choices {
		if err := ctx.SetKernelChoice(ch.kc); err != nil {
			t.Fatal(err)
		}
		for _, c := range kcheck.SmallCases() {
			if ch.kc.Linear != cuda.PathAuto && c.Component != "linear_fp8" && c.Component != "moe_fp4" {
				continue
			}
			if ch.kc.MoE == cuda.PathAuto && ch.kc.Linear != cuda.PathAuto && c.Component != "linear_fp8" {
				continue // a linear-only path
			}
			if ch.kc.Linear == cuda.PathDecSK && !decodeRows(c.Shape) { // decode linears only
				continue
			}
			// A MoE-only path: its own shapes only (elsewhere it runs another path's kernel).
			if (ch.kc.MoE == cuda.PathDecF16 || ch.kc.MoE == cuda.PathDecMap || ch.kc.MoE == cuda.PathDecPre) && (c.Component != "moe_fp4" || !slices.Contains(ctx.MoEPaths(c.MoE), ch.kc.MoE)) {
				continue
			}
			t.Run(ch.name+"/"+c.Component+"/"+strings.ReplaceAll(c.Shape, " ", "_"), func(t *testing.T) {
				r := kcheck.Run(env, c)
				t.Log(kcheck.Row(r))
				if !r.Pass {
					t.Errorf("%s %s: failed: %s", c.Component, c.Shape, kcheck.Row(r))
				}
			})
		}
	}
	if err := ctx.SetKernelChoice(cuda.KernelChoice{}); err != nil {
		t.Fatal(err)
	}
}

// decodeRows reports whether a linear case's shape ("MxNxK") has at most 16
// rows, the decode kernels' (elsewhere a decode path runs the tiled kernels).
func decodeRows(shape string) bool {
	m, _, _ := strings.Cut(shape, "x")
	rows, err := strconv.Atoi(m)
	return err == nil && rows <= 16
}

// TestPDLChain: with programmatic dependent launch on, a chain of kernels
// that each read the previous one's output (large grids followed by one-CTA
// ones, in place and ping-pong), eagerly and replayed as a graph, gives the
// serial result: every kernel's griddepcontrol.wait holds it until its
// predecessor's writes are visible.
func TestPDLChain(t *testing.T) {
	ctx, s := gpu(t)
	if !s.PDL() {
		t.Skip("no programmatic dependent launch on this device or driver")
	}
	const n, tail, pairs = 1 << 22, 1024, 100
	buf := func() *cuda.Buffer {
		b, err := ctx.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		return b
	}
	a, b, one := buf(), buf(), buf()
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	if err := s.CopyHtoD(one.Ptr, cuda.Bytes(ones)); err != nil {
		t.Fatal(err)
	}
	chain := func() error {
		if err := s.Memset8(a.Ptr, 0, 4*n); err != nil {
			return err
		}
		for i := 0; i < pairs; i++ {
			src, dst := a, b
			if i%2 == 1 {
				src, dst = b, a
			}
			if err := cuda.AddF32(s, dst.Ptr, src.Ptr, one.Ptr, n, false); err != nil {
				return err
			}
			end := dst.Ptr.Add(4 * (n - tail))
			if err := cuda.AddF32(s, end, end, one.Ptr, tail, false); err != nil {
				return err
			}
		}
		return nil
	}
	check := func(what string) {
		raw := make([]byte, 4*n)
		if err := s.CopyDtoH(raw, a.Ptr); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
			want := float32(pairs)
			if i >= n-tail {
				want = 2 * pairs
			}
			if v != want {
				t.Fatalf("%s: a[%d] = %v, want %v", what, i, v, want)
			}
		}
	}
	if err := chain(); err != nil {
		t.Fatal(err)
	}
	check("eager")
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	if err := chain(); err != nil {
		t.Fatal(err)
	}
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	exec, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()
	for _, p := range []cuda.DevicePtr{a.Ptr, b.Ptr} { // poison: only the replay can fix it
		if err := s.Memset8(p, 0xFF, 4*n); err != nil {
			t.Fatal(err)
		}
	}
	if err := exec.Launch(s); err != nil {
		t.Fatal(err)
	}
	check("graph")
}
