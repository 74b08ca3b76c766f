package ptxemu

import (
	"math"
	"sort"
	"testing"
)

// Conversions of f16, bf16 and e4m3 against brute-force references

// refF16Value decodes an f16 bit pattern from the format's definition.
func refF16Value(h uint16) float32 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e, m := int(h>>10&31), float64(h&1023)
	switch {
	case e == 31 && m == 0:
		return float32(s * math.Inf(1))
	case e == 31:
		return float32(math.NaN())
	case e == 0:
		return float32(s * m * math.Exp2(-24))
	}
	return float32(s * (1024 + m) * math.Exp2(float64(e-25)))
}

// nearestEven picks, among the sorted non-negative codes' values, the one
// nearest to x >= 0, ties to the even code. It returns -1 above the last
// value's upper midpoint (given by top).
func nearestEven(vals []float64, top, x float64) int {
	if x >= top {
		return -1
	}
	i := sort.SearchFloat64s(vals, x)
	if i == len(vals) {
		return i - 1
	}
	if i == 0 || vals[i] == x {
		return i
	}
	lo, hi := x-vals[i-1], vals[i]-x
	switch {
	case lo < hi:
		return i - 1
	case hi < lo:
		return i
	case i%2 == 0:
		return i
	}
	return i - 1
}

var f16Pos = func() []float64 {
	v := make([]float64, 0x7c00)
	for i := range v {
		v[i] = float64(refF16Value(uint16(i)))
	}
	return v
}()

// refF16 is cvt.rn.f16.f32 by search over all f16 values.
func refF16(x float32) uint16 {
	if x != x {
		return 0x7e00
	}
	sign := uint16(0)
	if math.Signbit(float64(x)) {
		sign = 0x8000
	}
	i := nearestEven(f16Pos, 65520, math.Abs(float64(x)))
	if i < 0 {
		return sign | 0x7c00
	}
	return sign | uint16(i)
}

var e4m3Pos = func() []float64 {
	v := make([]float64, 0x7f)
	for i := range v {
		e, m := i>>3, float64(i&7)
		if e == 0 {
			v[i] = m * math.Exp2(-9)
		} else {
			v[i] = (8 + m) * math.Exp2(float64(e-10))
		}
	}
	return v
}()

// refE4M3 is cvt.rn.satfinite.e4m3x2.f32 for one value.
func refE4M3(x float32) uint8 {
	if x != x {
		return 0x7f
	}
	sign := uint8(0)
	if math.Signbit(float64(x)) {
		sign = 0x80
	}
	// satfinite: everything past 448, infinities included, saturates
	i := nearestEven(e4m3Pos, math.Inf(1), min(math.Abs(float64(x)), 1e300))
	return sign | uint8(i)
}

func TestF16Conversions(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		want := refF16Value(uint16(h))
		got := f16ToF32(uint16(h))
		if want != want {
			if got == got || f32ToF16(got)&0x7fff <= 0x7c00 {
				t.Errorf("f16 NaN %#04x -> %v -> %#04x", h, got, f32ToF16(got))
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("f16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := f32ToF16(got); back != uint16(h) {
			t.Fatalf("f32ToF16(f16ToF32(%#04x)) = %#04x", h, back)
		}
	}
	// every midpoint between neighbours, and a float32 ulp either side
	for i := 0; i+1 < len(f16Pos); i++ {
		mid := float32((f16Pos[i] + f16Pos[i+1]) / 2)
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9), -mid} {
			if got, want := f32ToF16(x), refF16(x); got != want {
				t.Fatalf("f32ToF16(%v) = %#04x, want %#04x", x, got, want)
			}
		}
	}
	for _, x := range []float32{65504, 65519.996, 65520, 1e9, float32(math.Inf(-1)), 0x1p-25, 0x1p-25 + 0x1p-40, 0x1p-26, float32(math.Copysign(0, -1))} {
		if got, want := f32ToF16(x), refF16(x); got != want {
			t.Errorf("f32ToF16(%v) = %#04x, want %#04x", x, got, want)
		}
	}
}

func TestBF16Conversions(t *testing.T) {
	for _, tc := range []struct {
		x    float32
		want uint16
	}{
		{1, 0x3f80},
		{-1.5, 0xbfc0},
		{1 + 0x1p-8, 0x3f80},           // tie, to even (down)
		{1 + 3*0x1p-8, 0x3f82},         // tie, to even (up)
		{1 + 0x1p-8 + 0x1p-23, 0x3f81}, // just above the tie
		{0x1p-134, 0x0000},             // half the smallest subnormal: tie to zero
		{3 * 0x1p-134, 0x0002},         // 1.5 subnormal ulps: tie to even (up)
		{math.MaxFloat32, 0x7f80},      // rounds past the largest finite to inf
		{float32(math.Inf(-1)), 0xff80},
	} {
		if got := f32ToBF16(tc.x); got != tc.want {
			t.Errorf("f32ToBF16(%v) = %#04x, want %#04x", tc.x, got, tc.want)
		}
	}
	if h := f32ToBF16(float32(math.NaN())); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
		t.Errorf("f32ToBF16(NaN) = %#04x, not a NaN", h)
	}
	for _, h := range []uint16{0x3f80, 0x0001, 0x7f7f, 0xc2f7} {
		if got := math.Float32bits(bf16ToF32(h)); got != uint32(h)<<16 {
			t.Errorf("bf16ToF32(%#04x) bits %#08x", h, got)
		}
	}
}

func TestE4M3Conversions(t *testing.T) {
	for c := 0; c < 256; c++ {
		got := e4m3ToF32(uint8(c))
		if c&0x7f == 0x7f {
			if got == got {
				t.Errorf("e4m3ToF32(%#02x) = %v, want NaN", c, got)
			}
			continue
		}
		want := float32(e4m3Pos[c&0x7f])
		if c&0x80 != 0 {
			want = -want
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Errorf("e4m3ToF32(%#02x) = %v, want %v", c, got, want)
		}
		if back := f32ToE4M3(got); back != uint8(c) {
			t.Errorf("f32ToE4M3(%v) = %#02x, want %#02x", got, back, c)
		}
	}
	var xs []float32
	for i := 0; i+1 < len(e4m3Pos); i++ {
		mid := float32((e4m3Pos[i] + e4m3Pos[i+1]) / 2)
		xs = append(xs, mid, -mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9))
	}
	inf := float32(math.Inf(1))
	xs = append(xs, 448, 449, 464, 480, 1e9, inf, -inf, -500, 0x1p-10, 0x1p-10+0x1p-30, 0x1p-11, 0x1p-20, 0, float32(math.Copysign(0, -1)))
	for _, x := range xs {
		if got, want := f32ToE4M3(x), refE4M3(x); got != want {
			t.Errorf("f32ToE4M3(%v) = %#02x, want %#02x", x, got, want)
		}
	}
	if got := f32ToE4M3(float32(math.NaN())); got&0x7f != 0x7f {
		t.Errorf("f32ToE4M3(NaN) = %#02x, want 0x7f", got)
	}
	if refE4M3(1e9) != 0x7e || refE4M3(-inf) != 0xfe {
		t.Error("refE4M3 does not saturate")
	}
}
