package ptxemu

import (
	"math"
	"sync"
)

// Half and bfloat16 conversions, round to nearest even, as the hardware does.

func f16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / 1024 / 16384 // man * 2^-24
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

func bf16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func f32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// f32ToE4M3 converts with saturation to the finite range (satfinite).
func f32ToE4M3(f float32) uint8 {
	if f != f {
		return 0x7f
	}
	sign := uint8(0)
	if math.Signbit(float64(f)) {
		sign, f = 0x80, -f
	}
	if f >= 448 {
		return sign | 0x7e
	}
	if f < 1.0/1024 { // below half the smallest subnormal 2^-9
		if f > 1.0/1024*0.5*2 {
			return sign | 1
		}
		return sign
	}
	// scale to an integer grid of the binade and round to nearest even
	e := math.Floor(math.Log2(float64(f)))
	if e < -6 {
		e = -6
	}
	q := float64(f) / math.Exp2(e-3)
	r := math.RoundToEven(q)
	v := r * math.Exp2(e-3)
	if v >= 448 {
		return sign | 0x7e
	}
	if v < math.Exp2(-6) {
		return sign | uint8(math.RoundToEven(float64(f)/math.Exp2(-9)))
	}
	ee := math.Floor(math.Log2(v))
	m := v/math.Exp2(ee) - 1
	return sign | uint8(int(ee)+7)<<3 | uint8(math.Round(m*8))
}

func e4m3ToF32(b uint8) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e := int(b>>3) & 0xf
	m := float32(b & 7)
	if e == 0xf && b&7 == 7 {
		return float32(math.NaN())
	}
	if e == 0 {
		return sign * m / 8 * float32(math.Exp2(-6))
	}
	return sign * (1 + m/8) * float32(math.Exp2(float64(e-7)))
}

// fmaOdd is x*y+z for operands of at most 26 significant bits (float32,
// f16, bf16), rounded to float64 with round-to-odd. x*y is then exact, and
// rounding the result once more to nearest, to any format of at most 51
// bits, gives the exactly rounded fma; plain float64 rounding would round
// twice (1 + 2^-24 + 2^-60 would become the tie 1 + 2^-24, then 1).
func fmaOdd(x, y, z float64) float64 {
	p := x * y
	s := p + z
	if math.IsInf(s, 0) || s != s {
		return s
	}
	bb := s - p
	e := (p - (s - bb)) + (z - bb) // p + z == s + e exactly (TwoSum)
	if e == 0 || math.Float64bits(s)&1 == 1 {
		return s
	}
	return math.Nextafter(s, math.Copysign(math.Inf(1), e))
}

// f32Odd rounds v to float32 with round-to-odd, so that rounding the result
// to nearest f16 or bf16 rounds v only once.
func f32Odd(v float64) float32 {
	f := float32(v)
	if float64(f) == v || v != v || math.IsInf(float64(f), 0) || math.Float32bits(f)&1 == 1 {
		return f
	}
	return math.Nextafter32(f, float32(math.Copysign(math.Inf(1), v-float64(f))))
}

func ftz32(f float32) float32 {
	if b := math.Float32bits(f); b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return f
}

// minF/maxF follow PTX: a NaN operand yields the other operand.
func minF(a, b float64) float64 {
	switch {
	case a != a:
		return b
	case b != b:
		return a
	case a == b:
		if math.Signbit(a) {
			return a
		}
		return b
	case a < b:
		return a
	}
	return b
}

func maxF(a, b float64) float64 {
	switch {
	case a != a:
		return b
	case b != b:
		return a
	case a == b:
		if math.Signbit(a) {
			return b
		}
		return a
	case a > b:
		return a
	}
	return b
}

// Lookup tables for the tensor-core inputs the emulator decodes most, built
// on the first mma a module decodes: a serving binary links this package
// (through cuda) and should not pay for them at start-up.
var (
	f16Table   [1 << 16]float32
	e4m3Table  [256]float32
	tablesOnce sync.Once
)

func buildTables() {
	for i := range f16Table {
		f16Table[i] = f16ToF32(uint16(i))
	}
	for i := range e4m3Table {
		e4m3Table[i] = e4m3ToF32(uint8(i))
	}
}
