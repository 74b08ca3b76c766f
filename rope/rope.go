// Package rope computes the RoPE frequency tables of DeepSeek-V4 (spec §5.2):
// interleaved pairs on the last rope dims, base 10000 without YaRN on ratio-0
// layers and base 160000 with YaRN on compressed layers.
package rope

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/checkpoint"
)

// YaRN holds the rope_scaling constants.
type YaRN struct {
	Factor      float64
	OriginalLen int
	BetaFast    float64
	BetaSlow    float64
}

// Freqs is the per-pair frequency table of one layer kind. F32 follows the
// reference fp32 recipe (faithful); F64 is the exact float64 table.
type Freqs struct {
	RopeDim int
	F32     []float32
	F64     []float64
	Low     int // YaRN ramp bounds (0, 0 without YaRN)
	High    int
	YaRN    bool
}

// Dim is the number of rotated dims (2 per pair).
func (f *Freqs) Dim() int { return f.RopeDim }

// CorrectionRange returns the YaRN ramp bounds (low, high) for the given rope dim and base.
func CorrectionRange(dim int, base float64, y YaRN) (int, int) {
	corr := func(nrot float64) float64 {
		return float64(dim) * math.Log(float64(y.OriginalLen)/(nrot*2*math.Pi)) / (2 * math.Log(base))
	}
	low := int(math.Floor(corr(y.BetaFast)))
	high := int(math.Ceil(corr(y.BetaSlow)))
	return max(low, 0), min(high, dim-1)
}

// New builds the table for rope dim `dim` and `base`; yarn nil disables YaRN.
func New(dim int, base float64, yarn *YaRN) (*Freqs, error) {
	if dim <= 0 || dim%2 != 0 {
		return nil, fmt.Errorf("rope: dim %d must be positive and even", dim)
	}
	if base <= 1 {
		return nil, fmt.Errorf("rope: base %g must be > 1", base)
	}
	n := dim / 2
	f := &Freqs{RopeDim: dim, F32: make([]float32, n), F64: make([]float64, n)}
	b32 := float32(base)
	for p := range n {
		// Reference: 1 / base ** (arange(0, dim, 2, fp32) / dim), all fp32.
		e := float32(2*p) / float32(dim)
		f.F32[p] = 1 / float32(math.Pow(float64(b32), float64(e)))
		f.F64[p] = math.Pow(base, -float64(2*p)/float64(dim))
	}
	if yarn != nil && yarn.OriginalLen > 0 && yarn.Factor > 0 {
		low, high := CorrectionRange(dim, base, *yarn)
		f.Low, f.High, f.YaRN = low, high, true
		hi := float64(high)
		if low == high {
			hi += 0.001
		}
		fac32 := float32(yarn.Factor)
		for p := range n {
			ramp64 := math.Min(math.Max((float64(p)-float64(low))/(hi-float64(low)), 0), 1)
			ramp32 := float32((float32(p) - float32(low)) / (float32(hi) - float32(low)))
			ramp32 = min(max(ramp32, 0), 1)
			smooth := 1 - ramp32
			// explicit conversions keep each op rounded to fp32 (no fused multiply-add)
			f.F32[p] = float32(float32(f.F32[p]/fac32)*(1-smooth)) + float32(f.F32[p]*smooth)
			f.F64[p] = f.F64[p]*(1-ramp64) + f.F64[p]/yarn.Factor*ramp64
		}
	}
	return f, nil
}

// ForLayer returns the table of a layer with compression ratio `ratio` (spec §5.2).
func ForLayer(c *checkpoint.Config, ratio int) (*Freqs, error) {
	if ratio == 0 {
		return New(c.RopeDim, c.RopeTheta, nil)
	}
	var y *YaRN
	if rs := c.RopeScaling; rs != nil && rs.OriginalLen > 0 {
		y = &YaRN{Factor: rs.Factor, OriginalLen: rs.OriginalLen, BetaFast: rs.BetaFast, BetaSlow: rs.BetaSlow}
	}
	return New(c.RopeDim, c.CompressRopeTheta, y)
}

// Angle32 is the faithful fp32 angle fp32(pos)·f (rounded to fp32).
func (f *Freqs) Angle32(pos int, p int) float32 { return float32(float32(pos) * f.F32[p]) }

// CosSin32 returns the fp32 cos and sin of the faithful angle.
func (f *Freqs) CosSin32(pos, p int) (float32, float32) {
	a := float64(f.Angle32(pos, p))
	return float32(math.Cos(a)), float32(math.Sin(a))
}

// CosSin64 returns cos and sin of the exact angle pos·f.
func (f *Freqs) CosSin64(pos, p int) (float64, float64) {
	a := float64(pos) * f.F64[p]
	return math.Cos(a), math.Sin(a)
}
