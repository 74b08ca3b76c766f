package num

import (
	"encoding/binary"
	"math"
)

// BF16 is a bfloat16 value stored as its bit pattern.
type BF16 uint16

// BF16FromF32 rounds f to bfloat16 with round-to-nearest-even. NaN stays NaN (the
// quiet bit is forced so that truncating a signalling payload cannot yield Inf);
// ±Inf stays ±Inf and finite values beyond the bf16 range round to ±Inf.
func BF16FromF32(f float32) BF16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN
		return BF16(u>>16 | 0x0040)
	}
	// Adding 0x7fff plus the lowest kept bit rounds half to even.
	u += 0x7fff + (u>>16)&1
	return BF16(u >> 16)
}

// F32 widens b to float32 (exact).
func (b BF16) F32() float32 { return math.Float32frombits(uint32(b) << 16) }

// RoundBF16 rounds f to the nearest bf16 value (RNE) and returns it as float32.
func RoundBF16(f float32) float32 { return BF16FromF32(f).F32() }

// RoundBF16Slice rounds every element of x to bf16 in place.
func RoundBF16Slice(x []float32) {
	for i, v := range x {
		x[i] = BF16FromF32(v).F32()
	}
}

// IsBF16 reports whether f is exactly representable in bf16 (NaNs excluded).
func IsBF16(f float32) bool {
	return math.Float32bits(f)&0xffff == 0 && f == f
}

// DecodeBF16 converts little-endian bf16 bytes (len(src) == 2*len(dst)) to float32.
func DecodeBF16(src []byte, dst []float32) {
	_ = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// EncodeBF16 rounds src to bf16 (RNE) and writes little-endian bytes to dst
// (len(dst) >= 2*len(src)).
func EncodeBF16(src []float32, dst []byte) {
	_ = dst[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], uint16(BF16FromF32(v)))
	}
}

// F16ToF32 converts an IEEE 754 binary16 bit pattern to float32 (exact, including
// subnormals, ±Inf and NaN payloads).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf / NaN: keep the payload in the top mantissa bits
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: man * 2^-24, exactly representable as a normal float32.
	v := float32(man) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// F32ToF16 rounds f to IEEE binary16 with round-to-nearest-even (overflow to ±Inf,
// NaN stays a quiet NaN). Provided for writing F16 test checkpoints.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	if a > 0x7f800000 {
		return sign | 0x7e00 | uint16(a>>13)&0x3ff
	}
	if a >= 0x477ff000 { // >= 65520 rounds to Inf (and Inf itself)
		return sign | 0x7c00
	}
	if a >= 0x38800000 { // normal half (>= 2^-14)
		// Rebias the exponent and round the 13 dropped bits to even; a carry into
		// the exponent is the correct result.
		a -= (127 - 15) << 23
		a += 0xfff + (a>>13)&1
		return sign | uint16(a>>13)
	}
	// Subnormal half: value = round(|f| * 2^24) units of 2^-24; exact in float64.
	q := math.RoundToEven(float64(math.Float32frombits(a)) * (1 << 24))
	return sign | uint16(q)
}

// DecodeF16 converts little-endian half bytes to float32.
func DecodeF16(src []byte, dst []float32) {
	_ = src[:2*len(dst)]
	for i := range dst {
		dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// DecodeF32 converts little-endian float32 bytes to float32.
func DecodeF32(src []byte, dst []float32) {
	_ = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// EncodeF32 writes src as little-endian float32 bytes.
func EncodeF32(src []float32, dst []byte) {
	_ = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}
