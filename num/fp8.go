package num

import "math"

// E4M3 (float8_e4m3fn): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no
// infinities, max ±448, codes 0x7F/0xFF are NaN, subnormals m/8·2^-6.

// E4M3Max is the largest finite e4m3fn magnitude.
const E4M3Max = 448

// E4M3NaN is the canonical NaN code produced by F32ToE4M3.
const E4M3NaN uint8 = 0x7f

// E4M3Table holds the decoded value of every e4m3fn code. It is a read-only lookup
// table: never write to it.
var E4M3Table = func() (t [256]float32) {
	for c := range t {
		t[c] = e4m3Decode(uint8(c))
	}
	return t
}()

func e4m3Decode(b uint8) float32 {
	exp := int(b>>3) & 0xf
	man := int(b & 7)
	if exp == 0xf && man == 7 {
		return float32(math.NaN())
	}
	var v float64
	if exp == 0 {
		v = math.Ldexp(float64(man), -9) // m/8 · 2^-6
	} else {
		v = math.Ldexp(float64(8+man), exp-7-3) // (1+m/8) · 2^(e-7)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// E4M3ToF32 decodes an e4m3fn code.
func E4M3ToF32(b uint8) float32 { return E4M3Table[b] }

// F32ToE4M3 encodes f as e4m3fn the way the reference kernels do: clamp to
// [-448, 448], then round to nearest even (subnormal steps of 2^-9 below 2^-6).
// NaN maps to 0x7F. The sign of zero is kept (-0 -> 0x80), as in PyTorch.
func F32ToE4M3(f float32) uint8 {
	if f != f {
		return E4M3NaN
	}
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 0x80
		f = -f
	}
	if f >= E4M3Max { // includes +Inf
		return sign | 0x7e
	}
	a := float64(f)
	if a < 1.0/64 {
		// Subnormal range: units of 2^-9; a result of 8 units is the smallest
		// normal, whose code is also 8.
		return sign | uint8(math.RoundToEven(a*512))
	}
	_, e := math.Frexp(a) // a = m·2^e, m in [0.5,1): unbiased exponent is e-1
	e--
	q := math.RoundToEven(math.Ldexp(a, 3-e)) // in [8, 16]; 16 carries into the exponent
	return sign | uint8((e+7)<<3+int(q)-8)
}

// E8M0 scale bytes: value 2^(b-127), 0xFF is NaN.

// E8M0ToF32 decodes an E8M0 scale byte (byte 0 is 2^-127, a float32 subnormal).
func E8M0ToF32(b uint8) float32 {
	if b == 0xff {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(b)-127))
}

// E8M0Exp returns the exponent b-127 of a non-NaN scale byte.
func E8M0Exp(b uint8) int { return int(b) - 127 }

// E8M0FromExp returns the byte for 2^e, with e clamped to [-127, 127].
func E8M0FromExp(e int) uint8 {
	e = max(-127, min(127, e))
	return uint8(e + 127)
}

// Pow2F32 returns 2^e as float32 (0 below the subnormal range, +Inf above 127).
func Pow2F32(e int) float32 { return float32(math.Ldexp(1, e)) }

// CeilLog2 is the reference's bit-arithmetic ceil(log2 x): the unbiased exponent
// field of x plus one if any mantissa bit is set. It is exact for positive normal
// float32 values; for other inputs it returns what the same bit arithmetic does
// (0 -> -127, subnormals -> -126, +Inf -> 128).
func CeilLog2(x float32) int {
	u := math.Float32bits(x)
	e := int(u>>23&0xff) - 127
	if u&0x7fffff != 0 {
		e++
	}
	return e
}
