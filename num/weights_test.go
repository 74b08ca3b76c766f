package num

import (
	"math"
	"math/rand/v2"
	"testing"
)

var weightShapes = [][2]int{{1, 2}, {3, 32}, {128, 128}, {130, 260}, {7, 50}, {256, 96}}

func randFinite(rng *rand.Rand, n int, scale float64) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * scale)
	}
	return w
}

func TestDequantFP8Block(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, sh := range weightShapes {
		rows, cols := sh[0], sh[1]
		w := make([]byte, rows*cols)
		for i := range w {
			w[i] = uint8(rng.IntN(256))
			if w[i]&0x7f == 0x7f {
				w[i] = 0x42
			}
		}
		sr, sc := (rows+127)/128, (cols+127)/128
		scale := make([]byte, sr*sc)
		for i := range scale {
			scale[i] = uint8(100 + rng.IntN(50))
		}
		out := make([]float32, rows*cols)
		DequantFP8Block(w, scale, rows, cols, out)
		for r := range rows {
			for c := range cols {
				want := refE4M3Value(int(w[r*cols+c])) * math.Pow(2, float64(int(scale[(r/128)*sc+c/128])-127))
				if float64(out[r*cols+c]) != want {
					t.Fatalf("%v [%d,%d]: %v, want %v", sh, r, c, out[r*cols+c], want)
				}
			}
		}
		// Round trip: quantising the dequantised tensor reproduces it exactly.
		codes, sc2 := QuantFP8Block(out, rows, cols)
		out2 := make([]float32, rows*cols)
		DequantFP8Block(codes, sc2, rows, cols, out2)
		for i := range out {
			if out[i] != out2[i] {
				t.Fatalf("%v: round trip element %d: %v -> %v", sh, i, out[i], out2[i])
			}
		}
	}
}

func TestQuantFP8Block(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, sh := range weightShapes {
		rows, cols := sh[0], sh[1]
		w := randFinite(rng, rows*cols, 0.02)
		if rows >= 128 { // an all-zero block
			for r := range 128 {
				for c := range min(cols, 128) {
					w[r*cols+c] = 0
				}
			}
		}
		codes, scale := QuantFP8Block(w, rows, cols)
		sc := (cols + 127) / 128
		for br := 0; br*128 < rows; br++ {
			for bc := 0; bc*128 < cols; bc++ {
				var amax float64
				for r := br * 128; r < min(rows, br*128+128); r++ {
					for c := bc * 128; c < min(cols, bc*128+128); c++ {
						amax = math.Max(amax, math.Abs(float64(w[r*cols+c])))
					}
				}
				k := -127
				if amax > 0 {
					k = max(-127, refPow2Ceil(amax, 448))
				}
				if got := int(scale[br*sc+bc]) - 127; got != k {
					t.Fatalf("%v block (%d,%d): scale exp %d, want %d", sh, br, bc, got, k)
				}
				for r := br * 128; r < min(rows, br*128+128); r++ {
					for c := bc * 128; c < min(cols, bc*128+128); c++ {
						want := refF32ToE4M3(float32(math.Ldexp(float64(w[r*cols+c]), -k)))
						if codes[r*cols+c] != want {
							t.Fatalf("%v [%d,%d]: code %#02x, want %#02x", sh, r, c, codes[r*cols+c], want)
						}
					}
				}
			}
		}
	}
}

func randMXFP4(rng *rand.Rand, rows, cols int) (packed, scale []byte) {
	codes := make([]uint8, rows*cols)
	for i := range codes {
		codes[i] = uint8(rng.IntN(16))
	}
	packed = PackFP4(codes)
	scale = make([]byte, rows*((cols+31)/32))
	for i := range scale {
		scale[i] = uint8(110 + rng.IntN(30))
	}
	return packed, scale
}

func TestDequantMXFP4RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(25, 26))
	for _, sh := range weightShapes {
		rows, cols := sh[0], sh[1]
		packed, scale := randMXFP4(rng, rows, cols)
		out := make([]float32, rows*cols)
		DequantMXFP4(packed, scale, rows, cols, out)
		codes := make([]uint8, rows*cols)
		UnpackFP4(packed, codes)
		sc := (cols + 31) / 32
		for r := range rows {
			for c := range cols {
				v := e2m1Pos[codes[r*cols+c]&7] * math.Pow(2, float64(int(scale[r*sc+c/32])-127))
				if codes[r*cols+c]&8 != 0 {
					v = -v
				}
				if float64(out[r*cols+c]) != v {
					t.Fatalf("%v [%d,%d]: %v, want %v", sh, r, c, out[r*cols+c], v)
				}
			}
		}
		p2, s2 := QuantMXFP4(out, rows, cols)
		out2 := make([]float32, rows*cols)
		DequantMXFP4(p2, s2, rows, cols, out2)
		for i := range out {
			if out[i] != out2[i] {
				t.Fatalf("%v: round trip element %d: %v -> %v", sh, i, out[i], out2[i])
			}
		}
	}
}

func TestQuantMXFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 28))
	for _, sh := range weightShapes {
		rows, cols := sh[0], sh[1]
		w := randFinite(rng, rows*cols, 0.05)
		for c := range min(cols, 32) { // all-zero first block
			w[c] = 0
		}
		packed, scale := QuantMXFP4(w, rows, cols)
		codes := make([]uint8, rows*cols)
		UnpackFP4(packed, codes)
		sc := (cols + 31) / 32
		for r := range rows {
			for b := range sc {
				var amax float64
				for c := b * 32; c < min(cols, b*32+32); c++ {
					amax = math.Max(amax, math.Abs(float64(w[r*cols+c])))
				}
				k := -127
				if amax > 0 {
					k = max(-127, refPow2Ceil(amax, 6))
				}
				if got := int(scale[r*sc+b]) - 127; got != k {
					t.Fatalf("%v row %d block %d: exp %d, want %d", sh, r, b, got, k)
				}
				for c := b * 32; c < min(cols, b*32+32); c++ {
					want := refF32ToE2M1(float32(math.Ldexp(float64(w[r*cols+c]), -k)))
					if codes[r*cols+c] != want {
						t.Fatalf("%v [%d,%d]=%v: code %d, want %d", sh, r, c, w[r*cols+c], codes[r*cols+c], want)
					}
				}
			}
		}
	}
}

// checkNVFP4 verifies codes, scales and dequantised values of an NVFP4 encoding of
// w with the given global scale against the float64 ModelOpt reference.
func checkNVFP4(t *testing.T, w []float32, rows, cols int, packed, scale []byte, global float32) []float32 {
	t.Helper()
	codes := make([]uint8, rows*cols)
	UnpackFP4(packed, codes)
	sc := (cols + 15) / 16
	out := make([]float32, rows*cols)
	DequantNVFP4(packed, scale, global, rows, cols, out)
	for r := range rows {
		for b := range sc {
			var bmax float64
			for c := b * 16; c < min(cols, b*16+16); c++ {
				bmax = math.Max(bmax, math.Abs(float64(w[r*cols+c])))
			}
			bs := float32(float32(bmax) / float32(6*global))
			if bs == 0 {
				bs = 1
			}
			if want := refF32ToE4M3(bs); scale[r*sc+b] != want {
				t.Fatalf("[%d,%d] row %d block %d: scale %#02x, want %#02x", rows, cols, r, b, scale[r*sc+b], want)
			}
			d := float32(refE4M3Value(int(scale[r*sc+b]))) * global
			for c := b * 16; c < min(cols, b*16+16); c++ {
				i := r*cols + c
				if want := refF32ToE2M1(w[i] / d); codes[i] != want {
					t.Fatalf("[%d,%d] element [%d,%d]: code %d, want %d", rows, cols, r, c, codes[i], want)
				}
				v := e2m1Pos[codes[i]&7]
				if codes[i]&8 != 0 {
					v = -v
				}
				if want := float32(v * refE4M3Value(int(scale[r*sc+b])) * float64(global)); out[i] != want {
					t.Fatalf("[%d,%d] element [%d,%d]: dequant %v, want %v", rows, cols, r, c, out[i], want)
				}
			}
		}
	}
	return out
}

