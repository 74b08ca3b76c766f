package cuda

import "fmt"

// BF16DecMaxRows is the most rows linear_bf16_dec takes (four 8-token MMA tiles).
const BF16DecMaxRows = 32

// bf16DecSplitTiles bounds the row tiles of a linear_bf16_dec launch that
// splits K (a fixup counter each; the head's 129280 rows are 1010 tiles).
const bf16DecSplitTiles = 1056

// bf16DecKernels are linear_bf16_dec's entry points by token tiles (1, 2, 4):
// bf16 weights, FP8 weights, bf16 weights with fp32 x in three planes.
var bf16DecKernels = map[int][3]string{
	1: {"linear_bf16_dec1_w1", "linear_bf16_dec1_w2", "linear_bf16x3_dec1_w1"},
	2: {"linear_bf16_dec2_w1", "linear_bf16_dec2_w2", "linear_bf16x3_dec2_w1"},
	4: {"linear_bf16_dec4_w1", "linear_bf16_dec4_w2", "linear_bf16x3_dec4_w1"},
}

// bf16DecTiles is the kernel's 8-token tiles for m rows (1, 2 or 4).
func bf16DecTiles(m int) int {
	switch {
	case m <= 8:
		return 1
	case m <= 16:
		return 2
	}
	return 4
}

// planBF16Dec splits K for linear_bf16_dec: K slices of at most 2048/NT
// (33 KB of x in shared memory, 99 KB in three planes: two CTAs an SM),
// then halved while the grid stays within two CTAs an SM (the CTAs' weight
// loads are all in flight in one wave: more splits only add partial sums).
// ok is false when K does not split into 128-multiples (or a split grid
// has more row tiles than the stream has counters).
func planBF16Dec(m, n, k, sms int) (kc, splits int, ok bool) {
	if k%128 != 0 {
		return 0, 0, false
	}
	tiles, kcMax := n/128, 2048/bf16DecTiles(m)
	splits = 1
	for k/splits > kcMax {
		if k%(2*splits*128) != 0 {
			return 0, 0, false
		}
		splits *= 2
	}
	for tiles*splits*2 <= 2*max(sms, 1) && k%(2*splits*128) == 0 {
		splits *= 2
	}
	if splits > 1 && tiles > bf16DecSplitTiles { // a split-K counter per row tile
		return 0, 0, false
	}
	return k / splits, splits, true
}

// bf16DecFits reports whether linear_bf16_dec takes sh with x and w at those
// addresses (planes 3: bf16 weights only).
func bf16DecFits(sh LinearShape, x, w DevicePtr, planes int) bool {
	if sh.Format != WeightBF16 && (planes == 3 || sh.Format != WeightFP8Block) || sh.M < 1 || sh.M > BF16DecMaxRows ||
		sh.R <= 0 || sh.R%128 != 0 || sh.N%sh.R != 0 || sh.LdX%4 != 0 || sh.LdX < sh.K*(sh.N/sh.R) ||
		x%16 != 0 || w%16 != 0 {
		return false
	}
	_, _, ok := planBF16Dec(sh.M, sh.N, sh.K, 1)
	return ok
}

// BF16DecFits reports whether GroupedLinearBF16Dec takes sh.
func BF16DecFits(sh LinearShape, x, w DevicePtr) bool { return bf16DecFits(sh, x, w, 1) }

// BF16x3DecFits reports whether LinearF32BF16x3Dec takes sh.
func BF16x3DecFits(sh LinearShape, x, w DevicePtr) bool { return bf16DecFits(sh, x, w, 3) }

// BF16DecScratchBytes is the split-K partial buffer GroupedLinearBF16Dec or
// LinearF32BF16x3Dec needs for sh on s's device (0: none).
func BF16DecScratchBytes(s *Stream, sh LinearShape) int {
	_, splits, ok := planBF16Dec(sh.M, sh.N, sh.K, s.ctx.dev.SMs)
	if !ok || splits == 1 {
		return 0
	}
	return 4 * splits * sh.M * sh.N
}

// GroupedLinearBF16Dec runs linear_bf16_dec (kernels/linear_bf16.cu): the
// function of GroupedLinearBF16 (faithful: x holds bf16 values, outputs
// rounded to bf16) for decode-sized M, the weights streamed once as the
// MMAs' A operand. part holds BF16DecScratchBytes(s, sh) bytes when that
// is not zero (split-K partials; the tiles' counters are the stream's).
func GroupedLinearBF16Dec(s *Stream, y, x, w, ws, part DevicePtr, sh LinearShape) error {
	return launchBF16Dec(s, y, x, w, ws, part, sh, 1, true)
}

// LinearF32BF16x3Dec runs linear_bf16x3_dec: the fp32 linear of
// LinearF32BF16x3 (fp32 x split exactly into three bf16 planes, bf16
// weights, fp32 out) for decode-sized M. part: BF16DecScratchBytes(s, sh).
func LinearF32BF16x3Dec(s *Stream, y, x, w, part DevicePtr, sh LinearShape) error {
	return launchBF16Dec(s, y, x, w, 0, part, sh, 3, false)
}

func launchBF16Dec(s *Stream, y, x, w, ws, part DevicePtr, sh LinearShape, planes int, rnd bool) error {
	if !bf16DecFits(sh, x, w, planes) {
		return fmt.Errorf("cuda: linear_bf16_dec: shape %+v or alignment (x %#x, w %#x) not supported with %d x planes",
			sh, uint64(x), uint64(w), planes)
	}
	kc, splits, _ := planBF16Dec(sh.M, sh.N, sh.K, s.ctx.dev.SMs)
	var counters DevicePtr
	if splits > 1 {
		if part == 0 {
			return fmt.Errorf("cuda: linear_bf16_dec: %d K splits need a partial buffer", splits)
		}
		var err error
		if counters, err = s.fixupCounters(); err != nil {
			return err
		}
	}
	nt := bf16DecTiles(sh.M)
	name := bf16DecKernels[nt][0]
	switch {
	case planes == 3:
		name = bf16DecKernels[nt][2]
	case sh.Format == WeightFP8Block:
		name = bf16DecKernels[nt][1]
	}
	a := new(Args).Ptr(y).Ptr(x).Ptr(w).Ptr(ws).Ptr(part).Ptr(counters).I32(sh.SCols).I32(sh.M).I32(sh.N).I32(sh.K).
		I32(sh.R).I32(sh.LdX).I32(kc).I32(b2i(rnd))
	smem := planes * 8 * nt * (kc + 4) * 2
	return launch(s, "linear_bf16", name, Dim3{uint32(sh.N / 128), uint32(splits), 1}, Dim3{256, 1, 1}, smem, a)
}
