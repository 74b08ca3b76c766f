package gpu

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
)

// TestExpertsCombinePost: ExpertsCombinePost (the hc post in moe_combine's
// launch) gives the bits of ExpertsCombine then HcPost on the GPU, for every
// unrolled stream count and one that is not (3: the separate ops), and the
// CPU's result within the experts' tolerance; so does SetSplitFused's path.
func TestExpertsCombinePost(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			g := p.G.(*Backend)
			tol := 2e-2
			if mode == backend.Exact {
				tol = 1e-4
			}
			const E, K, dim, inter = 8, 2, 256, 128
			ex := opcheck.RandExperts(p, checkpoint.FormatMXFP4, E, dim, inter)
			ce, err := p.C.PrepareExperts("moe", ex, dim, inter)
			must(t, err)
			ge, err := p.G.PrepareExperts("moe", ex, dim, inter)
			must(t, err)
			for _, c := range []struct {
				streams, n int
				split      bool
			}{{4, 1, false}, {4, 17, false}, {1, 3, false}, {2, 5, false}, {8, 2, false}, {3, 2, false}, {4, 3, true}} {
				tag := fmt.Sprintf("streams %d n=%d split=%v", c.streams, c.n, c.split)
				idv, wv := opcheck.Routing(p, c.n, E, K)
				ids, w := p.IDs(c.n, K, idv), p.From(c.n, K, wv)
				x, s := p.Rand(c.n, dim, 1), p.Rand(c.n, dim, 1)
				mix := p.Rand(c.n, c.streams+c.streams*c.streams, 0.5)
				hv := make([]float32, c.n*c.streams*dim)
				for i := range hv {
					hv[i] = float32(p.Rng.NormFloat64())
				}
				hs, sep := p.From(c.n, c.streams*dim, hv), p.From(c.n, c.streams*dim, hv)
				h := backend.HcArgs{Streams: c.streams, Sinkhorn: 20, Eps: 1e-6, NormEps: 1e-6}
				a := backend.ExpertsArgs{Limit: 2}
				got, want := p.Out(c.n, dim), p.Out(c.n, dim)
				must(t, g.SetSplitFused(c.split))
				must(t, p.G.ExpertsCombinePost(x.G, ge, w.G, ids.G, a, s.G, got.G, hs.G, mix.G, h))
				must(t, g.SetSplitFused(false))
				must(t, p.G.ExpertsCombine(x.G, ge, w.G, ids.G, a, s.G, want.G))
				must(t, p.G.HcPost(want.G, sep.G, mix.G, h, sep.G))
				fusedSameBits(t, p.G, "experts combine post output "+tag, got.G, want.G)
				fusedSameBits(t, p.G, "experts combine post streams "+tag, hs.G, sep.G)
				must(t, p.C.ExpertsCombinePost(x.C, ce, w.C, ids.C, a, s.C, got.C, hs.C, mix.C, h))
				p.Check("experts combine post output "+tag, got, tol)
				p.Check("experts combine post streams "+tag, hs, tol)
				p.Release()
			}
			n := 2
			idv, wv := opcheck.Routing(p, n, E, K)
			ids, w := p.IDs(n, K, idv), p.From(n, K, wv)
			x, s, o := p.Rand(n, dim, 1), p.Rand(n, dim, 1), p.Out(n, dim)
			for _, bad := range []struct {
				name   string
				hs, mx opcheck.Twin
				h      backend.HcArgs
			}{
				{"streams of another width", p.Rand(n, 4*dim+4, 1), p.Rand(n, 20, 1), backend.HcArgs{Streams: 4}},
				{"mix of another width", p.Rand(n, 4*dim, 1), p.Rand(n, 16, 1), backend.HcArgs{Streams: 4}},
				{"no streams", p.Rand(n, 4*dim, 1), p.Rand(n, 20, 1), backend.HcArgs{}},
			} {
				if err := p.G.ExpertsCombinePost(x.G, ge, w.G, ids.G, backend.ExpertsArgs{}, s.G, o.G, bad.hs.G, bad.mx.G, bad.h); err == nil {
					t.Errorf("experts combine post accepted %s", bad.name)
				}
			}
			if err := p.G.ExpertsCombinePost(x.G, ge, w.G, ids.G, backend.ExpertsArgs{}, nil, o.G, p.Rand(n, 4*dim, 1).G, p.Rand(n, 20, 1).G, backend.HcArgs{Streams: 4}); err == nil {
				t.Error("experts combine post accepted no shared expert")
			}
		})
	}
}
