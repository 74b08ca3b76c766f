package cuda

import "fmt"

// Launchers of kernels/hc_f32.cu: hc pre/head collapse, per-head norm and the
// Hadamard + FP4 simulation on fp32 activations (rnd/fp4: faithful mode).

// hcStreams reports whether hc_f32.cu instantiates n streams.
func hcStreams(n int) bool { return n == 1 || n == 2 || n == 4 || n == 8 }

// HcStreamsUnrolled reports whether the hc kernels have an unrolled variant
// for n streams (1, 2, 4 or 8), which the fused epilogues need.
func HcStreamsUnrolled(n int) bool { return hcStreams(n) }

// HcPreF32 collapses x [rows, n*d] with fn [(2+n)*n, n*d] and base [(2+n)*n]
// into out [rows, d] and writes post|comb (Sinkhorn, iters rounds) into
// mix [rows, n+n*n]. scale holds the pre, post and comb scales.
func HcPreF32(s *Stream, out, mix, x, fn, base DevicePtr, rows, n, d int, scale [3]float32, iters int, eps, normEps float32, rnd bool) error {
	if rows < 0 || !hcStreams(n) || d <= 0 || int64(n)*int64(d) > 1<<31-1 || iters < 0 {
		return fmt.Errorf("cuda: hc_pre_f32: bad shape rows=%d n=%d (1, 2, 4 or 8) d=%d iters=%d", rows, n, d, iters)
	}
	if rows == 0 {
		return nil
	}
	if p, ok := planHcPre(rows, n, (2+n)*n, d, s.ctx.dev.SMs); ok {
		k := hcPreKernels(n)
		if err := p.launchPart(s, k.part, out, x, fn, rows, d); err != nil {
			return err
		}
		a := new(Args).Ptr(out).Ptr(mix).Ptr(x).Ptr(base).I32(d).F32(scale[0]).F32(scale[1]).F32(scale[2]).
			I32(iters).F32(eps).F32(normEps).I32(b2i(rnd)).I32(p.splits)
		return launch(s, "hc_f32", k.fin, Dim3{uint32(rows), 1, 1}, Dim3{hcFinThreads, 1, 1}, 0, a)
	}
	a := new(Args).Ptr(out).Ptr(mix).Ptr(x).Ptr(fn).Ptr(base).I32(d).F32(scale[0]).F32(scale[1]).F32(scale[2]).
		I32(iters).F32(eps).F32(normEps).I32(b2i(rnd))
	return launch(s, "hc_f32", fmt.Sprintf("hc_pre_f32_n%d", n), Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// HcPreNormF32 is HcPreF32 followed by RMSNormF32(y, out, w, rows, d,
// normEps, rnd) in the launches of HcPreF32 alone: hc_pre_fin_norm_f32
// forms the hc output where the norm needs it and writes only the norm into
// y [rows, d] (bit for bit the two launches); out holds the split's
// partials and is left undefined. ok false: nothing was launched, as the
// split does not apply or a pointer is not 16-byte aligned (rmsnorm_f32
// would take its scalar path); run the two separately. q, qs (both or
// neither; d % 128 == 0): also write y's FP8 quantisation there, QuantFP8F32's
// codes [rows, d] and scales [rows, d/128] for blocks of 128.
func HcPreNormF32(s *Stream, y, out, mix, x, fn, base, w, q, qs DevicePtr, rows, n, d int, scale [3]float32, iters int, eps, hcNormEps, normEps float32, rnd bool) (ok bool, err error) {
	if rows <= 0 || !hcStreams(n) || d <= 0 || int64(n)*int64(d) > 1<<31-1 || iters < 0 || (y|out|x|w)&15 != 0 {
		return false, nil
	}
	if (q == 0) != (qs == 0) || q != 0 && (d%128 != 0 || q%4 != 0) {
		return false, fmt.Errorf("cuda: hc_pre_fin_norm: quantised output needs q and scales, d %% 128 == 0 and 4-byte aligned codes (d=%d, q %#x)", d, uint64(q))
	}
	p, ok := planHcPre(rows, n, (2+n)*n, d, s.ctx.dev.SMs)
	if !ok {
		return false, nil
	}
	k := hcPreKernels(n)
	if err := p.launchPart(s, k.part, out, x, fn, rows, d); err != nil {
		return true, err
	}
	a := new(Args).Ptr(y).Ptr(out).Ptr(mix).Ptr(x).Ptr(base).Ptr(w).I32(d).F32(scale[0]).F32(scale[1]).F32(scale[2]).
		I32(iters).F32(eps).F32(hcNormEps).I32(b2i(rnd)).I32(p.splits).F32(normEps)
	name := k.finNorm
	if q != 0 {
		name = fmt.Sprintf("hc_pre_fin_norm_quant_f32_n%d", n)
		a.Ptr(q).Ptr(qs)
	}
	return true, launch(s, "hc_f32", name, Dim3{uint32(rows), 1, 1}, Dim3{hcFinThreads, 1, 1}, 0, a)
}

// hcPreSplit names the split hc pre's kernels for n streams: the partial
// sums, then the final kernel alone or fused with the RMS norm (warps 0-7 and
// the Sinkhorn warp).
type hcPreSplit struct{ part, fin, finNorm string }

const hcFinThreads = 256 + 32

func hcPreKernels(n int) hcPreSplit {
	return hcPreSplit{fmt.Sprintf("hc_pre_part_f32_n%d", n), fmt.Sprintf("hc_pre_fin_f32_n%d", n),
		fmt.Sprintf("hc_pre_fin_norm_f32_n%d", n)}
}

// hcPrePlan is the split launch of hc pre: splits column chunks of cols
// (multiple of 4) of the flattened n·d width, rowsPer rows per CTA.
type hcPrePlan struct{ splits, cols, rowsPer int }

// planHcPre splits the n·d-long projections (mix of them: (2+n)·n for hc
// pre, n for hc head) over about two CTAs per SM (the
// count only steers speed), chunks of 128 to 1024 columns. The partials live
// in out itself (splits float64 sums of squares, then splits·mix floats per
// row), so the split needs them to fit in d floats; ok false: the fused
// one-CTA-per-row kernel.
func planHcPre(rows, n, mix, d, sms int) (hcPrePlan, bool) {
	p := hcPrePlan{rowsPer: 8}
	if n > 4 {
		p.rowsPer = 4
	}
	width := n * d
	if d%4 != 0 || rows <= 0 {
		return p, false
	}
	sms = max(sms, 1)
	blocks := ceilDiv(rows, p.rowsPer)
	const minCols, maxCols = 128, 1024
	sp := ceilDiv(2*sms, blocks)
	sp = min(sp, max(1, width/minCols), max(1, d/(mix+2)))
	sp = max(sp, ceilDiv(width, maxCols))
	p.cols = (ceilDiv(width, sp) + 3) &^ 3
	p.splits = ceilDiv(width, p.cols)
	if p.splits*(mix+2) > d || p.splits > 65535 || blocks > 65535 {
		return p, false
	}
	return p, true
}

// launchPart launches the split's partial-sum kernel (hc_pre_part or
// hc_head_part): the partials go to out's rows.
func (p hcPrePlan) launchPart(s *Stream, name string, out, x, fn DevicePtr, rows, d int) error {
	a := new(Args).Ptr(out).Ptr(x).Ptr(fn).I32(rows).I32(d).I32(p.cols).I32(p.splits)
	grid := Dim3{uint32(p.splits), uint32(ceilDiv(rows, p.rowsPer)), 1}
	return launch(s, "hc_f32", name, grid, Dim3{256, 1, 1}, 4*p.rowsPer*p.cols, a)
}

// HcHeadF32 is the final collapse: fn [n, n*d], base [n], one scale, no
// Sinkhorn; split over CTAs like hc pre where the partials fit.
func HcHeadF32(s *Stream, out, x, fn, base DevicePtr, rows, n, d int, scale, eps, normEps float32, rnd bool) error {
	if rows < 0 || !hcStreams(n) || d <= 0 || int64(n)*int64(d) > 1<<31-1 {
		return fmt.Errorf("cuda: hc_head_f32: bad shape rows=%d n=%d (1, 2, 4 or 8) d=%d", rows, n, d)
	}
	if rows == 0 {
		return nil
	}
	if p, ok := planHcPre(rows, n, n, d, s.ctx.dev.SMs); ok {
		if err := p.launchPart(s, fmt.Sprintf("hc_head_part_f32_n%d", n), out, x, fn, rows, d); err != nil {
			return err
		}
		a := new(Args).Ptr(out).Ptr(x).Ptr(base).I32(d).F32(scale).F32(eps).F32(normEps).I32(b2i(rnd)).I32(p.splits)
		return launch(s, "hc_f32", fmt.Sprintf("hc_head_fin_f32_n%d", n), Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
	}
	a := new(Args).Ptr(out).Ptr(x).Ptr(fn).Ptr(base).I32(d).F32(scale).F32(eps).F32(normEps).I32(b2i(rnd))
	return launch(s, "hc_f32", fmt.Sprintf("hc_head_f32_n%d", n), Dim3{uint32(rows), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// HeadNormF32 RMS-normalises (no weight) every segment of hd values of x in place.
func HeadNormF32(s *Stream, x DevicePtr, segs, hd int, eps float32, rnd bool) error {
	if segs < 0 || hd <= 0 {
		return fmt.Errorf("cuda: head_norm_f32: bad shape segs=%d hd=%d", segs, hd)
	}
	if segs == 0 {
		return nil
	}
	blocks := ceilDiv(segs, 8) // 8 warps, one segment each
	if blocks > 1<<31-1 {
		return fmt.Errorf("cuda: head_norm_f32: %d segments exceed the grid", segs)
	}
	a := new(Args).Ptr(x).I64(int64(segs)).I32(hd).F32(eps).I32(b2i(rnd))
	return launch(s, "hc_f32", "head_norm_f32", Dim3{uint32(blocks), 1, 1}, Dim3{256, 1, 1}, 0, a)
}

// HadamardFP4F32 rotates every segment of hd (a power of two, ≤ 16384) values
// of x in place, scaled by sc, then (fp4) rounds to bf16 and FP4-simulates
// per 32 values.
func HadamardFP4F32(s *Stream, x DevicePtr, segs, hd int, sc float32, fp4 bool) error {
	if segs < 0 || hd <= 0 || hd&(hd-1) != 0 || hd > 16384 || segs > 1<<31-1 {
		return fmt.Errorf("cuda: hadamard_fp4_f32: bad shape segs=%d hd=%d (power of two ≤ 16384)", segs, hd)
	}
	if segs == 0 {
		return nil
	}
	threads := min(max(hd/2, 32), 256)
	a := new(Args).Ptr(x).I32(hd).F32(sc).I32(b2i(fp4))
	return launch(s, "hc_f32", "hadamard_fp4_f32", Dim3{uint32(segs), 1, 1}, Dim3{uint32(threads), 1, 1}, 4*hd, a)
}

// RopeHadamardFP4F32 is RopeF32 (the last rd values of every head) then
// HadamardFP4F32 on x [rows, heads*hd] in one launch, bit for bit the two
// (faithful: RopeF32's faithful and HadamardFP4F32's fp4).
func RopeHadamardFP4F32(s *Stream, x, pos, f32, f64 DevicePtr, rows, heads, hd, rd int, sc float32, inverse, faithful bool) error {
	segs := int64(rows) * int64(heads)
	if rows < 0 || heads <= 0 || hd <= 0 || hd&(hd-1) != 0 || hd > 16384 || rd <= 0 || rd%2 != 0 || rd > hd || segs > 1<<31-1 {
		return fmt.Errorf("cuda: rope_hadamard_fp4_f32: bad shape rows=%d heads=%d hd=%d rd=%d (hd a power of two ≤ 16384, rd even ≤ hd)", rows, heads, hd, rd)
	}
	if segs == 0 {
		return nil
	}
	threads := min(max(hd/2, 32), 256)
	a := new(Args).Ptr(x).Ptr(pos).Ptr(f32).Ptr(f64).I32(heads).I32(hd).I32(rd).I32(b2i(inverse)).F32(sc).I32(b2i(faithful))
	return launch(s, "hc_f32", "rope_hadamard_fp4_f32", Dim3{uint32(segs), 1, 1}, Dim3{uint32(threads), 1, 1}, 4*hd, a)
}
