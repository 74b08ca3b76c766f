package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/cuda"
)

// hcKernelChoices are the split hc pre's kernel sets: KernelChoice.HcFast's
// (hc_pre_part2, hc_pre_fin2, hc_pre_fin_norm2) and the default ones.
var hcKernelChoices = []struct {
	name string
	kc   cuda.KernelChoice
}{{"new", cuda.KernelChoice{HcFast: true}}, {"old", cuda.KernelChoice{}}}

// hcPreBoth runs HcPre and HcPreNorm under kernel choice kc: hc pre's out and
// mix, then the fused op's normed and mix.
func hcPreBoth(t *testing.T, p *pair, kc cuda.KernelChoice, x twin, h backend.HC, a backend.HcArgs, w backend.Vec, rows, d int) (o, mix, y, fmix twin) {
	t.Helper()
	g := p.g.(*Backend)
	must(t, g.Context().SetKernelChoice(kc))
	n := a.Streams
	o, mix = p.out(rows, d), p.out(rows, n+n*n)
	must(t, g.HcPre(x.g, h, a, o.g, mix.g))
	fo, y, fmix := p.out(rows, d), p.out(rows, d), p.out(rows, n+n*n)
	must(t, g.HcPreNorm(x.g, h, a, w, 1e-6, fo.g, y.g, fmix.g))
	return o, mix, y, fmix
}

// TestHcPreFinOld: the HcFast split kernels give the default kernels' bits
// (hc pre's output and mix, the fused norm and mix), at batch 1 and past
// the 8 rows of a partial-sum CTA (9: a second CTA of one row).
func TestHcPreFinOld(t *testing.T) {
	shapes := []struct {
		name        string
		n, d, iters int
		rows        []int
	}{
		{"flash", 4, 4096, 20, []int{1, 3}},
		{"small", 4, 256, 20, []int{1, 9}},
		{"n2", 2, 256, 3, []int{2}},
		{"n8", 8, 128, 2, []int{5}},
		{"n1", 1, 64, 0, []int{3}},
	}
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			defer func() { must(t, p.g.(*Backend).Context().SetKernelChoice(cuda.KernelChoice{})) }()
			for _, sh := range shapes {
				n, d := sh.n, sh.d
				a := backend.HcArgs{Streams: n, Sinkhorn: sh.iters, Eps: 1e-6, NormEps: 1e-6}
				_, h := p.hcParams((2+n)*n, n, d, []float32{0.7, 1.3, 0.9})
				_, w := p.normWeights(d)
				for _, rows := range sh.rows {
					tag := fmt.Sprintf("%s n=%d d=%d rows=%d", sh.name, n, d, rows)
					x := p.rand(rows, n*d, 1)
					var got [2][4]twin
					for i, c := range hcKernelChoices {
						o, mix, y, fmix := hcPreBoth(t, p, c.kc, x, h, a, w, rows, d)
						got[i] = [4]twin{o, mix, y, fmix}
					}
					for i, what := range []string{"out", "mix", "normed", "fused mix"} {
						sameBits(t, p, tag+" "+what+" (old vs new)", got[1][i].g, got[0][i].g, true)
					}
				}
			}
		})
	}
}

