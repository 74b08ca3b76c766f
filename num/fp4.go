package num

import "math"

// E2M1Table holds the values of the 16 FP4 e2m1 codes (bit 3 is the sign). It is a
// read-only lookup table: never write to it.
var E2M1Table = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// E2M1Max is the largest e2m1 magnitude.
const E2M1Max = 6

// E2M1ToF32 decodes the low 4 bits of code as e2m1.
func E2M1ToF32(code uint8) float32 { return E2M1Table[code&0xf] }

// F32ToE2M1 encodes f as e2m1: clamp to [-6, 6], round to nearest, ties to the even
// code (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). The sign is kept
// (negative values that round to zero give code 8). NaN maps to code 0.
func F32ToE2M1(f float32) uint8 {
	if f != f {
		return 0
	}
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 8
		f = -f
	}
	// Decision thresholds are the midpoints; "<=" where the lower code is even.
	var c uint8
	switch {
	case f <= 0.25:
		c = 0
	case f < 0.75:
		c = 1
	case f <= 1.25:
		c = 2
	case f < 1.75:
		c = 3
	case f <= 2.5:
		c = 4
	case f < 3.5:
		c = 5
	case f <= 5:
		c = 6
	default:
		c = 7
	}
	return sign | c
}

// PackFP4 packs 4-bit codes two per byte, element 2i in the low nibble and 2i+1 in
// the high nibble (an odd trailing code gets a zero high nibble).
func PackFP4(codes []uint8) []byte {
	out := make([]byte, (len(codes)+1)/2)
	for i, c := range codes {
		if i&1 == 0 {
			out[i/2] |= c & 0xf
		} else {
			out[i/2] |= c << 4
		}
	}
	return out
}

// UnpackFP4 unpacks len(codes) 4-bit codes from packed (low nibble first).
func UnpackFP4(packed []byte, codes []uint8) {
	_ = packed[:(len(codes)+1)/2]
	for i := range codes {
		codes[i] = packed[i/2] >> (4 * uint(i&1)) & 0xf
	}
}
