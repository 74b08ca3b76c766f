package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
)

// splitBF16x3 is linear_bf16x3's split of an fp32 value (kernels/linear_bf16.cu):
// hi and mid by clearing the low 16 bits, lo the remainder.
func splitBF16x3(v float32) (hi, mid, lo float32) {
	hi = math.Float32frombits(math.Float32bits(v) &^ 0xffff)
	r := v - hi
	mid = math.Float32frombits(math.Float32bits(r) &^ 0xffff)
	return hi, mid, r - mid
}

// TestBF16x3SplitExact: the three parts are bf16 values (low 16 bits zero)
// and sum back to x exactly, so the kernel's three bf16 products are exact,
// for |x| >= 2^-110 (below, the remainder can be an fp32 subnormal whose
// low bits the kernel drops: an error under 2^-133 per element).
func TestBF16x3SplitExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vals := []float32{0, -0, 1, -1, 1.2345678, math.MaxFloat32, -math.MaxFloat32, 1e-30, -3.3e-20, 0x1p-100, 0x1.fffffep-110, -0x1.000002p-110}
	for range 200000 {
		e := rng.IntN(230) - 110
		if v := float32(rng.NormFloat64() * math.Ldexp(1, e)); math.Abs(float64(v)) >= 0x1p-110 {
			vals = append(vals, v)
		}
	}
	for _, v := range vals {
		hi, mid, lo := splitBF16x3(v)
		for _, p := range []float32{hi, mid, lo} {
			if math.Float32bits(p)&0xffff != 0 {
				t.Fatalf("%g: part %g is not a bf16 value", v, p)
			}
		}
		if (hi+mid)+lo != v || float64(hi)+float64(mid)+float64(lo) != float64(v) {
			t.Fatalf("%g: %g + %g + %g does not sum back", v, hi, mid, lo)
		}
	}
}
