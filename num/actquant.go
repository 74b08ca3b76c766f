package num

// Activation block quantisers of the reference kernels (spec §3.3). Blocks run along
// the slice (the caller passes one row, or a row-major matrix whose row length is a
// multiple of the block); a trailing partial block is quantised on its own.

const (
	// fp8ActAmaxFloor is the amax clamp of act_quant (fp32 1e-4).
	fp8ActAmaxFloor = float32(1e-4)
	// fp4ActAmaxFloor is the amax clamp of fp4_act_quant, 6·2^-126.
	fp4ActAmaxFloor = float32(6.0 / (1 << 126))
	inv448          = float32(1.0 / 448)
	inv6            = float32(1.0 / 6)
)

// blockAmax returns max |x| over the block; NaN elements are skipped so that one NaN
// does not poison the scale of its whole block.
func blockAmax(x []float32) float32 {
	var m float32
	for _, v := range x {
		if v < 0 {
			v = -v
		}
		if v > m {
			m = v
		}
	}
	return m
}

// FP8ActScaleExp returns log2 of the act_quant scale for a block with the given
// amax: ceil(log2(max(amax,1e-4) · fp32(1/448))) with the reference bit arithmetic.
// The result is clamped to [-127, 127] (only non-finite amax reaches the clamp).
func FP8ActScaleExp(amax float32) int {
	amax = max(amax, fp8ActAmaxFloor)
	return min(127, CeilLog2(amax*inv448))
}

// FP4ActScaleExp returns log2 of the fp4_act_quant scale for a block with the given
// amax: ceil(log2(max(amax, 6·2^-126) · fp32(1/6))), at least -126.
func FP4ActScaleExp(amax float32) int {
	amax = max(amax, fp4ActAmaxFloor)
	return min(127, CeilLog2(amax*inv6))
}

func numBlocks(n, block int) int {
	if block <= 0 {
		panic("num: block size must be positive")
	}
	return (n + block - 1) / block
}

// QuantFP8Act quantises x in blocks of block elements like the reference act_quant:
// amax clamped to >= 1e-4, s = 2^CeilLog2(amax·fp32(1/448)), q = e4m3(clamp(x/s,
// -448, 448)). codes receives len(x) e4m3 codes, scaleExp[b] = log2 of block b's
// scale (the e8m0 byte is scaleExp+127). NaN inputs give NaN codes.
func QuantFP8Act(x []float32, block int, codes []uint8, scaleExp []int8) {
	nb := numBlocks(len(x), block)
	_ = codes[:len(x)]
	_ = scaleExp[:nb]
	for b := range nb {
		lo, hi := b*block, min(len(x), (b+1)*block)
		e := FP8ActScaleExp(blockAmax(x[lo:hi]))
		s := Pow2F32(e)
		scaleExp[b] = int8(e)
		for i := lo; i < hi; i++ {
			// x/s is exact (power of two); F32ToE4M3 clamps to ±448.
			codes[i] = F32ToE4M3(x[i] / s)
		}
	}
}

// QuantFP8ActInPlace replaces x by its act_quant simulation q·s (exact in bf16).
func QuantFP8ActInPlace(x []float32, block int) {
	nb := numBlocks(len(x), block)
	for b := range nb {
		lo, hi := b*block, min(len(x), (b+1)*block)
		s := Pow2F32(FP8ActScaleExp(blockAmax(x[lo:hi])))
		for i := lo; i < hi; i++ {
			x[i] = E4M3Table[F32ToE4M3(x[i]/s)] * s
		}
	}
}

// QuantFP4Act quantises x like the reference fp4_act_quant: amax clamped to >=
// 6·2^-126, s = 2^CeilLog2(amax·fp32(1/6)), q = e2m1(clamp(x/s, -6, 6)) with ties to
// the even code. codes receives len(x) 4-bit codes (unpacked), scaleExp the block
// exponents.
func QuantFP4Act(x []float32, block int, codes []uint8, scaleExp []int8) {
	nb := numBlocks(len(x), block)
	_ = codes[:len(x)]
	_ = scaleExp[:nb]
	for b := range nb {
		lo, hi := b*block, min(len(x), (b+1)*block)
		e := FP4ActScaleExp(blockAmax(x[lo:hi]))
		s := Pow2F32(e)
		scaleExp[b] = int8(e)
		for i := lo; i < hi; i++ {
			codes[i] = F32ToE2M1(x[i] / s)
		}
	}
}

// QuantFP4ActInPlace replaces x by its fp4_act_quant simulation q·s (exact in bf16).
func QuantFP4ActInPlace(x []float32, block int) {
	nb := numBlocks(len(x), block)
	for b := range nb {
		lo, hi := b*block, min(len(x), (b+1)*block)
		s := Pow2F32(FP4ActScaleExp(blockAmax(x[lo:hi])))
		for i := lo; i < hi; i++ {
			x[i] = E2M1Table[F32ToE2M1(x[i]/s)] * s
		}
	}
}
