package gpu

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/model"
)

func TestRouter(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			const dim, vocab = 256, 50
			for _, c := range []struct{ E, K int }{{8, 2}, {64, 6}, {256, 6}, {384, 6}, {1000, 32}} {
				gl := opcheck.RandLinear(p.Rng, checkpoint.FormatBF16, c.E, dim)
				cg, err := p.C.PrepareLinear(gl)
				must(t, err)
				gg, err := p.G.PrepareLinear(gl)
				must(t, err)
				// Bias from few values: zero input rows give equal scores, so ties
				// must break to the lower index.
				bias := make([]float32, c.E)
				for i := range bias {
					bias[i] = float32(p.Rng.IntN(3)) * 0.25
				}
				if c.E == 8 {
					bias[3] = float32(math.NaN()) // ranks after every number
				}
				gb, err := p.G.NewVec(bias)
				must(t, err)
				tab := make([]int64, vocab*c.K)
				for i := range tab {
					tab[i] = int64(p.Rng.IntN(c.E))
				}
				ct, err := p.C.PrepareIDTable("tid2eid", opcheck.I64Table(tab, vocab, c.K), vocab, c.K)
				must(t, err)
				gtb, err := p.G.PrepareIDTable("tid2eid", opcheck.I64Table(tab, vocab, c.K), vocab, c.K)
				must(t, err)
				for _, n := range []int{1, 8, 100} {
					x := p.Rand(n, dim, 1)
					for r := 1; r < n; r += 3 {
						clear(x.Host[r*dim : (r+1)*dim])
					}
					x = p.From(n, dim, x.Host)
					tok := make([]int32, n)
					for i := range tok {
						tok[i] = int32(p.Rng.IntN(vocab))
					}
					for _, hash := range []bool{false, true} {
						tag := fmt.Sprintf("E=%d K=%d n=%d hash=%v", c.E, c.K, n, hash)
						ca := backend.RouterArgs{TopK: c.K, Scale: 2.5, Bias: cpu.NewVec(bias)}
						ga := backend.RouterArgs{TopK: c.K, Scale: 2.5, Bias: gb}
						if hash {
							ca = backend.RouterArgs{TopK: c.K, Scale: 1.5, Tid2Eid: ct, IDs: tok}
							ga = backend.RouterArgs{TopK: c.K, Scale: 1.5, Tid2Eid: gtb, IDs: tok}
						}
						w, id := p.Out(n, c.K), p.OutI32(n, c.K)
						must(t, p.C.Router(x.C, cg, ca, w.C, id.C))
						must(t, p.G.Router(x.G, gg, ga, w.G, id.G))
						p.CheckIDs("router ids "+tag, id)
						p.Check("router weights "+tag, w, 1e-5)
					}
				}
				w, id := p.Out(1, c.K), p.OutI32(1, c.K)
				x := p.Rand(1, dim, 1)
				if err := p.G.Router(x.G, gg, backend.RouterArgs{TopK: c.K, Tid2Eid: gtb, IDs: []int32{vocab}}, w.G, id.G); err == nil {
					t.Error("router accepted a token id outside tid2eid")
				}
			}
			// A table naming an expert the gate does not have.
			gl := opcheck.RandLinear(p.Rng, checkpoint.FormatBF16, 8, dim)
			gg, err := p.G.PrepareLinear(gl)
			must(t, err)
			bad, err := p.G.PrepareIDTable("tid2eid", opcheck.I64Table([]int64{0, 8}, 1, 2), 1, 2)
			must(t, err)
			w, id := p.Out(1, 2), p.OutI32(1, 2)
			if err := p.G.Router(p.Rand(1, dim, 1).G, gg, backend.RouterArgs{TopK: 2, Tid2Eid: bad, IDs: []int32{0}}, w.G, id.G); err == nil {
				t.Error("router accepted tid2eid expert 8 of 8")
			}
		})
	}
}

func TestExperts(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) { testExperts(t, mode) })
	}
}

