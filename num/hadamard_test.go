package num

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestHadamardMatrix compares against the explicit Sylvester matrix in float64.
func TestHadamardMatrix(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for n := 1; n <= 256; n *= 2 {
		for trial := range 4 {
			x := make([]float32, n)
			for i := range x {
				x[i] = RoundBF16(float32(rng.NormFloat64()))
			}
			y := append([]float32(nil), x...)
			Hadamard(y)
			var norm float64
			for _, v := range x {
				norm += math.Abs(float64(v))
			}
			for j := range n {
				var want float64
				for i := range n {
					want += float64(x[i]) * hadamardEntry(i, j)
				}
				want /= math.Sqrt(float64(n))
				// fp32 butterflies: log2(n)+1 roundings, each bounded by the L1 norm.
				tol := (math.Log2(float64(n)) + 2) * norm * 0x1p-24
				if d := math.Abs(float64(y[j]) - want); d > tol {
					t.Fatalf("n=%d trial %d out[%d] = %v, want %v (diff %g > %g)", n, trial, j, y[j], want, d, tol)
				}
			}
		}
	}
}

// TestHadamardExactIntegers: small integer inputs make every butterfly exact, and
// for n = 4^k the scale is an exact power of two, so the result must match the
// float64 matrix product to the bit.
func TestHadamardExactIntegers(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	for _, n := range []int{1, 4, 16, 64, 256} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.IntN(201) - 100)
		}
		y := append([]float32(nil), x...)
		Hadamard(y)
		for j := range n {
			var want float64
			for i := range n {
				want += float64(x[i]) * hadamardEntry(i, j)
			}
			want /= math.Sqrt(float64(n))
			if float64(y[j]) != want {
				t.Fatalf("n=%d out[%d] = %v, want %v", n, j, y[j], want)
			}
		}
	}
}

// TestHadamardInvolution: (H/√n)² = I, checked on every unit vector.
func TestHadamardInvolution(t *testing.T) {
	for _, n := range []int{2, 8, 128} {
		for k := range n {
			x := make([]float32, n)
			x[k] = 1
			Hadamard(x)
			for j, v := range x {
				if want := hadamardEntry(k, j) / math.Sqrt(float64(n)); math.Abs(float64(v)-want) > 1e-7 {
					t.Fatalf("n=%d e_%d: H[%d] = %v, want %v", n, k, j, v, want)
				}
			}
			Hadamard(x)
			for j, v := range x {
				want := 0.0
				if j == k {
					want = 1
				}
				if math.Abs(float64(v)-want) > 1e-6 {
					t.Fatalf("n=%d: (H·H·e_%d)[%d] = %v, want %v", n, k, j, v, want)
				}
			}
		}
	}
}

// TestHadamardScale pins the fp32 scale constant for n = 128.
func TestHadamardScale(t *testing.T) {
	x := make([]float32, 128)
	x[0] = 1
	Hadamard(x)
	if want := float32(1 / math.Sqrt(128)); x[0] != want || x[127] != want {
		t.Errorf("scale %v / %v, want %v", x[0], x[127], want)
	}
	defer func() {
		if recover() == nil {
			t.Errorf("length 3 did not panic")
		}
	}()
	Hadamard(make([]float32, 3))
}
