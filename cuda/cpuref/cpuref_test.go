package cpuref

import (
	"math"
	"math/rand/v2"
	"testing"
)

// slowE4M3 rounds by exhaustive search over the finite codes (ties to the even code).
func slowE4M3(x float32) byte {
	var s byte
	if math.Signbit(float64(x)) {
		s = 0x80
	}
	a := math.Abs(float64(x))
	best, bestErr := byte(0), math.Inf(1)
	for c := byte(0); c < 0x7f; c++ {
		d := math.Abs(float64(E4M3ToF32(c)) - a)
		if d < bestErr || (d == bestErr && c&1 == 0) {
			best, bestErr = c, d
		}
	}
	return s | best
}

func TestE4M3Known(t *testing.T) {
	for _, tc := range []struct {
		b byte
		v float32
	}{{0x00, 0}, {0x01, 1.0 / 512}, {0x08, 1.0 / 64}, {0x38, 1}, {0x7e, 448}, {0xfe, -448}, {0x3c, 1.5}} {
		if got := E4M3ToF32(tc.b); got != tc.v {
			t.Errorf("E4M3ToF32(%#x) = %v, want %v", tc.b, got, tc.v)
		}
		if got := F32ToE4M3(tc.v); got != tc.b {
			t.Errorf("F32ToE4M3(%v) = %#x, want %#x", tc.v, got, tc.b)
		}
	}
	if !math.IsNaN(float64(E4M3ToF32(0x7f))) {
		t.Error("0x7f must be NaN")
	}
}

func TestF32ToE4M3MatchesExhaustive(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	// Every midpoint between adjacent codes (ties) and random values.
	var xs []float32
	for c := byte(0); c < 0x7e; c++ {
		lo, hi := E4M3ToF32(c), E4M3ToF32(c+1)
		xs = append(xs, lo, (lo+hi)/2, -(lo+hi)/2, math.Nextafter32((lo+hi)/2, 0))
	}
	for i := 0; i < 20000; i++ {
		xs = append(xs, float32(math.Ldexp(r.Float64()*2-1, r.IntN(20)-12)))
	}
	for _, x := range xs {
		if got, want := F32ToE4M3(x), slowE4M3(x); got != want {
			t.Fatalf("F32ToE4M3(%g) = %#x, want %#x", x, got, want)
		}
	}
}

func TestBF16RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		f float32
		h uint16
	}{{1, 0x3f80}, {-2, 0xc000}, {1.00390625, 0x3f80}, {1.01171875, 0x3f82}} {
		if got := F32ToBF16(tc.f); got != tc.h {
			t.Errorf("F32ToBF16(%v) = %#x, want %#x", tc.f, got, tc.h)
		}
	}
	if !math.IsNaN(float64(BF16ToF32(F32ToBF16(float32(math.NaN()))))) {
		t.Error("NaN must stay NaN")
	}
}

func TestQuantFP8Act(t *testing.T) {
	tests := []struct {
		name  string
		fill  func(i int) float32
		scale byte
	}{
		{"zeros", func(int) float32 { return 0 }, byte(-22 + 127)}, // amax 1e-4 -> 2^ceil(log2(1e-4/448)) = 2^-22
		{"448", func(i int) float32 { return 448 }, 127},           // exactly 448·2^0
		{"450", func(i int) float32 { return 450 }, 128},           // just above (bf16-exact): scale 2
		{"huge", func(i int) float32 { return 3e38 }, byte(120 + 127)},
	}
	for _, tc := range tests {
		x := make([]uint16, 128)
		for i := range x {
			x[i] = F32ToBF16(tc.fill(i))
		}
		q := make([]byte, 128)
		s := make([]byte, 1)
		QuantFP8Act(q, s, x, 1, 128)
		if s[0] != tc.scale {
			t.Errorf("%s: scale byte %d, want %d", tc.name, s[0], tc.scale)
		}
		for i := range q {
			v := float64(E4M3ToF32(q[i])) * float64(E8M0ToF32(s[0]))
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s: non-finite dequant at %d", tc.name, i)
			}
		}
	}
}

func TestE2M1(t *testing.T) {
	want := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	for q, w := range want {
		if got := E2M1ToF32(byte(q)); got != w {
			t.Errorf("E2M1ToF32(%d) = %v, want %v", q, got, w)
		}
	}
}
