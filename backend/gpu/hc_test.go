package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/num"
)

var hcModes = []backend.Numerics{backend.Faithful, backend.Exact}

func TestHeadNorm(t *testing.T) {
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, rows := range []int{1, 5, 67} {
				for _, sh := range []struct{ heads, hd int }{{8, 512}, {16, 128}, {3, 48}, {2, 20}} {
					// Per-row magnitudes from 1e-3 to 1e2 so the bf16 steps round differently.
					v := make([]float32, rows*sh.heads*sh.hd)
					for i := range v {
						s := math.Pow(10, float64((i/sh.hd)%6)-3)
						v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * s))
					}
					x := p.From(rows, sh.heads*sh.hd, v)
					must(t, p.C.HeadNorm(x.C, sh.hd, 1e-6))
					must(t, p.G.HeadNorm(x.G, sh.hd, 1e-6))
					p.Check(fmt.Sprintf("head norm %dx%dx%d", rows, sh.heads, sh.hd), x, 1e-6)
				}
			}
			x := p.Rand(2, 100, 1)
			if err := p.G.HeadNorm(x.G, 64, 1e-6); err == nil {
				t.Error("head norm accepted width 100 with head dim 64")
			}
		})
	}
}

func TestHadamardFP4(t *testing.T) {
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, rows := range []int{1, 5, 67} {
				for _, sh := range []struct{ heads, hd int }{{4, 128}, {64, 128}, {2, 512}, {3, 16}, {1, 2048}} {
					v := make([]float32, rows*sh.heads*sh.hd)
					for i := range v {
						head := i / sh.hd
						switch head % 4 {
						case 3: // all-zero head: the amax floor
						case 2: // tiny values near the fp32 normal limit
							v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * 1e-36))
						default:
							v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * math.Pow(10, float64(head%3))))
						}
					}
					x := p.From(rows, sh.heads*sh.hd, v)
					must(t, p.C.HadamardFP4(x.C, sh.hd))
					must(t, p.G.HadamardFP4(x.G, sh.hd))
					p.Check(fmt.Sprintf("hadamard fp4 %dx%dx%d", rows, sh.heads, sh.hd), x, 1e-6)
				}
			}
			x := p.Rand(1, 96, 1)
			if err := p.G.HadamardFP4(x.G, 96); err == nil {
				t.Error("hadamard accepted head dim 96")
			}
		})
	}
}

func TestHcPreHead(t *testing.T) {
	lims := map[backend.Numerics]float64{backend.Faithful: 2e-3, backend.Exact: 1e-5}
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			for _, sh := range []struct{ n, d, iters int }{{4, 4096, 20}, {4, 256, 20}, {2, 256, 3}, {8, 128, 1}, {1, 64, 0}} {
				n, d := sh.n, sh.d
				a := backend.HcArgs{Streams: n, Sinkhorn: sh.iters, Eps: 1e-6, NormEps: 1e-6}
				cPre, gPre := p.HCParams((2+n)*n, n, d, []float32{0.7, 1.3, 0.9})
				cHead, gHead := p.HCParams(n, n, d, []float32{1.1})
				for _, rows := range []int{1, 5, 67} {
					tag := fmt.Sprintf("n=%d d=%d iters=%d rows=%d", n, d, sh.iters, rows)
					x := p.Rand(rows, n*d, 1)
					o, mix := p.Out(rows, d), p.Out(rows, n+n*n)
					must(t, p.C.HcPre(x.C, cPre, a, o.C, mix.C))
					must(t, p.G.HcPre(x.G, gPre, a, o.G, mix.G))
					p.Check("hc pre out "+tag, o, lims[mode])
					p.Check("hc pre mix "+tag, mix, 1e-4)

					oh := p.Out(rows, d)
					must(t, p.C.HcHead(x.C, cHead, a, oh.C))
					must(t, p.G.HcHead(x.G, gHead, a, oh.G))
					p.Check("hc head "+tag, oh, lims[mode])
				}
			}
			// Mismatched shapes are rejected.
			_, gPre := p.HCParams(24, 4, 64, []float32{1, 1, 1})
			x := p.Rand(2, 256, 1)
			a := backend.HcArgs{Streams: 4, Sinkhorn: 20, Eps: 1e-6, NormEps: 1e-6}
			if err := p.G.HcPre(x.G, gPre, a, p.Out(2, 64).G, p.Out(2, 19).G); err == nil {
				t.Error("hc pre accepted a 19-wide mix")
			}
			if err := p.G.HcHead(x.G, gPre, a, p.Out(2, 64).G); err == nil {
				t.Error("hc head accepted hc pre parameters")
			}
		})
	}
}

