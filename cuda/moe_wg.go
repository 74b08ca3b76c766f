package cuda

import "fmt"

// The sm_90a MoE grouped GEMM (kernels/moe_fp4_wg.cu): the activations turned
// into bf16 once (fp8_dequant_bf16), token tiles of bm rows loaded with TMA,
// the FP4 weights unpacked to bf16 on chip by two producer warpgroups, two
// math warpgroups on wgmma. One CTA per (tile, 128 output columns); CTAs past
// the tile list exit at once, so experts with no rows cost nothing.

// moeWGThreads is the CTA: MW_PRODUCERS = 2 producer warpgroups, 2 math ones.
const moeWGThreads = 4 * 128

// moeWGTiles are the token-tile heights the kernel is built for.
var moeWGTiles = []int{32, 64, 128}

// moeBlockM picks the token tile from the expected rows per expert
// (DeepGEMM's MegaMoE heuristic in spirit): the smallest tile that holds the
// average expert, at most 128. Lists of up to 16 rows per expert run the
// decode kernel (moeDecode), so 32 is the smallest tile.
func moeBlockM(sh MoEShape) int {
	avg := ceilDiv(sh.Rows, max(min(sh.Experts, sh.Rows), 1))
	for _, bt := range moeWGTiles {
		if avg <= bt {
			return bt
		}
	}
	return moeWGTiles[len(moeWGTiles)-1]
}

// moeWGSmem is the dynamic shared memory of moe_fp4_wg<bt> (MoeWG in the
// kernel): the stage ring (bf16 weights 128x128, two 64-K atoms of the token
// tile), its barriers and the slack that aligns the ring to 1024 bytes.
func moeWGSmem(bt int) int {
	stages := 4
	if bt >= 128 {
		stages = 3
	}
	return stages*(128*256+2*bt*128) + 2*stages*8 + 1024
}

func moeFP4WG(s *Stream, y, xq, xs, w, wscale, gscale DevicePtr, nv int, sh MoEShape, p moePlan, scratch DevicePtr) error {
	if !s.ctx.HasTMA() {
		return fmt.Errorf("cuda: moe_fp4_wg: device %s has no sm_90a TMA path", s.ctx.dev.Name)
	}
	xb := scratch.Add(p.tileBytes())
	a := new(Args).Ptr(xb).Ptr(xq).Ptr(xs).I32(sh.Rows).I32(sh.K)
	n8 := sh.Rows * sh.K / 8
	if err := launch(s, "moe_fp4_wg", "fp8_dequant_bf16", Dim3{uint32(min(ceilDiv(n8, 256), 16*s.ctx.dev.SMs)), 1, 1}, Dim3{256, 1, 1}, 0, a); err != nil {
		return err
	}
	mx, err := s.ctx.TensorMapBytes2D(xb, sh.Rows, 2*sh.K, p.bm, 128)
	if err != nil {
		return fmt.Errorf("cuda: moe_fp4_wg: %w", err)
	}
	b := new(Args).Ptr(y).Map(&mx).Ptr(scratch).Ptr(w).Ptr(wscale).Ptr(gscale).I32(nv).I32(sh.N).I32(sh.K)
	// Persistent CTAs (one an SM: the stage ring takes most of its shared
	// memory) walking the tile x 128-column items: the stage ring carries on
	// across items instead of refilling per CTA, a few percent faster.
	grid := Dim3{uint32(min(ceilDiv(sh.N, 128)*p.maxTiles, s.ctx.dev.SMs)), 1, 1}
	return launch(s, "moe_fp4_wg", fmt.Sprintf("moe_fp4_wg%d", p.bm), grid, Dim3{moeWGThreads, 1, 1}, moeWGSmem(p.bm), b)
}
