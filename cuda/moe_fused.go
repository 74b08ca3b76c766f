package cuda

import "fmt"

// Launchers of kernels/moe_fused.cu: the MoE glue fused with the FP8
// activation quantisation of the GEMM that follows it, one warp per (row,
// 128-column block).

// MoEGatherQuant writes, for the permuted rows m < offsets[E] of a capacity
// of rows, the FP8 quantisation (per 128, spec §3.3) of x[perm[m]/k] (fp32
// [*, d]): codes xq [rows, d] and e8m0 scales xs [rows, d/128], and/or the
// gathered fp32 rows xg [rows, d]. d % 128 == 0.
func MoEGatherQuant(s *Stream, xq, xs, xg, x, perm, offsets DevicePtr, experts, k, d, rows int) error {
	if rows < 0 || experts <= 0 || k <= 0 || d <= 0 || d%128 != 0 || (xq == 0) != (xs == 0) || (xq == 0 && xg == 0) {
		return fmt.Errorf("cuda: moe_gather_q: bad arguments rows=%d k=%d d=%d (d %% 128 == 0; codes with scales, or rows)", rows, k, d)
	}
	if rows == 0 {
		return nil
	}
	grid, err := warpGrid(int64(rows) * int64(d/128))
	if err != nil {
		return fmt.Errorf("cuda: moe_gather_q: %w", err)
	}
	a := new(Args).Ptr(xq).Ptr(xs).Ptr(xg).Ptr(x).Ptr(perm).Ptr(offsets).I32(experts).I32(k).I32(d).I32(rows)
	return launch(s, "moe_fused", "moe_gather_q", grid, Dim3{256, 1, 1}, 0, a)
}

// MoESwiGLUArgs are the operands of MoESwiGLUQuant.
type MoESwiGLUArgs struct {
	HQ, HS  DevicePtr // faithful: h quantised for w2, e4m3 [Rows, Inter] and e8m0 [Rows, Inter/128]
	H       DevicePtr // fp32 [Rows, Inter]: exact, the output; faithful, optional
	G, U    DevicePtr // GEMM outputs, row stride LD (bf16; exact: fp32)
	LD      int       //
	Perm    DevicePtr // int32 [Rows]: the (row, slot) pair of every permuted row
	Offsets DevicePtr // int32 [Experts+1]
	Weights DevicePtr // fp32 routing weights [*, k], indexed by pair
	GF, UF  DevicePtr // optional fp32 copies of g and u [Rows, Inter] (NaN tracer)
	Experts int       //
	Rows    int       // capacity of the permuted rows
	Inter   int       // % 128 == 0
	Limit   float32   // SwiGLU clamp, <= 0: none
	Exact   bool      //
}

// MoESwiGLUQuant computes h = bf16(w·silu(min(g, limit))·clamp(u, ±limit))
// (exact: not rounded) for the permuted rows below offsets[E] and, faithful,
// quantises h to FP8 for w2 in the same pass.
func MoESwiGLUQuant(s *Stream, a MoESwiGLUArgs) error {
	switch {
	case a.Rows < 0 || a.Experts <= 0 || a.Inter <= 0 || a.Inter%128 != 0 || a.LD < a.Inter || a.LD%4 != 0:
		return fmt.Errorf("cuda: moe_swiglu_q: bad shape rows=%d inter=%d ld=%d (inter %% 128 == 0, ld %% 4 == 0)", a.Rows, a.Inter, a.LD)
	case (a.GF == 0) != (a.UF == 0):
		return fmt.Errorf("cuda: moe_swiglu_q: g and u copies go together")
	case a.Exact && a.H == 0, !a.Exact && (a.HQ == 0 || a.HS == 0):
		return fmt.Errorf("cuda: moe_swiglu_q: no output (exact %v)", a.Exact)
	}
	if a.Rows == 0 {
		return nil
	}
	grid, err := warpGrid(int64(a.Rows) * int64(a.Inter/128))
	if err != nil {
		return fmt.Errorf("cuda: moe_swiglu_q: %w", err)
	}
	args := new(Args).Ptr(a.HQ).Ptr(a.HS).Ptr(a.H).Ptr(a.G).Ptr(a.U).I32(a.LD).Ptr(a.Perm).Ptr(a.Offsets).I32(a.Experts).
		Ptr(a.Weights).I32(a.Inter).F32(a.Limit).Ptr(a.GF).Ptr(a.UF).I32(a.Rows).I32(b2i(a.Exact))
	return launch(s, "moe_fused", "moe_swiglu_q", grid, Dim3{256, 1, 1}, 0, args)
}
