package cuda

import "fmt"

// MoEGateUpArgs are the operands of MoEGateUpSwiGLU.
type MoEGateUpArgs struct {
	HQ, HS     DevicePtr // out: h quantised for w2, e4m3 [Rows, N] and e8m0 [Rows, N/128]
	XQ, XS     DevicePtr // the permuted rows' FP8 activations, [Rows, K] and [Rows, K/128]
	W1, S1, G1 DevicePtr // gate: FP4 weights, their scales, NVFP4's global scales [Experts]
	W3, S3, G3 DevicePtr // up, as W1, S1, G1
	// Stride is the rows an expert in W1 and W3 (and in their scales): N
	// when they are apart, 2N for w1 stacked over w3 (W3 = W1 + N rows).
	Stride  int
	Perm    DevicePtr // int32 [Rows]: the (row, slot) pair of every permuted row
	Weights DevicePtr // fp32 routing weights, indexed by pair
	Shape   MoEShape  // N = the experts' intermediate size (% 128 == 0), K = the model's
	Limit   float32   // SwiGLU clamp, <= 0: none
	Scratch DevicePtr // MoEScratchBytes(Shape)
	Tiles   MoETileList
}

// MoEGateUpFused reports whether MoEGateUpSwiGLU runs for the w1/w3 GEMM of
// shape sh on this stream: on the sm_100a tcgen05 path. Elsewhere the w13
// GEMM and MoESwiGLUQuant run apart.
func (s *Stream) MoEGateUpFused(sh MoEShape) bool {
	return sh.N%128 == 0 && s.moePath(sh) == PathTC
}

// MoEGateUpSwiGLU runs the w1/w3 grouped GEMM with the faithful
// MoESwiGLUQuant as its epilogue (moe_fp4_tc_swiglu, kernels/moe_fp4_sm100.cu):
// HQ and HS are bit for bit what MoEFP4Tiles of w1 and w3 followed by
// MoESwiGLUQuant write, without their bf16 g and u in memory. Rows outside
// the tile list are not written.
func MoEGateUpSwiGLU(s *Stream, a MoEGateUpArgs) error {
	sh := a.Shape
	if err := checkMoEShape(sh); err != nil {
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: %w", err)
	}
	switch {
	case sh.N%128 != 0 || a.Stride < sh.N:
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: intermediate %d (%% 128 == 0) and expert stride %d (>= it)", sh.N, a.Stride)
	case a.HQ == 0 || a.HS == 0 || a.Perm == 0 || a.Weights == 0 || a.W1 == 0 || a.W3 == 0 || a.S1 == 0 || a.S3 == 0:
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: missing outputs, weights, permutation or routing weights")
	case sh.Format == NVFP4 && (a.G1 == 0 || a.G3 == 0):
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: NVFP4 needs the per-expert global scales")
	case !s.MoEGateUpFused(sh):
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: device %s (compute %d.%d) does not run the sm_100a tcgen05 path for %+v", s.ctx.dev.Name, s.ctx.dev.Major, s.ctx.dev.Minor, sh)
	}
	if sh.Rows == 0 {
		return nil
	}
	p := s.moePlan(sh)
	if p.bm != a.Tiles.bm || p.maxTiles != a.Tiles.maxTiles {
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: tile list of %d-row tiles (%d) built for another shape than %+v", a.Tiles.bm, a.Tiles.maxTiles, sh)
	}
	name, nv, g1, g3 := "moe_fp4_tc_swiglu", sh.Format == NVFP4, a.G1, a.G3
	if nv {
		name += "_nv"
	} else {
		g1, g3 = 0, 0
	}
	mx, err := tcTokens(s, a.XQ, a.XS, sh, p, a.Scratch)
	if err != nil {
		return fmt.Errorf("cuda: moe_fp4_tc_swiglu: %w", err)
	}
	args := new(Args).Ptr(a.HQ).Ptr(a.HS).Map(&mx).Ptr(a.Scratch).Ptr(a.XS).Ptr(a.W1).Ptr(a.S1).Ptr(g1).Ptr(a.W3).Ptr(a.S3).Ptr(g3).
		I32(a.Stride).Ptr(a.Perm).Ptr(a.Weights).I32(sh.N).I32(sh.K).F32(a.Limit)
	items := sh.N / 128 * p.maxTiles
	return launch(s, "moe_fp4_sm100", fmt.Sprintf("%s%d", name, p.bm), s.ctx.tcGrid(items), Dim3{tcThreads, 1, 1}, tcSmem(p.bm, nv), args)
}
