package rope

import (
	"math"
	"testing"
)

func TestYaRNRange(t *testing.T) {
	y := YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1}
	if lo, hi := CorrectionRange(64, 160000, y); lo != 15 || hi != 25 {
		t.Errorf("base 160000: low/high = %d/%d, want 15/25", lo, hi)
	}
	f, err := New(64, 160000, &y)
	if err != nil {
		t.Fatal(err)
	}
	for p := range 32 {
		base := math.Pow(160000, -float64(2*p)/64)
		ramp := math.Min(math.Max((float64(p)-15)/10, 0), 1)
		want := base*(1-ramp) + base/16*ramp
		if math.Abs(f.F64[p]-want) > 1e-15*want {
			t.Errorf("pair %d: f64 %g want %g", p, f.F64[p], want)
		}
		if math.Abs(float64(f.F32[p])-want) > 1e-6*want {
			t.Errorf("pair %d: f32 %g want %g", p, f.F32[p], want)
		}
		switch {
		case p <= 15 && f.F64[p] != base:
			t.Errorf("pair %d should keep its frequency", p)
		case p >= 25 && math.Abs(f.F64[p]-base/16) > 1e-15*base:
			t.Errorf("pair %d should be divided by 16", p)
		}
	}
	// Ratio-0 layers: base 10000, no YaRN.
	g, _ := New(64, 10000, nil)
	if g.YaRN || math.Abs(g.F64[1]-math.Pow(10000, -2.0/64)) > 1e-16 {
		t.Error("plain table")
	}
	if _, err := New(63, 10000, nil); err == nil {
		t.Error("odd dim accepted")
	}
	// Faithful angle is the fp32 product.
	if a := f.Angle32(70000, 3); a != float32(70000)*f.F32[3] {
		t.Error("angle not fp32")
	}
}