func TestNVFP4(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 30))
	for _, sh := range weightShapes {
		rows, cols := sh[0], sh[1]
		w := randFinite(rng, rows*cols, 0.05)
		for c := range min(cols, 16) {
			w[c] = 0
		}
		w[len(w)-1] = 0.3
		packed, scale, global := QuantNVFP4(w, rows, cols)
		var amax float64
		for _, v := range w {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		if want := float32(float32(amax) / 2688); global != want {
			t.Fatalf("%v: global %v, want %v", sh, global, want)
		}
		out := checkNVFP4(t, w, rows, cols, packed, scale, global)
		// Quantising the dequantised tensor with the same global reproduces it. The
		// recomputed ModelOpt global fl(fl(2688·g)/2688) equals g for most but not
		// all g; where it does, QuantNVFP4 itself reproduces the tensor too.
		p2, s2 := QuantNVFP4WithGlobal(out, rows, cols, global)
		out2 := make([]float32, rows*cols)
		DequantNVFP4(p2, s2, global, rows, cols, out2)
		for i := range out {
			if out[i] != out2[i] {
				t.Fatalf("%v: round trip element %d: %v -> %v", sh, i, out[i], out2[i])
			}
		}
		if p3, s3, g3 := QuantNVFP4(out, rows, cols); g3 == global {
			DequantNVFP4(p3, s3, g3, rows, cols, out2)
			for i := range out {
				if out[i] != out2[i] {
					t.Fatalf("%v: QuantNVFP4 round trip element %d: %v -> %v", sh, i, out[i], out2[i])
				}
			}
		}
		// Caller-chosen global scales follow the same rules.
		for _, g := range []float32{global * 2, Pow2F32(-12), 1e-3} {
			p3, s3 := QuantNVFP4WithGlobal(w, rows, cols, g)
			checkNVFP4(t, w, rows, cols, p3, s3, g)
		}
	}
	// All-zero tensor: global 1, every block scale 1.0, codes 0.
	p, s, g := QuantNVFP4(make([]float32, 64), 2, 32)
	for i := range p {
		if p[i] != 0 {
			t.Fatalf("zero tensor gives codes % x", p)
		}
	}
	for i := range s {
		if s[i] != 0x38 {
			t.Fatalf("zero tensor block scale %#02x, want 0x38 (1.0)", s[i])
		}
	}
	if g != 1 {
		t.Errorf("zero tensor global %v, want 1", g)
	}
}

// TestNVFP4LosslessCast: MXFP4 scales re-expressed against 2^(kmax-8) decode the
// unchanged nibbles to the same values, and out-of-range scales are refused.
func TestNVFP4LosslessCast(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for _, sh := range [][2]int{{64, 256}, {3, 48}, {5, 2}} {
		rows, cols := sh[0], sh[1]
		packed, scale := randMXFP4(rng, rows, cols)
		for i := range scale {
			scale[i] = uint8(120 + rng.IntN(17)) // a spread of 2^16 fits e4m3 powers of two
		}
		ref := make([]float32, rows*cols)
		DequantMXFP4(packed, scale, rows, cols, ref)
		ge := MXFP4MaxExp(scale) - 8
		nv, err := MXFP4ScalesToNVFP4(scale, rows, cols, ge)
		if err != nil {
			t.Fatal(err)
		}
		if len(nv) != rows*((cols+15)/16) {
			t.Fatalf("%v: %d NVFP4 scales", sh, len(nv))
		}
		out := make([]float32, rows*cols)
		DequantNVFP4(packed, nv, Pow2F32(ge), rows, cols, out)
		for i := range ref {
			if out[i] != ref[i] {
				t.Fatalf("%v element %d: %v, want %v", sh, i, out[i], ref[i])
			}
		}
	}
	bad := []byte{127, 100}
	if _, err := MXFP4ScalesToNVFP4(bad, 1, 64, -8+0); err == nil {
		t.Errorf("scale spread 2^27 accepted")
	}
	if _, err := MXFP4ScalesToNVFP4([]byte{0xff}, 1, 32, 0); err == nil {
		t.Errorf("NaN scale accepted")
	}
	if _, err := MXFP4ScalesToNVFP4([]byte{1, 2}, 1, 32, 0); err == nil {
		t.Errorf("wrong scale length accepted")
	}
}

func TestWeightPanicsOnShortInput(t *testing.T) {
	cases := []struct {
		name string
		f    func()
	}{
		{"fp8 scale", func() { DequantFP8Block(make([]byte, 4), nil, 2, 2, make([]float32, 4)) }},
		{"mxfp4 odd", func() { DequantMXFP4(nil, nil, 1, 3, nil) }},
		{"nvfp4 out", func() { DequantNVFP4(make([]byte, 1), make([]byte, 1), 1, 1, 2, nil) }},
		{"quant short", func() { QuantMXFP4(make([]float32, 3), 2, 2) }},
		{"bad global", func() { QuantNVFP4WithGlobal(make([]float32, 2), 1, 2, 0) }},
	}
	for _, c := range cases {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
}
