package num

import (
	"fmt"
	"math"
)

// Weight formats (spec §3.4, §8, §9). All matrices are row-major [rows, cols] with
// blocks along cols (the input dimension K).

// FP8BlockSize is the edge of the square FP8 weight scale blocks.
const FP8BlockSize = 128

// MXFP4Block and NVFP4Block are the scale block lengths along the input dimension.
const (
	MXFP4Block = 32
	NVFP4Block = 16
)

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func checkLen(what string, got, want int) {
	if got < want {
		panic(fmt.Sprintf("num: %s has %d elements, need %d", what, got, want))
	}
}

func checkDims(rows, cols int) {
	if rows < 0 || cols < 0 {
		panic(fmt.Sprintf("num: negative dimensions [%d, %d]", rows, cols))
	}
}

// DequantFP8Block decodes an e4m3 [rows, cols] weight with E8M0 scales
// [ceil(rows/128), ceil(cols/128)]: out[r,c] = e4m3(w[r,c]) · 2^(scale[r/128,c/128]-127).
// The product is exact (computed in float32) unless it leaves the float32 range.
func DequantFP8Block(w []byte, scale []byte, rows, cols int, out []float32) {
	checkDims(rows, cols)
	sc := ceilDiv(cols, FP8BlockSize)
	checkLen("FP8 weight", len(w), rows*cols)
	checkLen("FP8 scale", len(scale), ceilDiv(rows, FP8BlockSize)*sc)
	checkLen("output", len(out), rows*cols)
	for r := range rows {
		srow := scale[(r/FP8BlockSize)*sc:]
		wr, or := w[r*cols:(r+1)*cols], out[r*cols:(r+1)*cols]
		for c, q := range wr {
			or[c] = E4M3Table[q] * E8M0ToF32(srow[c/FP8BlockSize])
		}
	}
}

// DequantMXFP4 decodes an MXFP4 weight: packed e2m1 codes [rows, cols/2] (element 2i
// in the low nibble) with E8M0 scales [rows, ceil(cols/32)]:
// out[r,c] = e2m1(code[r,c]) · 2^(scale[r,c/32]-127). cols must be even.
func DequantMXFP4(packed []byte, scale []byte, rows, cols int, out []float32) {
	checkDims(rows, cols)
	if cols%2 != 0 {
		panic(fmt.Sprintf("num: MXFP4 cols %d is odd", cols))
	}
	sc := ceilDiv(cols, MXFP4Block)
	checkLen("MXFP4 weight", len(packed), rows*cols/2)
	checkLen("MXFP4 scale", len(scale), rows*sc)
	checkLen("output", len(out), rows*cols)
	for r := range rows {
		pr := packed[r*cols/2 : (r+1)*cols/2]
		srow := scale[r*sc : (r+1)*sc]
		or := out[r*cols : (r+1)*cols]
		for c := 0; c < cols; c += 2 {
			s := E8M0ToF32(srow[c/MXFP4Block])
			p := pr[c/2]
			or[c] = E2M1Table[p&0xf] * s
			or[c+1] = E2M1Table[p>>4] * s
		}
	}
}

// DequantNVFP4 decodes a ModelOpt NVFP4 weight: packed e2m1 codes [rows, cols/2],
// e4m3 scales [rows, ceil(cols/16)] and a float32 global scale:
// out[r,c] = (e2m1(code) · e4m3(scale[r,c/16])) · global. The inner product is exact
// in float32 (2 x 4 significant bits), so each output is the correctly rounded value
// of the exact three-way product, the same as a GEMM that applies the global scale
// last.
func DequantNVFP4(packed []byte, scale []byte, global float32, rows, cols int, out []float32) {
	checkDims(rows, cols)
	if cols%2 != 0 {
		panic(fmt.Sprintf("num: NVFP4 cols %d is odd", cols))
	}
	sc := ceilDiv(cols, NVFP4Block)
	checkLen("NVFP4 weight", len(packed), rows*cols/2)
	checkLen("NVFP4 scale", len(scale), rows*sc)
	checkLen("output", len(out), rows*cols)
	for r := range rows {
		pr := packed[r*cols/2 : (r+1)*cols/2]
		srow := scale[r*sc : (r+1)*sc]
		or := out[r*cols : (r+1)*cols]
		for c := 0; c < cols; c += 2 {
			s := E4M3Table[srow[c/NVFP4Block]]
			p := pr[c/2]
			// float32() forces the rounding order (no fused multiply-add).
			or[c] = float32(E2M1Table[p&0xf]*s) * global
			or[c+1] = float32(E2M1Table[p>>4]*s) * global
		}
	}
}