func testExperts(t *testing.T, mode backend.Numerics) {
	p := newPair(t, mode)
	tol := 2e-2
	if mode == backend.Exact {
		tol = 1e-4
	}
	const dim, inter = 256, 128
	for _, f := range []checkpoint.Format{checkpoint.FormatMXFP4, checkpoint.FormatNVFP4} {
		for _, c := range []struct{ E, K int }{{8, 2}, {64, 6}} {
			ex := opcheck.RandExperts(p, f, c.E, dim, inter)
			ce, err := p.C.PrepareExperts("moe", ex, dim, inter)
			must(t, err)
			ge, err := p.G.PrepareExperts("moe", ex, dim, inter)
			must(t, err)
			for _, n := range []int{1, 8, 100} {
				idv, wv := opcheck.Routing(p, n, c.E, c.K)
				ids, w := p.IDs(n, c.K, idv), p.From(n, c.K, wv)
				x := p.Rand(n, dim, 1)
				for _, lim := range []float32{0, 2} {
					for _, trace := range []bool{false, true} {
						tag := fmt.Sprintf("%v E=%d K=%d n=%d limit=%g trace=%v", f, c.E, c.K, n, lim, trace)
						a := backend.ExpertsArgs{Limit: lim, Trace: trace}
						acc := p.Out(n, dim)
						must(t, p.C.Experts(x.C, ce, w.C, ids.C, a, acc.C))
						must(t, p.G.Experts(x.G, ge, w.G, ids.G, a, acc.G))
						p.Check("experts "+tag, acc, tol)
					}
				}
			}
			testExpertsTrace(t, p, f, c.E, c.K)
			// Out-of-range expert ids are reported in trace mode.
			const n = 8
			idv, wv := opcheck.Routing(p, n, c.E, c.K)
			w, a, acc := p.From(n, c.K, wv), backend.ExpertsArgs{Trace: true}, p.Out(n, dim)
			idv[3] = int32(c.E)
			if err := p.G.Experts(p.Rand(n, dim, 1).G, ge, w.G, p.IDs(n, c.K, idv).G, a, acc.G); err == nil {
				t.Errorf("experts accepted expert id %d of %d", c.E, c.E)
			}
		}
	}
	testExpertsRoutes(t, p, tol)
	ex := opcheck.RandExperts(p, checkpoint.FormatMXFP4, 4, dim, inter)
	// Unsupported and mixed formats are refused.
	bf := opcheck.RandExperts(p, checkpoint.FormatBF16, 2, dim, inter)
	if _, err := p.G.PrepareExperts("moe", bf, dim, inter); err == nil || !strings.Contains(err.Error(), "FP4 experts only") {
		t.Errorf("bf16 experts: err %v", err)
	}
	mixed := append(opcheck.RandExperts(p, checkpoint.FormatMXFP4, 1, dim, inter), opcheck.RandExperts(p, checkpoint.FormatNVFP4, 1, dim, inter)...)
	if _, err := p.G.PrepareExperts("moe", mixed, dim, inter); err == nil {
		t.Error("mixed MXFP4/NVFP4 experts accepted")
	}
	if _, err := p.G.PrepareExperts("moe", ex, dim, 2*inter); err == nil {
		t.Error("experts with the wrong inter accepted")
	}
}

// testExpertsRoutes runs Experts where MoERoute plans differently: 8-row
// decode tiles (1 token over 64 experts), 16-row ones (100 tokens: 9 rows
// an expert) and the prefill kernels (520 tokens over 8 experts).
func testExpertsRoutes(t *testing.T, p *opcheck.Pair, tol float64) {
	const dim, inter = 256, 128
	for _, c := range []struct{ E, K, n int }{{64, 6, 1}, {64, 6, 100}, {8, 2, 520}} {
		tag := fmt.Sprintf("E=%d K=%d n=%d", c.E, c.K, c.n)
		ex := opcheck.RandExperts(p, checkpoint.FormatMXFP4, c.E, dim, inter)
		ce, err := p.C.PrepareExperts("moe", ex, dim, inter)
		must(t, err)
		ge, err := p.G.PrepareExperts("moe", ex, dim, inter)
		must(t, err)
		idv, wv := opcheck.Routing(p, c.n, c.E, c.K)
		ids, w := p.IDs(c.n, c.K, idv), p.From(c.n, c.K, wv)
		x := p.Rand(c.n, dim, 1)
		acc := p.Out(c.n, dim)
		must(t, p.C.Experts(x.C, ce, w.C, ids.C, backend.ExpertsArgs{}, acc.C))
		if err := p.G.Experts(x.G, ge, w.G, ids.G, backend.ExpertsArgs{}, acc.G); err != nil {
			t.Fatalf("experts %s: %v", tag, err)
		}
		p.Check("experts "+tag, acc, tol)
	}
}

// TestExpertsPartial: expert parallel on one GPU — the experts split in two
// halves (ExpertsArgs.Offset, Partial) and summed give the CPU's whole-set
// output, in both numerics; without Partial an id outside the half fails.
func TestExpertsPartial(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		p := newPair(t, mode)
		const E, K, n, dim, inter = 8, 2, 12, 256, 128
		ex := opcheck.RandExperts(p, checkpoint.FormatMXFP4, E, dim, inter)
		ce, err := p.C.PrepareExperts("moe", ex, dim, inter)
		must(t, err)
		idv, wv := opcheck.Routing(p, n, E, K)
		ids, w := p.IDs(n, K, idv), p.From(n, K, wv)
		x := p.Rand(n, dim, 1)
		want := p.Out(n, dim)
		must(t, p.C.Experts(x.C, ce, w.C, ids.C, backend.ExpertsArgs{}, want.C))
		sum := make([]float32, n*dim)
		for _, half := range [][2]int{{0, E / 2}, {E / 2, E}} {
			ge, err := p.G.PrepareExperts("moe", ex[half[0]:half[1]], dim, inter)
			must(t, err)
			acc := p.Out(n, dim)
			must(t, p.G.Experts(x.G, ge, w.G, ids.G, backend.ExpertsArgs{Offset: half[0], Partial: true}, acc.G))
			part := make([]float32, n*dim)
			must(t, p.G.Download(acc.G, part))
			for i := range sum {
				sum[i] += part[i]
			}
			if half[0] > 0 {
				if err := p.G.Experts(x.G, ge, w.G, ids.G, backend.ExpertsArgs{Offset: half[0]}, acc.G); err == nil {
					t.Errorf("%v: ids outside [%d, %d) accepted without Partial", mode, half[0], half[1])
				}
			}
		}
		ref := make([]float32, n*dim)
		must(t, p.C.Download(want.C, ref))
		if rel := kcheck.RelF32(ref, sum); rel > 2e-2 || (mode == backend.Exact && rel > 1e-5) {
			t.Errorf("%v: halves vs whole rel %.3g", mode, rel)
		}
	}
}

