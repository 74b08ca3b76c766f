package num

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestE4M3AllCodes(t *testing.T) {
	for c := range 256 {
		got := E4M3ToF32(uint8(c))
		if c&0x7f == 0x7f {
			if got == got {
				t.Fatalf("code %#02x decodes to %v, want NaN", c, got)
			}
			if F32ToE4M3(got) != E4M3NaN {
				t.Fatalf("NaN does not encode to 0x7f")
			}
			continue
		}
		want := refE4M3Value(c)
		if float64(got) != want || math.Signbit(float64(got)) != (c&0x80 != 0) {
			t.Fatalf("code %#02x decodes to %v, want %v", c, got, want)
		}
		if E4M3Table[c] != got {
			t.Fatalf("table and function disagree at %#02x", c)
		}
		if back := F32ToE4M3(got); back != uint8(c) {
			t.Fatalf("encode(decode(%#02x)) = %#02x", c, back)
		}
		if !IsBF16(got) {
			t.Fatalf("e4m3 value %v is not bf16-exact", got)
		}
	}
	if E4M3ToF32(0x7e) != 448 || E4M3ToF32(0x01) != float32(math.Ldexp(1, -9)) || E4M3ToF32(0x08) != 1.0/64 {
		t.Errorf("landmark values wrong: max %v, min subnormal %v, min normal %v", E4M3ToF32(0x7e), E4M3ToF32(1), E4M3ToF32(8))
	}
}

func TestF32ToE4M3Cases(t *testing.T) {
	inf := float32(math.Inf(1))
	cases := []struct {
		in   float32
		want uint8
	}{
		{0, 0x00},
		{float32(math.Copysign(0, -1)), 0x80},
		{448, 0x7e},
		{449, 0x7e},
		{464, 0x7e}, // the non-saturating tie with "480" saturates here
		{1e30, 0x7e},
		{inf, 0x7e},
		{-inf, 0xfe},
		{-500, 0xfe},
		{float32(math.NaN()), 0x7f},
		{float32(-math.NaN()), 0x7f},
		{float32(math.Ldexp(1, -10)), 0x00}, // half the smallest subnormal: tie to 0
		{float32(math.Ldexp(1, -10)) * 1.0001, 0x01}, // just above the tie
		{float32(math.Ldexp(3, -10)), 0x02},          // tie between 1 and 2 units: even 2
		{float32(math.Ldexp(5, -10)), 0x02},          // tie between 2 and 3 units: even 2
		{float32(math.Ldexp(15, -10)), 0x08},         // tie between 7 units and the smallest normal
		{1.0625, 0x38},                               // tie between 1 and 1.125
		{1.1875, 0x3a},                               // tie between 1.125 and 1.25
		{float32(math.Ldexp(1, -30)), 0x00},
		{math.Float32frombits(1), 0x00}, // float32 subnormal input
		{-3.3, 0xc5},
		{240, 0x77},
		{248, 0x78}, // tie between 240 (0x77, odd) and 256 (0x78)
	}
	for _, c := range cases {
		if got := F32ToE4M3(c.in); got != c.want {
			t.Errorf("F32ToE4M3(%v) = %#02x, want %#02x", c.in, got, c.want)
		}
	}
}

// TestF32ToE4M3Reference compares against the float64 nearest-value reference on all
// midpoints (±1 ulp) and on random values across the whole range.
func TestF32ToE4M3Reference(t *testing.T) {
	grid := e4m3PosGrid()
	var in []float32
	for c := 0; c+1 < len(grid); c++ {
		mid := float32((grid[c] + grid[c+1]) / 2) // exact: one more bit than e4m3
		in = append(in, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000))
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 100000 {
		in = append(in, float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(30)-20)))
		in = append(in, math.Float32frombits(rng.Uint32()))
	}
	for _, f := range in {
		for _, v := range []float32{f, -f} {
			if got, want := F32ToE4M3(v), refF32ToE4M3(v); got != want {
				t.Fatalf("F32ToE4M3(%v) = %#02x, want %#02x", v, got, want)
			}
		}
	}
	t.Logf("%d values checked", 2*len(in))
}

func TestE8M0(t *testing.T) {
	for b := range 256 {
		got := E8M0ToF32(uint8(b))
		if b == 0xff {
			if got == got {
				t.Fatalf("0xff decodes to %v, want NaN", got)
			}
			continue
		}
		if want := math.Pow(2, float64(b-127)); float64(got) != want {
			t.Fatalf("E8M0ToF32(%#02x) = %v, want %v", b, got, want)
		}
		if E8M0Exp(uint8(b)) != b-127 || E8M0FromExp(b-127) != uint8(b) {
			t.Fatalf("exponent mapping broken at %#02x", b)
		}
		if Pow2F32(b-127) != got {
			t.Fatalf("Pow2F32(%d) = %v", b-127, Pow2F32(b-127))
		}
	}
	for _, c := range []struct{ e, want int }{{-128, 0}, {-1000, 0}, {128, 254}, {1000, 254}, {0, 127}} {
		if got := E8M0FromExp(c.e); int(got) != c.want {
			t.Errorf("E8M0FromExp(%d) = %#02x, want %#02x", c.e, got, c.want)
		}
	}
}

func TestCeilLog2(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	n := 0
	for e := 1; e < 255; e++ {
		mans := []uint32{0, 1, 2, 0x400000, 0x7ffffe, 0x7fffff}
		for range 20 {
			mans = append(mans, rng.Uint32()&0x7fffff)
		}
		for _, m := range mans {
			x := math.Float32frombits(uint32(e)<<23 | m)
			if got, want := CeilLog2(x), refCeilLog2(float64(x)); got != want {
				t.Fatalf("CeilLog2(%v) = %d, want %d", x, got, want)
			}
			n++
		}
	}
	// The bit arithmetic outside the normal range (documented behaviour).
	if CeilLog2(0) != -127 || CeilLog2(math.Float32frombits(1)) != -126 || CeilLog2(float32(math.Inf(1))) != 128 {
		t.Errorf("edge values: %d %d %d", CeilLog2(0), CeilLog2(math.Float32frombits(1)), CeilLog2(float32(math.Inf(1))))
	}
	t.Logf("%d values checked", n)
}
