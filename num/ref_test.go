package num

import (
	"math"
	"math/bits"
	"sort"
)

// Independent float64 reference implementations used by the tests.

// refNearest returns the index in grid (sorted ascending, finite, non-negative) of
// the value nearest to a >= 0, ties going to the index chosen by even(i, j).
func refNearest(grid []float64, a float64, tieLow func(lo int) bool) int {
	i := sort.SearchFloat64s(grid, a) // first grid[i] >= a
	if i == len(grid) {
		return len(grid) - 1
	}
	if grid[i] == a || i == 0 {
		return i
	}
	dl, dh := a-grid[i-1], grid[i]-a
	switch {
	case dl < dh:
		return i - 1
	case dh < dl:
		return i
	case tieLow(i - 1):
		return i - 1
	}
	return i
}

// refE4M3Value decodes a code from the format definition.
func refE4M3Value(c int) float64 {
	s := 1.0
	if c&0x80 != 0 {
		s = -1
	}
	e, m := (c>>3)&15, c&7
	if e == 0 {
		return s * float64(m) / 8 * math.Pow(2, -6)
	}
	return s * (1 + float64(m)/8) * math.Pow(2, float64(e-7))
}

// e4m3PosGrid lists the 127 non-negative finite e4m3 values; index == code.
func e4m3PosGrid() []float64 {
	g := make([]float64, 127)
	for c := range g {
		g[c] = refE4M3Value(c)
	}
	return g
}

// refF32ToE4M3 is the reference saturating RNE encoder.
func refF32ToE4M3(f float32) uint8 {
	if f != f {
		return 0x7f
	}
	a := math.Abs(float64(f))
	a = math.Min(a, 448)
	c := refNearest(e4m3PosGrid(), a, func(lo int) bool { return lo%2 == 0 })
	if math.Signbit(float64(f)) {
		c |= 0x80
	}
	return uint8(c)
}

var e2m1Pos = []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

func refF32ToE2M1(f float32) uint8 {
	if f != f {
		return 0
	}
	a := math.Min(math.Abs(float64(f)), 6)
	c := refNearest(e2m1Pos, a, func(lo int) bool { return lo%2 == 0 })
	if math.Signbit(float64(f)) {
		c |= 8
	}
	return uint8(c)
}

// refCeilLog2 returns the smallest k with 2^k >= a for a > 0 (exact).
func refCeilLog2(a float64) int {
	k := -1100
	for math.Ldexp(1, k) < a {
		k++
	}
	return k
}

// refPow2Ceil returns the smallest k with lim·2^k >= a (exact), found by scanning.
func refPow2Ceil(a, lim float64) int {
	k := -300
	for math.Ldexp(lim, k) < a {
		k++
	}
	return k
}

// refBF16 rounds f to bf16 by picking the nearer of the two neighbouring bf16 values
// in float64 (ties to even, overflow to Inf per IEEE).
func refBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if f != f {
		return 0xffff // marker: caller checks NaN-ness
	}
	lo := uint16(u >> 16)
	if u&0xffff == 0 {
		return lo
	}
	hi := lo + 1
	mag := func(b uint16) float64 {
		if b&0x7fff == 0x7f80 {
			return math.Ldexp(1, 128) // Inf acts as 2^128 for rounding purposes
		}
		return math.Abs(float64(math.Float32frombits(uint32(b) << 16)))
	}
	a := math.Abs(float64(f))
	dl, dh := a-mag(lo), mag(hi)-a
	switch {
	case dl < dh:
		return lo
	case dh < dl:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

// hadamardEntry is H_n[i][j] of the natural-order Sylvester matrix.
func hadamardEntry(i, j int) float64 {
	if bits.OnesCount(uint(i&j))%2 == 1 {
		return -1
	}
	return 1
}
