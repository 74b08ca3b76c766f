package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
)

// TestHcPreSinkhornBits: with fn = 0 the mix values are base's exactly on
// both backends, so post and the Sinkhorn's comb (and the output, a sum of
// the streams weighted by pre) must be the CPU's bits: wide comb spreads
// drive the row softmax to tiny and subnormal values, eps 0 keeps them.
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
	g := p.G.(*Backend)
	for _, c := range cases {
		n, d, mixN := c.n, c.d, (2+c.n)*c.n
		a := backend.HcArgs{Streams: n, Sinkhorn: c.iters, Eps: float32(c.eps), NormEps: 1e-6}
		for b := range c.bases {
			tag := fmt.Sprintf("n=%d iters=%d spread=%g eps=%g base %d", n, c.iters, c.spread, c.eps, b)
			base := opcheck.HCRand(p, mixN, 0.5)
			for i := 2 * n; i < mixN; i++ {
				base[i] = float32(p.Rng.NormFloat64() * c.spread)
			}
			fn := make([]float32, mixN*n*d)
			scale := []float32{0.7, 1.3, 0.9}
			ch := cpu.NewHC(mixN, n*d, fn, base, scale)
			gh, err := g.NewHC(mixN, n*d, fn, base, scale)
			must(t, err)
			const rows = 2
			x := p.Rand(rows, n*d, 1)
			o, mix := p.Out(rows, d), p.Out(rows, n+n*n)
			must(t, p.C.HcPre(x.C, ch, a, o.C, mix.C))
			want := mix.C.(*cpu.Tensor).F
			wantO := o.C.(*cpu.Tensor).F
			{
				gm, gout := p.Out(rows, n+n*n), p.Out(rows, d)
				must(t, g.HcPre(x.G, gh, a, gout.G, gm.G))
				for what, pair := range map[string]struct {
					w []float32
					g backend.Tensor
				}{"mix": {want, gm.G}, "out": {wantO, gout.G}} {
					got := make([]float32, len(pair.w))
					p.Must(g.Download(pair.g, got))
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(pair.w[i]) {
							t.Fatalf("%s: %s[%d] = %g (%#08x), CPU %g (%#08x)", tag, what, i,
								got[i], math.Float32bits(got[i]), pair.w[i], math.Float32bits(pair.w[i]))
						}
					}
				}
			}
		}
	}
}

// TestHcPostInPlace: hc post in place (out aliasing x, as the model runs it)
// gives the out-of-place bits, and both the CPU's within the op limit, for
// the unrolled stream counts and the generic kernel (n = 3).
func TestHcPostInPlace(t *testing.T) {
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, sh := range []struct{ n, d, rows int }{{4, 4096, 1}, {4, 200, 3}, {2, 64, 2}, {8, 96, 2}, {1, 32, 1}, {3, 64, 2}} {
				n, d, rows := sh.n, sh.d, sh.rows
				a := backend.HcArgs{Streams: n, Eps: 1e-6, NormEps: 1e-6}
				x, o, mix := p.Rand(rows, n*d, 1), p.Rand(rows, d, 1), p.Rand(rows, n+n*n, 0.5)
				tag := fmt.Sprintf("n=%d d=%d rows=%d", n, d, rows)
				out := p.Out(rows, n*d)
				must(t, p.C.HcPost(o.C, x.C, mix.C, a, out.C))
				must(t, p.G.HcPost(o.G, x.G, mix.G, a, out.G))
				p.Check("hc post "+tag, out, 1e-3)
				in := p.From(rows, n*d, x.Host)
				must(t, p.G.HcPost(o.G, in.G, mix.G, a, in.G))
				sameBits(t, p, "hc post in place "+tag, in.G, out.G, true)
			}
		})
	}
}
