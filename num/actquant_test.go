package num

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refActScaleExp is the reference scale: amax clamped to floor, multiplied by the
// fp32 constant inv with one fp32 rounding (the product of two float32 values is
// exact in float64), then the exact ceil(log2).
func refActScaleExp(x []float32, floor, inv float32) int {
	var amax float64
	for _, v := range x {
		amax = math.Max(amax, math.Abs(float64(v)))
	}
	amax = math.Max(amax, float64(floor))
	p := float32(amax * float64(inv))
	return refCeilLog2(float64(p))
}

type actCase struct {
	name string
	x    []float32
}

func actCases(block int) []actCase {
	rng := rand.New(rand.NewPCG(uint64(block), 99))
	gen := func(n int, f func(i int) float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = f(i)
		}
		return x
	}
	bf := func(v float64) float32 { return RoundBF16(float32(v)) }
	return []actCase{
		{"zeros", make([]float32, 3*block)},
		{"normal-bf16", gen(8*block, func(int) float32 { return bf(rng.NormFloat64()) })},
		{"normal-f32", gen(8*block, func(int) float32 { return float32(rng.NormFloat64() * 3) })},
		{"wide-range", gen(8*block, func(int) float32 { return bf(math.Ldexp(rng.NormFloat64(), rng.IntN(60)-30)) })},
		{"huge", gen(2*block, func(i int) float32 { return float32(3e38 * (rng.Float64()*2 - 1)) })},
		{"max-f32", gen(block, func(i int) float32 { return math.MaxFloat32 * float32(1-2*(i%2)) })},
		{"tiny", gen(2*block, func(int) float32 { return float32(1e-30 * rng.NormFloat64()) })},
		{"subnormal", gen(block, func(i int) float32 { return math.Float32frombits(uint32(i + 1)) })},
		{"one-outlier", gen(2*block, func(i int) float32 {
			if i == 5 {
				return 1000
			}
			return bf(rng.NormFloat64() * 1e-3)
		})},
		{"partial-block", gen(2*block+block/2+1, func(int) float32 { return bf(rng.NormFloat64()) })},
		{"exact-powers", gen(block, func(i int) float32 { return float32(math.Ldexp(448, i%5-2)) })},
		{"short", gen(3, func(i int) float32 { return float32(i) - 1 })},
	}
}

func TestQuantFP8Act(t *testing.T) {
	inv := float32(1.0 / 448)
	for _, block := range []int{128, 64, 32} {
		for _, c := range actCases(block) {
			nb := (len(c.x) + block - 1) / block
			codes := make([]uint8, len(c.x))
			exps := make([]int8, nb)
			QuantFP8Act(c.x, block, codes, exps)
			y := append([]float32(nil), c.x...)
			QuantFP8ActInPlace(y, block)
			for b := range nb {
				lo, hi := b*block, min(len(c.x), (b+1)*block)
				k := refActScaleExp(c.x[lo:hi], 1e-4, inv)
				if int(exps[b]) != k {
					t.Fatalf("block %d/%s/%d: scale exp %d, want %d", block, c.name, b, exps[b], k)
				}
				for i := lo; i < hi; i++ {
					q := float32(math.Ldexp(float64(c.x[i]), -k)) // exact x/s
					want := refF32ToE4M3(q)
					if codes[i] != want {
						t.Fatalf("block %d/%s[%d]=%v: code %#02x, want %#02x", block, c.name, i, c.x[i], codes[i], want)
					}
					wv := float64(float32(math.Ldexp(refE4M3Value(int(want)), k)))
					// float32(wv): the reference's q·s overflows to Inf exactly where this does.
					if float64(y[i]) != wv || y[i] != y[i] {
						t.Fatalf("block %d/%s[%d]: in place %v, want %v", block, c.name, i, y[i], wv)
					}
					if !IsBF16(y[i]) {
						t.Fatalf("block %d/%s[%d]: in-place value %v not bf16", block, c.name, i, y[i])
					}
					// Half a step: 1/16 relative for normals, 2^-10·s in the subnormal range.
					if d := math.Abs(float64(y[i]) - float64(c.x[i])); !math.IsInf(wv, 0) && d > math.Abs(float64(c.x[i]))/16+math.Ldexp(1, k-10) {
						t.Fatalf("block %d/%s[%d]: error %v too large", block, c.name, i, y[i]-c.x[i])
					}
				}
			}
		}
	}
}

