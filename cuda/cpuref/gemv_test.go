package cpuref

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// fmaBig is a·b + c computed exactly and rounded once to float32.
func fmaBig(a, b, c float32) float32 {
	x := new(big.Float).SetPrec(1000).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ := x.Float32()
	return f
}

// TestFMA32: one rounding, also where the float64 sum lands on a float32
// midpoint that the exact sum is not on (either side, either parity), with
// subnormal results, and on random operands of mixed magnitudes.
func TestFMA32(t *testing.T) {
	const u = 1.0 / (1 << 23)
	up, dn := float32(1+u), float32(1-u) // up·dn = 1 - 2^-46
	for _, c := range []struct{ a, b, c, want float32 }{
		{up * 0x1p-24, dn, 1 + u, 1 + u},        // just below the midpoint above 1+2^-23 (odd)
		{up * 0x1p-24, dn, 1, 1},                // just below the midpoint above 1 (even)
		{up * 0x1p-24, up, 1, 1 + u},            // above it
		{-up * 0x1p-24, dn, 1 + 2*u, 1 + 2*u},   // just above the midpoint below 1+2^-22
		{0x1p-126, 0x1p-24, 0x1p-149, 0x1p-148}, // subnormal tie to even
		{3, 0.5, -1.5, 0},
	} {
		if got := FMA32(c.a, c.b, c.c); math.Float32bits(got) != math.Float32bits(c.want) || got != fmaBig(c.a, c.b, c.c) {
			t.Errorf("FMA32(%g, %g, %g) = %g, want %g (big: %g)", c.a, c.b, c.c, got, c.want, fmaBig(c.a, c.b, c.c))
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	val := func() float32 {
		return float32(rng.NormFloat64() * math.Ldexp(1, rng.IntN(60)-30))
	}
	for range 200000 {
		a, b, c := val(), val(), val()
		if got, want := FMA32(a, b, c), fmaBig(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("FMA32(%g, %g, %g) = %g, want %g", a, b, c, got, want)
		}
	}
}
