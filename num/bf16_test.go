package num

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestBF16AllCodesRoundTrip(t *testing.T) {
	for c := range 1 << 16 {
		b := BF16(c)
		f := b.F32()
		if got := math.Float32bits(f); got != uint32(c)<<16 {
			t.Fatalf("code %#04x widens to %#08x", c, got)
		}
		back := BF16FromF32(f)
		if f != f {
			if r := back.F32(); r == r {
				t.Fatalf("NaN code %#04x re-rounds to non-NaN %#04x", c, back)
			}
			if back&0x0040 == 0 {
				t.Fatalf("NaN code %#04x re-rounds to a signalling NaN %#04x", c, back)
			}
			continue
		}
		if back != b {
			t.Fatalf("code %#04x round trip gives %#04x", c, back)
		}
		if RoundBF16(f) != f && f == f {
			t.Fatalf("RoundBF16 changes bf16 value %v", f)
		}
		if !IsBF16(f) {
			t.Fatalf("IsBF16(%v) = false", f)
		}
	}
}

// TestBF16RNE checks rounding against the float64 nearest-neighbour reference for
// every upper half and a set of low halves that includes the tie and its neighbours.
func TestBF16RNE(t *testing.T) {
	lows := []uint32{0x0001, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 4 {
		lows = append(lows, rng.Uint32()&0xffff)
	}
	n := 0
	for hi := range uint32(1 << 16) {
		for _, lo := range lows {
			f := math.Float32frombits(hi<<16 | lo)
			got := BF16FromF32(f)
			if f != f {
				if g := got.F32(); g == g {
					t.Fatalf("NaN %#08x rounds to non-NaN %#04x", hi<<16|lo, got)
				}
				continue
			}
			if want := refBF16(f); uint16(got) != want {
				t.Fatalf("BF16FromF32(%#08x) = %#04x, want %#04x", hi<<16|lo, got, want)
			}
			n++
		}
	}
	t.Logf("%d values checked", n)
}

func TestBF16Specials(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{float32(math.Inf(1)), 0x7f80},
		{float32(math.Inf(-1)), 0xff80},
		{math.MaxFloat32, 0x7f80},                  // above bf16 max + half ulp
		{math.Float32frombits(0x7f7f7fff), 0x7f7f}, // just below the overflow tie
		{math.Float32frombits(0x7f7f8000), 0x7f80}, // the tie rounds to even (Inf)
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, lower even
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, upper even
		{math.Float32frombits(0x00000001), 0x0000}, // smallest subnormal
		{math.Float32frombits(0x00008000), 0x0000}, // tie to even zero
		{math.Float32frombits(0x00018000), 0x0002},
		{math.Float32frombits(0x80000000), 0x8000},
	}
	for _, c := range cases {
		if got := BF16FromF32(c.in); uint16(got) != c.want {
			t.Errorf("BF16FromF32(%#08x) = %#04x, want %#04x", math.Float32bits(c.in), got, c.want)
		}
	}
	// A signalling NaN whose payload lives only in the low half must stay NaN.
	if g := BF16FromF32(math.Float32frombits(0x7f800001)).F32(); g == g {
		t.Errorf("signalling NaN became %v", g)
	}
}

func TestRoundBF16Slice(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 1000)
	want := make([]float32, len(x))
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 100)
		want[i] = math.Float32frombits(uint32(refBF16(x[i])) << 16)
	}
	RoundBF16Slice(x)
	for i := range x {
		if x[i] != want[i] {
			t.Fatalf("element %d: %v, want %v", i, x[i], want[i])
		}
	}
}

func TestBF16EncodeDecode(t *testing.T) {
	src := []float32{1, -2.5, 3.140625, 0, float32(math.Inf(1))}
	buf := make([]byte, 2*len(src))
	EncodeBF16(src, buf)
	if buf[0] != 0x80 || buf[1] != 0x3f {
		t.Fatalf("little-endian layout: % x", buf[:2])
	}
	out := make([]float32, len(src))
	DecodeBF16(buf, out)
	for i := range src {
		if out[i] != src[i] {
			t.Errorf("element %d: %v, want %v", i, out[i], src[i])
		}
	}
	f32 := make([]byte, 4*len(src))
	EncodeF32(src, f32)
	DecodeF32(f32, out)
	for i := range src {
		if out[i] != src[i] {
			t.Errorf("F32 element %d: %v, want %v", i, out[i], src[i])
		}
	}
	DecodeBF16(nil, nil) // empty slices are fine
}

func TestF16AllCodes(t *testing.T) {
	for c := range 1 << 16 {
		h := uint16(c)
		got := F16ToF32(h)
		sign := 1.0
		if h&0x8000 != 0 {
			sign = -1
		}
		e, m := int(h>>10)&31, float64(h&0x3ff)
		var want float64
		switch {
		case e == 31 && m == 0:
			want = sign * math.Inf(1)
		case e == 31:
			if got == got {
				t.Fatalf("F16 NaN %#04x decodes to %v", h, got)
			}
			if back := F32ToF16(got); back != h|0x0200 {
				t.Fatalf("F16 NaN %#04x re-encodes to %#04x", h, back)
			}
			continue
		case e == 0:
			want = sign * m * math.Pow(2, -24)
		default:
			want = sign * (1 + m/1024) * math.Pow(2, float64(e-15))
		}
		if float64(got) != want || math.Signbit(float64(got)) != (sign < 0) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := F32ToF16(got); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
	}
	buf := []byte{0x00, 0x3c, 0x00, 0xc0}
	out := make([]float32, 2)
	DecodeF16(buf, out)
	if out[0] != 1 || out[1] != -2 {
		t.Errorf("DecodeF16 = %v", out)
	}
}

// TestF32ToF16RNE checks half rounding against a float64 nearest search over the
// neighbouring half values.
func TestF32ToF16RNE(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	half := func(h uint16) float64 {
		if h&0x7fff == 0x7c00 {
			return math.Ldexp(1, 16) // Inf acts as 2^16 when rounding
		}
		return math.Abs(float64(F16ToF32(h)))
	}
	for i := range 200000 {
		var f float32
		if i%2 == 0 {
			f = math.Float32frombits(rng.Uint32())
		} else { // concentrate on the half range
			f = float32(math.Ldexp(rng.Float64()+0.5, rng.IntN(46)-30))
		}
		if f != f {
			continue
		}
		got := F32ToF16(f)
		a := math.Abs(float64(f))
		if a >= 65520 {
			if got&0x7fff != 0x7c00 {
				t.Fatalf("F32ToF16(%v) = %#04x, want Inf", f, got)
			}
			continue
		}
		// Best of all candidates: got and its neighbours must not be nearer.
		g := half(got & 0x7fff)
		for _, nb := range []uint16{got&0x7fff - 1, got&0x7fff + 1} {
			if nb > 0x7c00 {
				continue
			}
			d, dg := math.Abs(half(nb)-a), math.Abs(g-a)
			if d < dg || (d == dg && got&1 == 1) {
				t.Fatalf("F32ToF16(%v) = %#04x (%v), neighbour %#04x is better", f, got, g, nb)
			}
		}
	}
}