// pow2CeilDiv returns the smallest k with lim·2^k >= a for finite a > 0, i.e.
// ceil(log2(a/lim)) computed exactly, clamped to [-127, 127] (E8M0 range).
func pow2CeilDiv(a float32, lim float64) int {
	if !(a > 0) {
		return -127
	}
	if math.IsInf(float64(a), 0) {
		return 127
	}
	af := float64(a)
	_, k := math.Frexp(af / lim) // af/lim < 2^k, approximately
	for k > -127 && math.Ldexp(lim, k-1) >= af {
		k--
	}
	for math.Ldexp(lim, k) < af {
		k++
	}
	return max(-127, min(127, k))
}

// QuantMXFP4 quantises w [rows, cols] (cols even) to MXFP4: per 32-element block
// along cols the E8M0 scale is 2^ceil(log2(amax/6)) (exact), codes are
// e2m1(w/scale) with ties to the even code. An all-zero block gets scale byte 0
// (2^-127, the clamp of ceil(log2 0)) and codes 0. Returns packed [rows, cols/2] and
// scale [rows, ceil(cols/32)]. Dequantising and quantising again reproduces the
// dequantised values exactly (scales within the E8M0 range).
func QuantMXFP4(w []float32, rows, cols int) (packed, scale []byte) {
	checkDims(rows, cols)
	if cols%2 != 0 {
		panic(fmt.Sprintf("num: MXFP4 cols %d is odd", cols))
	}
	checkLen("MXFP4 input", len(w), rows*cols)
	sc := ceilDiv(cols, MXFP4Block)
	packed = make([]byte, rows*cols/2)
	scale = make([]byte, rows*sc)
	for r := range rows {
		for b := range sc {
			lo, hi := r*cols+b*MXFP4Block, r*cols+min(cols, (b+1)*MXFP4Block)
			k := pow2CeilDiv(blockAmax(w[lo:hi]), E2M1Max)
			scale[r*sc+b] = E8M0FromExp(k)
			for i := lo; i < hi; i++ {
				// Divide in float64: exact for a power of two, even where the float32
				// quotient would be subnormal.
				c := F32ToE2M1(float32(math.Ldexp(float64(w[i]), -k)))
				j := i - r*cols
				packed[r*cols/2+j/2] |= c << (4 * uint(j&1))
			}
		}
	}
	return packed, scale
}

// QuantNVFP4 quantises w [rows, cols] (cols even) the ModelOpt way: global =
// amax/(6·448) in float32; per 16-element block the e4m3 scale is
// e4m3(amax16/(6·global)) (0 -> 1.0, as ModelOpt does); codes are
// e2m1(w / (float32(scale)·global)). An all-zero tensor gets global = 1.
// QuantNVFP4WithGlobal(DequantNVFP4(...), global) reproduces a quantised tensor
// exactly; recomputing the global from the dequantised amax can move it by an ulp.
func QuantNVFP4(w []float32, rows, cols int) (packed, scale []byte, global float32) {
	checkDims(rows, cols)
	if cols%2 != 0 {
		panic(fmt.Sprintf("num: NVFP4 cols %d is odd", cols))
	}
	checkLen("NVFP4 input", len(w), rows*cols)
	amax := blockAmax(w[:rows*cols])
	global = amax / float32(E2M1Max*E4M3Max)
	if !(global > 0) || math.IsInf(float64(global), 0) {
		global = 1
	}
	return quantNVFP4(w, rows, cols, global)
}

// QuantNVFP4WithGlobal is QuantNVFP4 with a caller-chosen global scale (for example
// a power of two for a lossless MXFP4 cast). global must be positive and finite.
func QuantNVFP4WithGlobal(w []float32, rows, cols int, global float32) (packed, scale []byte) {
	checkDims(rows, cols)
	if cols%2 != 0 {
		panic(fmt.Sprintf("num: NVFP4 cols %d is odd", cols))
	}
	checkLen("NVFP4 input", len(w), rows*cols)
	if !(global > 0) || math.IsInf(float64(global), 0) {
		panic(fmt.Sprintf("num: NVFP4 global scale %v is not positive and finite", global))
	}
	packed, scale, _ = quantNVFP4(w, rows, cols, global)
	return packed, scale
}

