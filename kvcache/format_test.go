package kvcache_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/num"
)

// randValues fills x with values of mixed magnitudes, block by block: signed
// zeros, fp32 subnormals, the fp32 extremes, values on the e4m3/e2m1 scale
// boundaries and random normals around a random block exponent.
func randValues(rng *rand.Rand, x []float32, block int, specials bool) {
	for lo := 0; lo < len(x); lo += block {
		e := rng.IntN(250) - 135
		if rng.IntN(4) == 0 {
			e = rng.IntN(40) - 30 // the range real activations live in
		}
		for i := lo; i < min(lo+block, len(x)); i++ {
			var v float32
			switch k := rng.IntN(20); {
			case k == 0:
				v = 0
			case k == 1 && specials:
				v = math.Float32frombits(rng.Uint32() & 0x7fffff) // subnormal
			case k == 2 && specials:
				v = []float32{math.SmallestNonzeroFloat32, 0x1p-126, 448, 6, 1e-4}[rng.IntN(5)]
			case k == 3:
				v = float32(math.Ldexp(448, e)) // amax exactly on a scale boundary
			default:
				v = float32(math.Ldexp(1+rng.Float64(), e+rng.IntN(12)-10))
			}
			if rng.IntN(2) == 0 {
				v = -v
			}
			x[i] = v
		}
		if specials && rng.IntN(16) == 0 {
			x[lo+rng.IntN(min(block, len(x)-lo))] = math.MaxFloat32 // the simulation overflows to Inf
		}
	}
}

func sameBits(a, b float32) bool {
	if a != a && b != b {
		return true
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

func finite(x []float32) bool {
	for _, v := range x {
		if math.IsInf(float64(v), 0) || v != v {
			return false
		}
	}
	return true
}

func diffAt(a, b []float32) int {
	for i := range a {
		if !sameBits(a[i], b[i]) {
			return i
		}
	}
	return -1
}

func cpuBackend(n backend.Numerics) *cpu.Backend {
	b := cpu.New(cpu.Options{Threads: 1})
	b.SetNumerics(n)
	return b
}

// kvQuant is the faithful reference of a stored entry: the CPU backend's FP8
// simulation of the nope dims, the rope dims rounded to bf16 (as RoPE leaves them).
func kvQuant(t *testing.T, f kvcache.EntryFormat, x []float32) []float32 {
	t.Helper()
	y := append([]float32(nil), x...)
	if err := cpuBackend(backend.Faithful).KVQuant(cpu.NewTensor(1, len(y), y), f.Nope, kvcache.EntryScaleBlock); err != nil {
		t.Fatal(err)
	}
	num.RoundBF16Slice(y[f.Nope:])
	return y
}

func roundTripEntry(t *testing.T, f kvcache.EntryFormat, x []float32) []float32 {
	t.Helper()
	buf := make([]byte, f.Bytes())
	if err := f.Encode(buf, x); err != nil {
		t.Fatal(err)
	}
	for _, b := range buf[f.ScaleOffset()+f.Scales():] {
		if b != 0 {
			t.Fatalf("padding byte %#x", b)
		}
	}
	got := make([]float32, f.Dim())
	if err := f.Decode(got, buf); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestEntryMatchesSimulation(t *testing.T) {
	cases := []struct {
		name          string
		head, rope    int
		bf16, special bool
	}{
		{"flash bf16 inputs", 512, 64, true, false},
		{"flash fp32 inputs with specials", 512, 64, false, true},
		{"small", 128, 64, false, true},
		{"partial last block", 64 + 100, 64, false, true},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := kvcache.NewEntryFormat(c.head, c.rope)
			if err != nil {
				t.Fatal(err)
			}
			x := make([]float32, f.Dim())
			for range 300 {
				randValues(rng, x, kvcache.EntryScaleBlock, c.special)
				if c.bf16 {
					num.RoundBF16Slice(x)
				}
				want := kvQuant(t, f, x)
				if i := diffAt(roundTripEntry(t, f, x), want); i >= 0 {
					t.Fatalf("encode of %v at %d differs from the simulation %v", x[i], i, want[i])
				}
				// Values the simulation has rounded are stored exactly (unless it
				// overflowed to Inf, which it cannot take back as input either).
				if got := roundTripEntry(t, f, want); finite(want) && diffAt(got, want) >= 0 {
					i := diffAt(got, want)
					t.Fatalf("round trip of %v at %d gives %v", want[i], i, got[i])
				}
			}
		})
	}
}

func TestEntryNonFinite(t *testing.T) {
	f, err := kvcache.NewEntryFormat(512, 64)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		at   int
		v    float32
	}{
		{"nan", 3, float32(math.NaN())},
		{"+inf", 64, float32(math.Inf(1))},
		{"-inf in the last block", 447, float32(math.Inf(-1))},
		{"nan in rope", 500, float32(math.NaN())},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := make([]float32, f.Dim())
			randValues(rng, x, kvcache.EntryScaleBlock, false)
			x[c.at] = c.v
			got, want := roundTripEntry(t, f, x), kvQuant(t, f, x)
			if i := diffAt(got, want); i >= 0 {
				t.Fatalf("at %d: %v, simulation %v", i, got[i], want[i])
			}
			nans := 0
			for _, v := range got {
				if v != v {
					nans++
				}
			}
			if want := map[bool]int{true: 1, false: kvcache.EntryScaleBlock}[c.at >= f.Nope]; nans != want {
				t.Errorf("%d NaNs, want %d", nans, want)
			}
		})
	}
}