func TestQuantFP4Act(t *testing.T) {
	inv := float32(1.0 / 6)
	floor := float32(math.Ldexp(6, -126))
	for _, block := range []int{32, 64, 128} {
		for _, c := range actCases(block) {
			nb := (len(c.x) + block - 1) / block
			codes := make([]uint8, len(c.x))
			exps := make([]int8, nb)
			QuantFP4Act(c.x, block, codes, exps)
			y := append([]float32(nil), c.x...)
			QuantFP4ActInPlace(y, block)
			for b := range nb {
				lo, hi := b*block, min(len(c.x), (b+1)*block)
				k := refActScaleExp(c.x[lo:hi], floor, inv)
				if int(exps[b]) != k {
					t.Fatalf("block %d/%s/%d: scale exp %d, want %d", block, c.name, b, exps[b], k)
				}
				for i := lo; i < hi; i++ {
					q := float32(math.Ldexp(float64(c.x[i]), -k))
					want := refF32ToE2M1(q)
					if codes[i] != want {
						t.Fatalf("block %d/%s[%d]=%v: code %d, want %d", block, c.name, i, c.x[i], codes[i], want)
					}
					wv := math.Ldexp(e2m1Pos[want&7], k)
					if want&8 != 0 {
						wv = -wv
					}
					if y[i] != float32(wv) || !IsBF16(y[i]) {
						t.Fatalf("block %d/%s[%d]: in place %v, want %v", block, c.name, i, y[i], wv)
					}
				}
			}
		}
	}
}

// TestActScaleExactForBF16 checks the spec's claim that for every bf16 amax the fp32
// product lands on the mathematically exact 2^ceil(log2(amax/448)) (and /6), over all
// positive finite bf16 values.
func TestActScaleExactForBF16(t *testing.T) {
	for c := uint16(1); c < 0x7f80; c++ {
		a := BF16(c).F32()
		if a >= 1e-4 {
			if got, want := FP8ActScaleExp(a), refPow2Ceil(float64(a), 448); got != want {
				t.Fatalf("FP8 amax %v: exp %d, exact %d", a, got, want)
			}
		}
		if float64(a) >= math.Ldexp(6, -126) {
			if got, want := FP4ActScaleExp(a), refPow2Ceil(float64(a), 6); got != want {
				t.Fatalf("FP4 amax %v: exp %d, exact %d", a, got, want)
			}
		}
	}
	if FP4ActScaleExp(0) != -126 {
		t.Errorf("FP4 floor exponent %d, want -126", FP4ActScaleExp(0))
	}
	if got, want := FP8ActScaleExp(0), refCeilLog2(float64(float32(float32(1e-4)*float32(1.0/448)))); got != want {
		t.Errorf("FP8 floor exponent %d, want %d", got, want)
	}
}

func TestActQuantZeroBlocks(t *testing.T) {
	for _, block := range []int{128, 64, 32} {
		x := make([]float32, 2*block)
		x[block+3] = 1 // second block non-zero
		y := append([]float32(nil), x...)
		QuantFP8ActInPlace(x, block)
		QuantFP4ActInPlace(y, block)
		for i := range x {
			want := float32(0)
			if i == block+3 {
				want = 1
			}
			if x[i] != want || y[i] != want {
				t.Fatalf("block %d element %d: fp8 %v fp4 %v, want %v", block, i, x[i], y[i], want)
			}
		}
	}
}

func TestActQuantNaN(t *testing.T) {
	x := []float32{1, float32(math.NaN()), 2, 3}
	QuantFP8ActInPlace(x, 4)
	if x[0] != 1 || x[2] != 2 || x[3] != 3 || x[1] == x[1] {
		t.Errorf("NaN handling: %v (NaN must stay local to its element)", x)
	}
}