func quantNVFP4(w []float32, rows, cols int, global float32) (packed, scale []byte, g float32) {
	sc := ceilDiv(cols, NVFP4Block)
	packed = make([]byte, rows*cols/2)
	scale = make([]byte, rows*sc)
	den := float32(E2M1Max) * global
	for r := range rows {
		for b := range sc {
			lo, hi := r*cols+b*NVFP4Block, r*cols+min(cols, (b+1)*NVFP4Block)
			bs := blockAmax(w[lo:hi]) / den
			if bs == 0 {
				bs = 1
			}
			sb := F32ToE4M3(bs)
			scale[r*sc+b] = sb
			d := E4M3Table[sb] * global
			for i := lo; i < hi; i++ {
				var c uint8
				if d > 0 {
					c = F32ToE2M1(w[i] / d)
				}
				j := i - r*cols
				packed[r*cols/2+j/2] |= c << (4 * uint(j&1))
			}
		}
	}
	return packed, scale, global
}

// QuantFP8Block quantises w [rows, cols] to e4m3 with one power-of-two E8M0 scale per
// 128x128 block: scale = 2^ceil(log2(amax/448)) (exact), codes = e4m3(w/scale). An
// all-zero block gets scale byte 0 (2^-127) and zero codes. Returns codes [rows,
// cols] and scale [ceil(rows/128), ceil(cols/128)].
func QuantFP8Block(w []float32, rows, cols int) (codes, scale []byte) {
	checkDims(rows, cols)
	checkLen("FP8 input", len(w), rows*cols)
	sr, sc := ceilDiv(rows, FP8BlockSize), ceilDiv(cols, FP8BlockSize)
	codes = make([]byte, rows*cols)
	scale = make([]byte, sr*sc)
	for br := range sr {
		for bc := range sc {
			r0, r1 := br*FP8BlockSize, min(rows, (br+1)*FP8BlockSize)
			c0, c1 := bc*FP8BlockSize, min(cols, (bc+1)*FP8BlockSize)
			var amax float32
			for r := r0; r < r1; r++ {
				amax = max(amax, blockAmax(w[r*cols+c0:r*cols+c1]))
			}
			k := pow2CeilDiv(amax, E4M3Max)
			scale[br*sc+bc] = E8M0FromExp(k)
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					codes[r*cols+c] = F32ToE4M3(float32(math.Ldexp(float64(w[r*cols+c]), -k)))
				}
			}
		}
	}
	return codes, scale
}

// MXFP4MaxExp returns the largest exponent (byte-127) among non-NaN E8M0 scales, or
// -127 if there is none.
func MXFP4MaxExp(scale []byte) int {
	k := -127
	for _, s := range scale {
		if s != 0xff {
			k = max(k, int(s)-127)
		}
	}
	return k
}

// MXFP4ScalesToNVFP4 is the lossless MXFP4 -> NVFP4 cast (ModelOpt's option that
// reuses the e2m1 nibbles bit-exactly): with global = 2^globalExp, every 32-block
// E8M0 scale 2^k becomes two e4m3 16-block scales 2^(k-globalExp). The packed codes
// are unchanged. ModelOpt uses globalExp = kmax-8 (MXFP4MaxExp of w1 and w3 together).
// It fails if a scale is NaN or 2^(k-globalExp) is not an e4m3 power of two
// (2^-9..2^8). scale is [rows, ceil(cols/32)]; the result is [rows, ceil(cols/16)].
func MXFP4ScalesToNVFP4(scale []byte, rows, cols, globalExp int) ([]byte, error) {
	checkDims(rows, cols)
	smx, snv := ceilDiv(cols, MXFP4Block), ceilDiv(cols, NVFP4Block)
	if len(scale) != rows*smx {
		return nil, fmt.Errorf("MXFP4 scale has %d bytes, want %d for [%d, %d]", len(scale), rows*smx, rows, cols)
	}
	out := make([]byte, rows*snv)
	for r := range rows {
		for b := range snv {
			s := scale[r*smx+b/2]
			j := int(s) - 127 - globalExp
			if s == 0xff || j < -9 || j > 8 {
				return nil, fmt.Errorf("MXFP4 scale byte %#02x at row %d block %d is not representable relative to 2^%d", s, r, b/2, globalExp)
			}
			out[r*snv+b] = F32ToE4M3(Pow2F32(j))
		}
	}
	return out, nil
}