// TestHcPreNorm checks HcPreNorm bit for bit against HcPre then RMSNorm on
// the GPU (normed and mix), and that it fuses exactly where hc pre splits:
// the fused kernel leaves out holding the split's partials.
func TestHcPreNorm(t *testing.T) {
	shapes := []struct {
		name        string
		n, d, iters int
		rows        []int
		fused       bool
	}{
		{"flash", 4, 4096, 20, []int{1, 3, 17}, true},
		{"pro", 4, 7168, 20, []int{1, 3}, true}, // rows beyond rmsnorm_f32's register cache
		{"small", 4, 256, 20, []int{1, 3, 17}, true},
		{"n2", 2, 256, 3, []int{3}, true},
		{"n8", 8, 128, 1, []int{3}, true},
		{"n1", 1, 64, 0, []int{3}, true},
		{"odd d", 4, 66, 20, []int{3}, false}, // no split: the two ops
	}
	for _, mode := range hcModes {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			g := p.G.(*Backend)
			for _, sh := range shapes {
				n, d := sh.n, sh.d
				a := backend.HcArgs{Streams: n, Sinkhorn: sh.iters, Eps: 1e-6, NormEps: 1e-6}
				_, hc := p.HCParams((2+n)*n, n, d, []float32{0.7, 1.3, 0.9})
				_, w := p.NormWeights(d)
				for _, rows := range sh.rows {
					tag := fmt.Sprintf("%s n=%d d=%d rows=%d", sh.name, n, d, rows)
					x := p.Rand(rows, n*d, 1)
					o, y, mix := p.Out(rows, d), p.Out(rows, d), p.Out(rows, n+n*n)
					must(t, p.G.HcPre(x.G, hc, a, o.G, mix.G))
					must(t, p.G.RMSNorm(o.G, w, 1e-6, y.G))
					fo, fy, fmix := p.Out(rows, d), p.Out(rows, d), p.Out(rows, n+n*n)
					must(t, g.HcPreNorm(x.G, hc, a, w, 1e-6, fo.G, fy.G, fmix.G))
					sameBits(t, p, tag+" normed", y.G, fy.G, true)
					sameBits(t, p, tag+" mix", mix.G, fmix.G, true)
					if same := sameBits(t, p, tag+" out", o.G, fo.G, false); same == sh.fused {
						t.Errorf("%s: want fused %v, but out holds the hc output: %v", tag, sh.fused, same)
					}
				}
			}
		})
	}
}

// sameBits reports whether GPU tensors a and b hold the same bits; must:
// fail the test where they differ or a is not finite.
func sameBits(t *testing.T, p *opcheck.Pair, name string, a, b backend.Tensor, must bool) bool {
	t.Helper()
	av, bv := make([]float32, a.Rows()*a.Cols()), make([]float32, b.Rows()*b.Cols())
	p.Must(p.G.Download(a, av))
	p.Must(p.G.Download(b, bv))
	for i := range av {
		if must && (math.IsNaN(float64(av[i])) || math.IsInf(float64(av[i]), 0)) {
			t.Fatalf("%s: separate ops give %g at %d", name, av[i], i)
		}
		if math.Float32bits(av[i]) != math.Float32bits(bv[i]) {
			if must {
				t.Fatalf("%s: element %d is %g fused, %g separate", name, i, bv[i], av[i])
			}
			return false
		}
	}
	return true
}

// sepHcPreNorm is the GPU backend with HcPreNorm as the two separate ops.
type sepHcPreNorm struct{ *Backend }

func (s sepHcPreNorm) HcPreNorm(x backend.Tensor, h backend.HC, a backend.HcArgs, norm backend.Vec, eps float32, out, normed, mix backend.Tensor) error {
	return s.hcPreThenNorm(x, h, a, norm, eps, out, normed, mix)
}

// TestHcPreNormInModel runs the small model (a prefill, then a decode step)
// with the fused HcPreNorm and with the separate ops: the same logits bits.
func TestHcPreNormInModel(t *testing.T) {
	g := openGPU(t, Options{})
	w, err := checkpoint.RandomWeights(checkpoint.SmallConfig(), checkpoint.GenOfficial, 7)
	if err != nil {
		t.Fatal(err)
	}
	opts := model.Options{CacheBytes: 16 << 20}
	run := func(be backend.Backend) [][]float32 {
		m, err := model.New(w, be, opts)
		if err != nil {
			t.Fatal(err)
		}
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		var logits [][]float32
		for _, toks := range [][]int32{{5, 17, 3}, {99}} {
			out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks, AllLogits: true}}})
			if err != nil {
				t.Fatal(err)
			}
			logits = append(logits, out.Rows(0)...)
		}
		return logits
	}
	fused, sep := run(g), run(sepHcPreNorm{g})
	for r := range sep {
		for i := range sep[r] {
			if math.Float32bits(fused[r][i]) != math.Float32bits(sep[r][i]) {
				t.Fatalf("row %d logit %d: %g fused, %g separate", r, i, fused[r][i], sep[r][i])
			}
		}
	}
}