// TestIndexKeyMatchesSimulation checks the FP4 codec against the simulation
// (num's fp4_act_quant on arbitrary finite inputs) and against the CPU
// backend's whole index-key path (Hadamard, bf16, FP4).
func TestIndexKeyMatchesSimulation(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dim := range []int{128, 64, 48} {
		f, err := kvcache.NewIndexKeyFormat(dim)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, dim)
		for range 300 {
			randValues(rng, x, kvcache.IndexScaleBlock, true)
			want := append([]float32(nil), x...)
			num.QuantFP4ActInPlace(want, kvcache.IndexScaleBlock)
			got := roundTripIndex(t, f, x)
			if i := diffAt(got, want); i >= 0 {
				t.Fatalf("dim %d: encode of %v at %d gives %v, simulation %v", dim, x[i], i, got[i], want[i])
			}
			if got := roundTripIndex(t, f, want); finite(want) && diffAt(got, want) >= 0 {
				i := diffAt(got, want)
				t.Fatalf("dim %d: round trip of %v at %d gives %v", dim, want[i], i, got[i])
			}
		}
	}
	t.Run("cpu hadamard path", func(t *testing.T) {
		const dim, heads = 128, 8
		f, err := kvcache.NewIndexKeyFormat(dim)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, dim*heads)
		for range 50 {
			randValues(rng, x, dim, false)
			num.RoundBF16Slice(x)
			rot := append([]float32(nil), x...)
			sim := append([]float32(nil), x...)
			if err := cpuBackend(backend.Exact).HadamardFP4(cpu.NewTensor(1, len(rot), rot), dim); err != nil {
				t.Fatal(err)
			}
			if err := cpuBackend(backend.Faithful).HadamardFP4(cpu.NewTensor(1, len(sim), sim), dim); err != nil {
				t.Fatal(err)
			}
			num.RoundBF16Slice(rot) // the faithful path rounds the rotation to bf16 before FP4
			for h := range heads {
				want := sim[h*dim : (h+1)*dim]
				if i := diffAt(roundTripIndex(t, f, rot[h*dim:(h+1)*dim]), want); i >= 0 {
					t.Fatalf("head %d: encode differs from the backend at %d", h, i)
				}
				if i := diffAt(roundTripIndex(t, f, want), want); i >= 0 {
					t.Fatalf("head %d: round trip differs at %d", h, i)
				}
			}
		}
	})
	t.Run("non-finite block", func(t *testing.T) {
		f, _ := kvcache.NewIndexKeyFormat(128)
		x := make([]float32, 128)
		randValues(rng, x, kvcache.IndexScaleBlock, false)
		x[40] = float32(math.Inf(1))
		got := roundTripIndex(t, f, x)
		for i, v := range got {
			if nan := v != v; nan != (i >= 32 && i < 64) {
				t.Fatalf("value %d is %v", i, v)
			}
		}
	})
}

func roundTripIndex(t *testing.T, f kvcache.IndexKeyFormat, x []float32) []float32 {
	t.Helper()
	buf := make([]byte, f.Bytes())
	if err := f.Encode(buf, x); err != nil {
		t.Fatal(err)
	}
	for _, b := range buf[f.ScaleOffset()+f.Scales():] {
		if b != 0 {
			t.Fatalf("padding byte %#x", b)
		}
	}
	got := make([]float32, f.Dim)
	if err := f.Decode(got, buf); err != nil {
		t.Fatal(err)
	}
	return got
}

func TestFormatGeometry(t *testing.T) {
	cases := []struct {
		name                          string
		head, rope, index             int
		entry, ropeOff, scaleOff, key int
	}{
		{"flash/pro", 512, 64, 128, 584, 448, 576, 68},
		{"small", 128, 64, 64, 200, 64, 192, 36},
	}
	for _, c := range cases {
		e, err := kvcache.NewEntryFormat(c.head, c.rope)
		if err != nil {
			t.Fatal(err)
		}
		k, err := kvcache.NewIndexKeyFormat(c.index)
		if err != nil {
			t.Fatal(err)
		}
		if e.Bytes() != c.entry || e.RopeOffset() != c.ropeOff || e.ScaleOffset() != c.scaleOff || k.Bytes() != c.key {
			t.Errorf("%s: entry %d bytes (rope at %d, scales at %d), key %d bytes; want %d (%d, %d), %d",
				c.name, e.Bytes(), e.RopeOffset(), e.ScaleOffset(), k.Bytes(), c.entry, c.ropeOff, c.scaleOff, c.key)
		}
	}
	// A known entry: nope block 0 = 1.5 (scale 2^-8, code 0x7c = 384·2^-8), rope 1.
	e, _ := kvcache.NewEntryFormat(512, 64)
	x := make([]float32, 512)
	x[0] = 1.5
	x[448] = 1
	buf := make([]byte, e.Bytes())
	if err := e.Encode(buf, x); err != nil {
		t.Fatal(err)
	}
	if buf[0] != 0x7c || buf[448] != 0x80 || buf[449] != 0x3f || buf[576] != 127-8 {
		t.Errorf("bytes 0, 448, 449, 576: %#x %#x %#x %d", buf[0], buf[448], buf[449], buf[576])
	}
	bad := []error{
		e.Encode(make([]byte, 583), x),
		e.Encode(buf, x[:511]),
		e.Decode(make([]float32, 512), buf[:580]),
	}
	if _, err := kvcache.NewEntryFormat(64, 64); err == nil {
		bad = append(bad, nil)
	}
	if _, err := kvcache.NewIndexKeyFormat(0); err == nil {
		bad = append(bad, nil)
	}
	for i, err := range bad {
		if err == nil {
			t.Errorf("bad call %d accepted", i)
		}
	}
}
