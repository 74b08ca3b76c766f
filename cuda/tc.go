package cuda

import "fmt"

// The sm_100a (Blackwell) tcgen05 GEMMs: kernels/linear_fp8_sm100.cu and
// kernels/moe_fp4_sm100.cu over kernels/tc_gemm.cuh (docs/blackwell.md).
// Persistent CTAs of tcThreads, one an SM, walking 128-row weight blocks x
// token tiles of tcTiles rows.

// PathTC is the sm_100a tcgen05 path (compute capability 10.x).
const PathTC Path = "tc"

// tcThreads is TC_THREADS: 4 loader warps, 4 epilogue warps, the MMA warp.
const tcThreads = 9 * 32

// tcTiles are the token tiles the kernels are built for (the MMA's N).
var tcTiles = []int{16, 32, 64, 128}

// tcSmem is TcCfg<bt, bf16>::SMEM: the stage ring (128 weight rows and bt
// token rows of 128 K, e4m3 or bf16, and two 512-byte scale atoms), its
// barriers, the TMEM address slot, the epilogue warps' 256-byte exchange
// and the slack that aligns the ring to 1024 bytes.
func tcSmem(bt int, bf16 bool) int {
	stages, eb := 4, 1
	if bt >= 128 {
		stages = 3
	}
	if bf16 {
		eb = 2
	}
	return stages*(eb*128*128+eb*bt*128+2*512) + (2*stages+4)*8 + 16 + 256 + 1024
}

// tcCapable reports whether a device of compute capability major.minor with
// smemOptin bytes of opt-in shared memory a block runs the tcgen05 kernels:
// only 10.x (sm_100a/sm_103a; 12.x consumer Blackwell has no tcgen05), a
// driver that encodes tensor maps, and room for the largest stage ring.
func tcCapable(major, minor, smemOptin int, tensorMaps bool) bool {
	_ = minor
	return major == 10 && tensorMaps && smemOptin >= tcSmem(tcTiles[len(tcTiles)-1], true)
}

// HasTC reports whether the device runs the sm_100a tcgen05 kernels.
func (c *Context) HasTC() bool {
	if c.dev.Major != 10 { // before asking the driver: plans run on driverless contexts in tests
		return false
	}
	return tcCapable(c.dev.Major, c.dev.Minor, c.dev.SmemOptin, c.drv.api.hasTensorMaps())
}

// tcTile picks the token tile: the smallest that holds rows (the expected
// rows per expert, or the linear's rows), at most 128.
func tcTile(rows int) int {
	for _, bt := range tcTiles {
		if rows <= bt {
			return bt
		}
	}
	return tcTiles[len(tcTiles)-1]
}

// tcGrid is the persistent grid: one CTA an SM, no more than the items.
func (c *Context) tcGrid(items int) Dim3 {
	return Dim3{uint32(max(min(items, c.dev.SMs), 1)), 1, 1}
}

// linearFP8TC runs linear_fp8_tc<bt>: y (bf16, may be 0) and/or yf (fp32 of
// the bf16 results) [m, n] = x · Wᵀ.
func linearFP8TC(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int) error {
	if !s.ctx.HasTC() {
		return fmt.Errorf("cuda: linear_fp8_tc: device %s (compute %d.%d) has no sm_100a tcgen05 path", s.ctx.dev.Name, s.ctx.dev.Major, s.ctx.dev.Minor)
	}
	bt := tcTile(m)
	mx, err := s.ctx.TensorMapBytes2D(xq, m, k, bt, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tc: activations: %w", err)
	}
	mw, err := s.ctx.TensorMapBytes2D(w, n, k, 128, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tc: weights: %w", err)
	}
	a := new(Args).Ptr(y).Ptr(yf).Map(&mx).Map(&mw).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k)
	items := ceilDiv(n, 128) * ceilDiv(m, bt)
	return launch(s, "linear_fp8_sm100", fmt.Sprintf("linear_fp8_tc%d", bt), s.ctx.tcGrid(items), Dim3{tcThreads, 1, 1}, tcSmem(bt, false), a)
}

// moeTC reports whether the MoE GEMM of sh runs moe_fp4_tc on this device
// (MXFP4 and NVFP4 weights).
func (c *Context) moeTC(sh MoEShape) bool { return c.HasTC() }

// moeFP4TC runs moe_fp4_tc<bm> (MXFP4) or tc_fp8_to_bf16 and
// moe_fp4_tc_nv<bm> (NVFP4) over the tile list at the start of scratch;
// NVFP4's bf16 activations follow the list.
func moeFP4TC(s *Stream, y, xq, xs, w, wscale, gscale DevicePtr, sh MoEShape, p moePlan, scratch DevicePtr) error {
	if !s.ctx.moeTC(sh) {
		return fmt.Errorf("cuda: moe_fp4_tc: device %s (compute %d.%d) has no sm_100a tcgen05 path", s.ctx.dev.Name, s.ctx.dev.Major, s.ctx.dev.Minor)
	}
	name, nv := "moe_fp4_tc", sh.Format == NVFP4
	if nv {
		name += "_nv"
	} else {
		gscale = 0
	}
	mx, err := tcTokens(s, xq, xs, sh, p, scratch)
	if err != nil {
		return fmt.Errorf("cuda: moe_fp4_tc: %w", err)
	}
	a := new(Args).Ptr(y).Map(&mx).Ptr(scratch).Ptr(xs).Ptr(w).Ptr(wscale).Ptr(gscale).I32(sh.N).I32(sh.K)
	items := ceilDiv(sh.N, 128) * p.maxTiles
	return launch(s, "moe_fp4_sm100", fmt.Sprintf("%s%d", name, p.bm), s.ctx.tcGrid(items), Dim3{tcThreads, 1, 1}, tcSmem(p.bm, nv), a)
}

// tcTokens returns the tensor map of the MoE GEMM's token operand: the FP8
// rows xq (MXFP4), or (NVFP4) their bf16 widening, which tc_fp8_to_bf16
// writes after the tile list in scratch.
func tcTokens(s *Stream, xq, xs DevicePtr, sh MoEShape, p moePlan, scratch DevicePtr) (TensorMap, error) {
	if sh.Format != NVFP4 {
		return s.ctx.TensorMapBytes2D(xq, sh.Rows, sh.K, p.bm, 128)
	}
	x := scratch.Add(p.tileBytes())
	a := new(Args).Ptr(x).Ptr(xq).Ptr(xs).I32(sh.Rows).I32(sh.K)
	n4 := sh.Rows * sh.K / 4
	if err := launch(s, "moe_fp4_sm100", "tc_fp8_to_bf16", Dim3{uint32(min(ceilDiv(n4, 256), 16*s.ctx.dev.SMs)), 1, 1}, Dim3{256, 1, 1}, 0, a); err != nil {
		return TensorMap{}, err
	}
	return s.ctx.TensorMapBytes2D(x, sh.Rows, 2*sh.K, p.bm, 128)
}

// tcLinear reports whether LinearFP8 runs linear_fp8_tc on this stream:
// forced (KernelChoice tc), or by itself on a device that has the path.
func (s *Stream) tcLinear() bool {
	switch s.ctx.kernelChoice().Linear {
	case PathTC:
		return true
	case PathAuto:
		return s.ctx.HasTC()
	}
	return false
}
