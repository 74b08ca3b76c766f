package num

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestE2M1AllCodes(t *testing.T) {
	for c := range 16 {
		got := E2M1ToF32(uint8(c))
		want := e2m1Pos[c&7]
		if c&8 != 0 {
			want = -want
		}
		if float64(got) != want || math.Signbit(float64(got)) != (c&8 != 0) {
			t.Fatalf("code %d decodes to %v, want %v", c, got, want)
		}
		if E2M1ToF32(uint8(c)|0xf0) != got {
			t.Fatalf("high bits not ignored for code %d", c)
		}
		if back := F32ToE2M1(got); back != uint8(c) {
			t.Fatalf("encode(decode(%d)) = %d", c, back)
		}
	}
}

func TestF32ToE2M1Ties(t *testing.T) {
	cases := []struct {
		in   float32
		want float32
	}{
		{0.25, 0}, {0.75, 1}, {1.25, 1}, {1.75, 2}, {2.5, 2}, {3.5, 4}, {5, 4},
		{0.2500001, 0.5}, {0.7499999, 0.5}, {1.2500001, 1.5}, {1.7499999, 1.5},
		{2.5000002, 3}, {3.4999998, 3}, {5.0000005, 6},
		{6, 6}, {7, 6}, {1e30, 6}, {float32(math.Inf(1)), 6}, {1e-40, 0},
	}
	for _, c := range cases {
		for _, s := range []float32{1, -1} {
			got := E2M1ToF32(F32ToE2M1(s * c.in))
			if got != s*c.want || math.Signbit(float64(got)) != (s < 0) {
				t.Errorf("e2m1(%v) = %v, want %v", s*c.in, got, s*c.want)
			}
		}
	}
	if F32ToE2M1(float32(math.NaN())) != 0 {
		t.Errorf("NaN does not map to code 0")
	}
}

func TestF32ToE2M1Reference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var in []float32
	for i := range 8 * 4096 { // a fine uniform grid over [0, 8): includes every tie
		in = append(in, float32(i)/4096)
	}
	for range 50000 {
		in = append(in, float32(rng.Float64()*8), math.Float32frombits(rng.Uint32()))
	}
	for _, f := range in {
		for _, v := range []float32{f, -f} {
			if got, want := F32ToE2M1(v), refF32ToE2M1(v); got != want {
				t.Fatalf("F32ToE2M1(%v) = %d, want %d", v, got, want)
			}
		}
	}
	t.Logf("%d values checked", 2*len(in))
}

func TestPackFP4(t *testing.T) {
	if got := PackFP4([]uint8{1, 2, 3}); !slices.Equal(got, []byte{0x21, 0x03}) {
		t.Errorf("PackFP4(1,2,3) = % x, want 21 03 (element 2i in the low nibble)", got)
	}
	if got := PackFP4([]uint8{0xf, 0x8, 0x7, 0x0}); !slices.Equal(got, []byte{0x8f, 0x07}) {
		t.Errorf("PackFP4 = % x", got)
	}
	codes := make([]uint8, 4)
	UnpackFP4([]byte{0xa5, 0x3c}, codes)
	if !slices.Equal(codes, []uint8{5, 0xa, 0xc, 3}) {
		t.Errorf("UnpackFP4 = %v", codes)
	}
	rng := rand.New(rand.NewPCG(13, 14))
	for n := range 40 {
		src := make([]uint8, n)
		for i := range src {
			src[i] = uint8(rng.IntN(16))
		}
		p := PackFP4(src)
		if len(p) != (n+1)/2 {
			t.Fatalf("len %d packs to %d bytes", n, len(p))
		}
		dst := make([]uint8, n)
		UnpackFP4(p, dst)
		if !slices.Equal(src, dst) {
			t.Fatalf("round trip of %v gave %v", src, dst)
		}
	}
}