// TestHcPreSinkhornBits: with fn = 0 the mix values are base's exactly on
// both backends, so post and the Sinkhorn's comb (and the output, a sum of
// the streams weighted by pre) must be the CPU's bits, for both kernel
// sets: wide comb spreads drive the row softmax to tiny and subnormal values,
// eps 0 keeps them.
func TestHcPreSinkhornBits(t *testing.T) {
	cases := []struct {
		n, d, iters int
		spread, eps float64
		bases       int
	}{
		{4, 256, 20, 1, 1e-6, 3},
		{4, 256, 20, 12, 1e-6, 3},
		{4, 256, 20, 40, 0, 3},
		{4, 64, 1, 60, 0, 2},
		{2, 256, 3, 8, 1e-6, 2},
		{8, 128, 5, 8, 1e-6, 2},
		{8, 128, 3, 40, 0, 1},
		{1, 64, 0, 3, 1e-6, 1},
	}
	p := newPair(t, backend.Faithful)
	g := p.g.(*Backend)
	defer func() { must(t, g.Context().SetKernelChoice(cuda.KernelChoice{})) }()
	for _, c := range cases {
		n, d, mixN := c.n, c.d, (2+c.n)*c.n
		a := backend.HcArgs{Streams: n, Sinkhorn: c.iters, Eps: float32(c.eps), NormEps: 1e-6}
		for b := range c.bases {
			tag := fmt.Sprintf("n=%d iters=%d spread=%g eps=%g base %d", n, c.iters, c.spread, c.eps, b)
			base := hcRand(p, mixN, 0.5)
			for i := 2 * n; i < mixN; i++ {
				base[i] = float32(p.rng.NormFloat64() * c.spread)
			}
			fn := make([]float32, mixN*n*d)
			scale := []float32{0.7, 1.3, 0.9}
			ch := cpu.NewHC(mixN, n*d, fn, base, scale)
			gh, err := g.NewHC(mixN, n*d, fn, base, scale)
			must(t, err)
			const rows = 2
			x := p.rand(rows, n*d, 1)
			o, mix := p.out(rows, d), p.out(rows, n+n*n)
			must(t, p.c.HcPre(x.c, ch, a, o.c, mix.c))
			want := mix.c.(*cpu.Tensor).F
			wantO := o.c.(*cpu.Tensor).F
			for _, k := range hcKernelChoices {
				must(t, g.Context().SetKernelChoice(k.kc))
				gm, gout := p.out(rows, n+n*n), p.out(rows, d)
				must(t, g.HcPre(x.g, gh, a, gout.g, gm.g))
				for what, pair := range map[string]struct {
					w []float32
					g backend.Tensor
				}{"mix": {want, gm.g}, "out": {wantO, gout.g}} {
					got := make([]float32, len(pair.w))
					p.must(g.Download(pair.g, got))
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(pair.w[i]) {
							t.Fatalf("%s %s: %s[%d] = %g (%#08x), CPU %g (%#08x)", k.name, tag, what, i,
								got[i], math.Float32bits(got[i]), pair.w[i], math.Float32bits(pair.w[i]))
						}
					}
				}
			}
		}
	}
}

// TestHcPostOld: hc_post_f32_nN (HcFast) gives hc_post_f32's bits, out of place and in
// place (out aliasing x).
func TestHcPostOld(t *testing.T) {
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			g := p.g.(*Backend)
			defer func() { must(t, g.Context().SetKernelChoice(cuda.KernelChoice{})) }()
			for _, sh := range []struct{ n, d, rows int }{{4, 4096, 1}, {4, 200, 3}, {2, 64, 2}, {8, 96, 2}, {1, 32, 1}} {
				n, d, rows := sh.n, sh.d, sh.rows
				a := backend.HcArgs{Streams: n, Eps: 1e-6, NormEps: 1e-6}
				x, o, mix := p.rand(rows, n*d, 1), p.rand(rows, d, 1), p.rand(rows, n+n*n, 0.5)
				for _, inPlace := range []bool{false, true} {
					tag := fmt.Sprintf("n=%d d=%d rows=%d in place %v", n, d, rows, inPlace)
					var got [2]twin
					for i, kc := range []cuda.KernelChoice{{HcFast: true}, {}} {
						must(t, g.Context().SetKernelChoice(kc))
						src, dst := x, p.out(rows, n*d)
						if inPlace {
							src = p.from(rows, n*d, x.host)
							dst = src
						}
						must(t, g.HcPost(o.g, src.g, mix.g, a, dst.g))
						got[i] = dst
					}
					sameBits(t, p, "hc post "+tag, got[1].g, got[0].g, true)
				}
			}
		})
	}
}
