package cuda

import "fmt"

// linear_fp8_dsk (kernels/linear_fp8_dsk.cu) is the decode FP8 linear for
// weights read in about one wave: K split across CTAs so that every SM
// holds CTAs, each warp's weight blocks loaded before the PDL wait, the
// CTAs of a 16-row group summed by the last of them.
const (
	dskWarps   = 4 // warps a CTA, on consecutive K slices
	dskWarpsSM = 16
	dskMaxKBT1 = 4 // K blocks a warp at one token tile (registers)
	dskMaxKBT2 = 2 // at two token tiles
)

// dskPlan is a linear_fp8_dsk launch: kb K blocks a warp, z CTAs a 16-row
// group.
type dskPlan struct{ kb, z int }

// planDSK gives each warp the most K blocks (at most dskMaxKBT1, or
// dskMaxKBT2 for two token tiles) whose grid still puts a CTA on every SM,
// else one block a warp; ok is false where the kernel cannot run the shape
// (more than 16 rows, 32-bit byte offsets exceeded, or a split grid with
// more row groups than the stream has split-K counters).
func planDSK(m, n, k, sms int) (p dskPlan, ok bool) {
	if m < 1 || m > decMaxRows || n <= 0 || k <= 0 || k%128 != 0 || n*k >= 1<<32 {
		return dskPlan{}, false
	}
	nkb, groups := k/128, ceilDiv(n, 16)
	kb := dskMaxKBT1
	if m > 8 {
		kb = dskMaxKBT2
	}
	for ; ; kb /= 2 {
		p = dskPlan{kb: kb, z: ceilDiv(ceilDiv(nkb, kb), dskWarps)}
		if kb == 1 || groups*p.z >= sms {
			break
		}
	}
	return p, p.z == 1 || groups <= fixupSlots(sms)
}

// dskWins reports the decode shapes the planner gives linear_fp8_dsk: those
// it runs unsplit (one CTA a row group, no partial sums), every warp's
// weights requested before the PDL wait. On the H100 these were faster than
// linear_fp8_dec and the TMA kernels (Flash wq_b 17.1 against 18.5 us at one
// token, shared w2 7.9 against 8.3), the split plans no faster (Flash wq_a
// 7.6 against 7.0 us, and they lose the pair launches of linear_fp8_dec2).
func dskWins(m, n, k, sms int) bool {
	p, ok := planDSK(m, n, k, sms)
	return ok && p.z == 1
}

// dskScratchBytes is the partial sums linear_fp8_dsk needs at m x n x k
// (0: unsplit, or the kernel does not run the shape).
func dskScratchBytes(m, n, k, sms int) int {
	if p, ok := planDSK(m, n, k, sms); ok && p.z > 1 {
		return 4 * p.z * m * n
	}
	return 0
}

// linearFP8DSK runs linear_fp8_dsk with plan p (scratch: dskScratchBytes
// of partial sums where p.z > 1).
func linearFP8DSK(s *Stream, y, yf, xq, xs, w, ws DevicePtr, m, n, k int, p dskPlan, scratch DevicePtr) error {
	var counters DevicePtr
	if p.z > 1 {
		if scratch == 0 {
			return fmt.Errorf("cuda: linear_fp8_dsk: %d K splits need a partial buffer", p.z)
		}
		var err error
		if counters, err = s.fixupCounters(); err != nil {
			return fmt.Errorf("cuda: linear_fp8_dsk: %w", err)
		}
	} else {
		scratch = 0
	}
	t := 1
	if m > 8 {
		t = 2
	}
	name := fmt.Sprintf("linear_fp8_dsk%d_%d", t, p.kb)
	a := new(Args).Ptr(y).Ptr(xq).Ptr(xs).Ptr(w).Ptr(ws).I32(m).I32(n).I32(k).I32(p.z).Ptr(scratch).Ptr(counters).Ptr(yf)
	grid := Dim3{uint32(ceilDiv(n, 16) * p.z), 1, 1}
	return launch(s, "linear_fp8_dsk", name, grid, Dim3{32 * dskWarps, 1, 1}, 0, a)
}