// TestExpertsCombine: ExpertsCombine (moe_combine adding the shared expert)
// gives the bits of the launches it replaces: Experts, then Combine
// (add_f32); and the CPU's ExpertsCombine (the separate ops) gives the
// reference.
// Shapes: the small config's (8- and 16-row tiles, odd rows), a wider one
// whose w2 splits K too, and Flash's d and inter with 4 experts (faithful MXFP4
// only, where it is cheapest).
func TestExpertsCombine(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			fused := p.G
			tol := 2e-2
			if mode == backend.Exact {
				tol = 1e-4
			}
			type shape struct {
				E, K, dim, inter int
				f                checkpoint.Format
				ns               []int
			}
			cases := []shape{
				{8, 2, 256, 128, checkpoint.FormatMXFP4, []int{1, 3, 17, 41}},
				{8, 2, 256, 128, checkpoint.FormatNVFP4, []int{1, 41}},
				{16, 6, 512, 256, checkpoint.FormatMXFP4, []int{3}},
			}
			if mode == backend.Faithful {
				cases = append(cases, shape{4, 2, 4096, 2048, checkpoint.FormatMXFP4, []int{1}})
			}
			for _, c := range cases {
				ex := opcheck.RandExperts(p, c.f, c.E, c.dim, c.inter)
				ce, err := p.C.PrepareExperts("moe", ex, c.dim, c.inter)
				must(t, err)
				ge, err := p.G.PrepareExperts("moe", ex, c.dim, c.inter)
				must(t, err)
				for _, n := range c.ns {
					tag := fmt.Sprintf("%v E=%d K=%d d=%d n=%d", c.f, c.E, c.K, c.dim, n)
					idv, wv := opcheck.Routing(p, n, c.E, c.K)
					ids, w := p.IDs(n, c.K, idv), p.From(n, c.K, wv)
					x, s := p.Rand(n, c.dim, 1), p.Rand(n, c.dim, 1)
					a := backend.ExpertsArgs{Limit: 2}
					acc, sep := p.Out(n, c.dim), p.Out(n, c.dim)
					must(t, p.G.Experts(x.G, ge, w.G, ids.G, a, acc.G))
					must(t, p.G.Combine(acc.G, s.G, sep.G))
					got := p.Out(n, c.dim)
					must(t, fused.ExpertsCombine(x.G, ge, w.G, ids.G, a, s.G, got.G))
					must(t, p.C.ExpertsCombine(x.C, ce, w.C, ids.C, a, s.C, got.C))
					p.Check("experts+shared "+tag, got, tol)
					want, have := make([]float32, n*c.dim), make([]float32, n*c.dim)
					must(t, p.G.Download(sep.G, want))
					must(t, p.G.Download(got.G, have))
					for i := range want {
						if math.IsNaN(float64(want[i])) || math.Float32bits(have[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s: element %d is %g, Experts then Combine give %g", tag, i, have[i], want[i])
						}
					}
					p.Release()
				}
			}
		})
	}
}

// TestMoEFusedInModel: the synthetic model on the GPU gives the same logits,
// bit for bit, with the MoE launches fused (shared expert in moe_combine) as
// traced (separate ops), over a prefill chunk of odd length and two decode
// steps. (cuda's TestMoEDecFixup checks the split-K sums in moe_fp4_dec
// against the reduce launch.)
func TestMoEFusedInModel(t *testing.T) {
	g := openGPU(t, Options{})
	w := genWeights(t, checkpoint.SmallConfig(), 3)
	run := func(trace bool) [][]float32 {
		m, err := model.New(w, g, model.Options{CacheBytes: 16 << 20, TraceNonFinite: trace})
		must(t, err)
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		var logits [][]float32
		for _, toks := range [][]int32{{5, 17, 3, 99, 42, 7, 250, 11, 64}, {8}, {301}} {
			out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks}}})
			must(t, err)
			logits = append(logits, append([]float32(nil), out.Last(0)...))
		}
		return logits
	}
	want := run(true)
	got := run(false)
	for step := range want {
		for i := range want[step] {
			if math.IsNaN(float64(want[step][i])) || math.Float32bits(got[step][i]) != math.Float32bits(want[step][i]) {
				t.Fatalf("step %d logit %d: fused %g, separate %g", step, i, got[step][i], want[step][i])
			}
		}
	}
}
