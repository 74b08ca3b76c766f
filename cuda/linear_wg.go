package cuda

import "fmt"

// The sm_90a FP8 linear (kernels/linear_fp8_wg.cu): TMA loads, wgmma,
// 128x128 tiles (384 threads, one persistent CTA per SM), for more rows than the
// decode kernel takes (H200, 2026-12-04, at 64 rows: 12.4 against 16.0 µs
// for Flash wq_a, 30.9 against 43.5 µs for wo_b, ahead on every shape).

// wgMinRow: the wgmma path accumulates inside each 128-K block at the tensor
// cores' reduced precision (docs/numerics.md). From 17 rows it was faster,
// but on prefills of 17-64 rows the flipped bf16 roundings pushed the GPU's
// end-to-end logits error past the CPU's own sensitivity baseline (H200,
// 2026-12-04: median 16.9 % against 6.5 %; 7.7 % with the mma.sync path), so
// short prefills keep the exact-accumulating kernels.
const (
	wgStages = 6
	wgSmem   = wgStages*2*128*128 + 2*wgStages*8 + 1024 // ring, barriers, alignment slack
	wgMinRow = 65
)

// planLinearWG splits K when the tiles alone fill less than about 2/3 of the
// 132 SMs, keeping at least 4 K blocks per slice.
func planLinearWG(m, n, k int) linearPlan {
	nkb := k / 128
	tiles := ceilDiv(n, 128) * ceilDiv(m, 128)
	if tiles >= 88 || nkb < 8 {
		return linearPlan{splits: 1, per: nkb}
	}
	sp := min(nkb/4, ceilDiv(132, tiles))
	per := ceilDiv(nkb, sp)
	return linearPlan{splits: ceilDiv(nkb, per), per: per}
}

func linearFP8WG(s *Stream, y, xq, xs, w, ws DevicePtr, m, n, k int, scratch DevicePtr) error {
	if !s.ctx.HasTMA() {
		return fmt.Errorf("cuda: linear_fp8_wg: device %s has no sm_90a TMA path", s.ctx.dev.Name)
	}
	p := planLinearWG(m, n, k)
	if scratch == 0 {
		p.splits, p.per = 1, k/128
	}
	ma, err := s.ctx.TensorMapBytes2D(xq, m, k, 128, 128)
	if err != nil {
		return err
	}
	mb, err := s.ctx.TensorMapBytes2D(w, n, k, 128, 128)
	if err != nil {
		return err
	}
	var part DevicePtr
	if p.splits > 1 {
		part = scratch
	}
	a := new(Args).Ptr(y).Map(&ma).Map(&mb).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(part).I32(p.per)
	// Persistent CTAs over the tiles (one per SM at 192 KB of ring); split K
	// keeps one CTA per tile and slice.
	tiles := ceilDiv(n, 128) * ceilDiv(m, 128)
	ctas := tiles
	if p.splits == 1 {
		ctas = min(tiles, s.ctx.dev.SMs)
	}
	grid := Dim3{uint32(ctas), 1, uint32(p.splits)}
	if err := launch(s, "linear_fp8_wg", "linear_fp8_wg", grid, Dim3{384, 1, 1}, wgSmem, a); err != nil || p.splits == 1 {
		return err
	}
	return fp8Reduce(s, y, part, p.splits, m, n, 0, 0)
}

// tdecSmem is linear_fp8_tdec's dynamic shared memory (TBYTES in the kernel:
// four warp rings of 4 stages of 4 KB and their barriers, plus the slack that
// aligns them to 1024 bytes).
const tdecSmem = 4*4*4096 + 8*4*4 + 1024

// linearFP8TDec runs linear_fp8_tdec (m <= 16, sm_90a): 16 output rows per
// CTA, weights and activations by TMA (128-byte boxes of 16 rows).
func linearFP8TDec(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int) error {
	wm, err := s.ctx.TensorMapBytes2D(w, n, k, 16, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec: %w", err)
	}
	xrows := min(m, 16) // a box no taller than the tensor
	xm, err := s.ctx.TensorMapBytes2D(xq, m, k, xrows, 128)
	if err != nil {
		return fmt.Errorf("cuda: linear_fp8_tdec: %w", err)
	}
	a := new(Args).Ptr(y).Ptr(xs).Ptr(ws).I32(m).I32(n).I32(k).Ptr(yf).Map(&wm).Map(&xm).I32(xrows)
	return launch(s, "linear_fp8_tdec", "linear_fp8_tdec", Dim3{uint32(ceilDiv(n, 16)), 1, 1}, Dim3{128, 1, 1}, tdecSmem, a)
}

// tdecWins reports the decode shapes where linear_fp8_tdec beats
// linear_fp8_dec (H200, 2026-12-04e, 1 token, µs tdec/dec): Flash wo_b
// 4096x8192 17.2/22.2, shared w13 4096x4096 11.5/12.4, Pro shared w13
// 6144x7168 20.1/30.9, Pro wq_b 65536x1536 46.5/54.8; slower where n/16 CTAs
// or its four K slices are too few (wq_a, wkv, shared w2, Flash wq_b
// 32768x1024: 23.2/21.9). Pro wo_b 7168x16384 was even (59.2/58.2) until
// linear_fp8_dec's scale loads moved ahead of its MMAs (2026-12-04f run 4:
// 59.0/54.3 at 1 token, 58.5/55.5 at 8), so K = 16384 stays on dec.
func tdecWins(n, k int) bool { return n >= 4096 && k >= 4096 && k < 16384 || n >= 65536 }
