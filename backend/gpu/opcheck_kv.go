package gpu

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/rope"
)

// kvParams are one compressor's parameters on both backends.
type kvParams struct {
	cm, gm backend.Mat
	cn, gn backend.Vec
}

func (p *pair) kvParams(ratio, dc int) kvParams {
	var k kvParams
	a := p.rand(ratio, coff(ratio)*dc, 0.5)
	k.cm = cpu.NewMat(ratio, coff(ratio)*dc, a.host)
	var err error
	k.gm, err = p.g.NewMat(ratio, coff(ratio)*dc, a.host)
	p.must(err)
	nv := hcRand(p, dc, 0.1)
	for i := range nv {
		nv[i] += 1
	}
	k.cn, k.gn = p.vec(nv)
	return k
}

// compress runs one compressor on both backends with fresh A and Z.
func (p *pair) compress(kv kvTwin, k kvParams, a backend.CompressArgs, bt *backend.Batch) {
	n, w := bt.Rows(), coff(a.Ratio)*a.Dim
	A, Z := p.rand(n, w, 1), p.rand(n, w, 1)
	ca, ga := a, a
	ca.APE, ca.Norm = k.cm, k.cn
	ga.APE, ga.Norm = k.gm, k.gn
	p.cpu("compress", p.c.Compress(kv.c, A.c, Z.c, ca, bt))
	if err := p.g.Compress(kv.g, A.g, Z.g, ga, bt); err != nil {
		p.t.Fatalf("compress gpu: %v", err)
	}
}

// checkKVPath runs compressor (main and indexer), indexer top-k, sparse
// attention and window writes on layers of ratio 0, 4 and 128 over one
// prefill chunk (two sequences) and a few decode steps, as TestKVStoreSteps.
func checkKVPath(p *pair, d OpDims, _ *embedTable) {
	const blockTokens = 256
	D, H, ID, IH := d.HeadDim, d.Heads, d.IndexHeadDim, d.IndexHeads
	nb := (max(d.Prefill, d.Prefill2)+d.DecodeSteps)/blockTokens + 1
	spec := backend.KVSpec{BlockTokens: blockTokens, MaxBlocks: 2 * nb, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: d.Window, HeadDim: D}, {Window: d.Window, HeadDim: D, Ratio: 4, IndexDim: ID}, {Window: d.Window, HeadDim: D, Ratio: 128}}}
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.must(err)
	var kv kvTwin
	kv.c, err = p.c.NewKVStore(spec)
	p.must(err)
	kv.g, err = p.g.NewKVStore(spec)
	p.must(err)
	for s := range spec.MaxSlots {
		p.must(p.c.ResetSlot(kv.c, s))
		p.must(p.g.ResetSlot(kv.g, s))
	}
	prm := make([][2]kvParams, len(spec.Layers))
	for i, l := range spec.Layers {
		if l.Ratio > 0 {
			prm[i][0] = p.kvParams(l.Ratio, D)
			if l.IndexDim > 0 {
				prm[i][1] = p.kvParams(l.Ratio, ID)
			}
		}
	}
	cs, gs := p.vec(hcRand(p, H, 1))
	steps := [][2]int{{d.Prefill, d.Prefill2}}
	for range d.DecodeSteps {
		steps = append(steps, [2]int{1, 1})
	}
	keep := len(p.allocs) // parameters stay; per-step tensors are freed
	starts := []int{0, 0}
	for si, st := range steps {
		bt := stepBatchBlocks(starts, st[:], nb)
		n := bt.Rows()
		for layer, l := range spec.Layers {
			tag := fmt.Sprintf("step %d (%d+%d rows) ratio %d", si, st[0], st[1], l.Ratio)
			kvr := p.rand(n, D, 1)
			q := p.rand(n, H*D, 1)
			var sel twin
			if l.Ratio > 0 {
				p.compress(kv, prm[layer][0], backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: D, NormEps: d.NormEps, Rope: fr}, bt)
			}
			if l.IndexDim > 0 {
				p.compress(kv, prm[layer][1], backend.CompressArgs{Layer: layer, Kind: backend.CompressIndex, Ratio: l.Ratio, Dim: ID, NormEps: d.NormEps, Rope: fr}, bt)
				iq, iw := p.rand(n, IH*ID, 1), p.rand(n, IH, 0.5)
				ia := backend.IndexerArgs{Layer: layer, Heads: IH, HeadDim: ID, TopK: d.IndexTopK, Ratio: l.Ratio}
				o := p.outI32(n, d.IndexTopK)
				p.cpu("indexer", p.c.IndexerTopK(kv.c, iq.c, iw.c, ia, bt, o.c))
				p.gpu("indexer", func() error { return p.g.IndexerTopK(kv.g, iq.g, iw.g, ia, bt, o.g) })
				// Summation order may flip near-ties; a wrong algorithm differs wholesale.
				p.checkIDsTol(fmt.Sprintf("indexer_topk %s %dx%dx%d k=%d", tag, n, IH, ID, d.IndexTopK), o, 0.05)
				// Attention uses the CPU's selection on both sides (plus a -1 and an out-of-range entry).
				ws := append([]int32(nil), o.c.(*cpu.Tensor).I...)
				ws[0], ws[len(ws)-1] = -1, 1<<20
				sel = p.ids(n, d.IndexTopK, ws)
			}
			aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: d.Window, Ratio: l.Ratio, Scale: float32(1 / math.Sqrt(float64(D))), Sink: cs}
			ga := aa
			ga.Sink = gs
			o := p.out(n, H*D)
			p.cpu("attention", p.c.SparseAttention(kv.c, q.c, kvr.c, sel.c, aa, bt, o.c))
			p.gpu("attention", func() error { return p.g.SparseAttention(kv.g, q.g, kvr.g, sel.g, ga, bt, o.g) })
			p.check(fmt.Sprintf("sparse_attention %s %dx%dx%d", tag, n, H, D), o, 2e-3)
			p.cpu("write window", p.c.WriteWindow(kv.c, layer, kvr.c, bt))
			p.gpu("write window", func() error { return p.g.WriteWindow(kv.g, layer, kvr.g, bt) })
			p.takeDur() // no row of its own: the next step's attention reads the window
			for _, t := range p.allocs[keep:] {
				p.g.Free(t)
			}
			p.allocs = p.allocs[:keep]
		}
		for i := range starts {
			starts[i] += st[i]
		}
	}
}

func checkRouter(p *pair, d OpDims, _ *embedTable) {
	E, K := d.Experts, d.TopK
	cg, gg := p.prep(randLinear(p.rng, checkpoint.FormatBF16, E, d.Dim))
	// Bias from few values: zero input rows give equal scores, so ties must
	// break to the lower index.
	bias := make([]float32, E)
	for i := range bias {
		bias[i] = float32(p.rng.IntN(3)) * 0.25
	}
	cb, gb := p.vec(bias)
	vocab := d.HashRows
	tab := make([]int64, vocab*K)
	for i := range tab {
		tab[i] = int64(p.rng.IntN(E))
	}
	ct, err := p.c.PrepareIDTable("tid2eid", i64Table(tab, vocab, K), vocab, K)
	p.must(err)
	gt, err := p.g.PrepareIDTable("tid2eid", i64Table(tab, vocab, K), vocab, K)
	p.must(err)
	for _, n := range d.Tokens {
		x := p.rand(n, d.Dim, 1)
		for r := 1; r < n; r += 3 {
			clear(x.host[r*d.Dim : (r+1)*d.Dim])
		}
		x = p.from(n, d.Dim, x.host)
		tok := make([]int32, n)
		for i := range tok {
			tok[i] = int32(p.rng.IntN(vocab))
		}
		for _, hash := range []bool{false, true} {
			kind := "score+bias"
			ca := backend.RouterArgs{TopK: K, Scale: d.RouteScale, Bias: cb}
			ga := backend.RouterArgs{TopK: K, Scale: d.RouteScale, Bias: gb}
			allow := float64(1+n*K/500) / float64(n*K) // a handful of near-tie flips
			if hash {
				kind = fmt.Sprintf("hash tid2eid=%d", vocab)
				ca = backend.RouterArgs{TopK: K, Scale: d.RouteScale, Tid2Eid: ct, IDs: tok}
				ga = backend.RouterArgs{TopK: K, Scale: d.RouteScale, Tid2Eid: gt, IDs: tok}
				allow = 0
			}
			tag := fmt.Sprintf("%s E=%d K=%d n=%d dim=%d", kind, E, K, n, d.Dim)
			w, id := p.out(n, K), p.outI32(n, K)
			p.cpu("router", p.c.Router(x.c, cg, ca, w.c, id.c))
			p.gpu("router", func() error { return p.g.Router(x.g, gg, ga, w.g, id.g) })
			if diff := p.checkIDsTol("router ids "+tag, id, allow); diff > 0 {
				p.excludeFlips(id, w, K)
			}
			p.check("router weights "+tag, w, 1e-5)
		}
	}
}

// excludeFlips copies the GPU's weights into the CPU's for rows whose ids
// differ, so the weight check covers the rows that routed alike.
func (p *pair) excludeFlips(id, w twin, K int) {
	want := id.c.(*cpu.Tensor).I
	got := make([]int32, len(want))
	p.must(p.g.DownloadI32(id.g, got))
	gw := make([]float32, len(want))
	p.must(p.g.Download(w.g, gw))
	cw := w.c.(*cpu.Tensor).F
	for r := range len(want) / K {
		for k := range K {
			if got[r*K+k] != want[r*K+k] {
				copy(cw[r*K:(r+1)*K], gw[r*K:(r+1)*K])
				p.t.Logf("router row %d: ids gpu %v cpu %v", r, got[r*K:(r+1)*K], want[r*K:(r+1)*K])
				break
			}
		}
	}
}

// checkExperts runs the routed experts at full dim and inter but only
// ExpertSample distinct experts (host memory and CPU time).
func checkExperts(p *pair, d OpDims, _ *embedTable) {
	E := min(d.ExpertSample, d.Experts)
	if E < d.TopK+2 {
		p.t.Fatalf("experts: %d sampled experts for top-%d", E, d.TopK)
	}
	lim := 2e-2 // FP8 activations, bf16 outputs
	if p.c.Numerics() == backend.Exact {
		lim = 1e-4 // fp32 throughout; only the summation order differs
	}
	for _, f := range []checkpoint.Format{checkpoint.FormatMXFP4, checkpoint.FormatNVFP4} {
		ex := randExperts(p, f, E, d.Dim, d.Inter)
		ce, err := p.c.PrepareExperts("moe", ex, d.Dim, d.Inter)
		p.must(err)
		ge, err := p.g.PrepareExperts("moe", ex, d.Dim, d.Inter)
		p.must(err)
		for _, n := range d.BigTokens {
			idv, wv := routing(p, n, E, d.TopK)
			ids, w := p.ids(n, d.TopK, idv), p.from(n, d.TopK, wv)
			x := p.rand(n, d.Dim, 1)
			a := backend.ExpertsArgs{Limit: d.SwigluLimit}
			acc := p.out(n, d.Dim)
			p.cpu("experts", p.c.Experts(x.c, ce, w.c, ids.c, a, acc.c))
			p.gpu("experts", func() error { return p.g.Experts(x.g, ge, w.g, ids.g, a, acc.g) })
			p.check(fmt.Sprintf("experts %v %d(of %d) experts K=%d n=%d %dx%d", f, E, d.Experts, d.TopK, n, d.Dim, d.Inter), acc, lim)
		}
		p.release()
	}
}

// checkEpilogues runs the attention's q and kv epilogues as the model does
// (fused where the backend offers them) against the CPU's separate ops.
func checkEpilogues(p *pair, d OpDims, _ *embedTable) {
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.must(err)
	a := backend.RopeArgs{Freqs: fr, HeadDim: d.HeadDim}
	cw, gw := p.normWeights(d.HeadDim)
	nope := d.HeadDim - d.RopeDim
	kvLim := 2e-3
	if p.c.Numerics() == backend.Faithful {
		kvLim = 2e-2 // a bf16 step of the norm can move an FP8 value a whole e4m3 step
	}
	for _, rows := range d.Tokens {
		bt := ropeBatch(max(rows, 2))
		n := bt.Rows()
		q := p.rand(n, d.Heads*d.HeadDim, 1)
		p.cpu("q epilogue", p.c.HeadNormRope(q.c, d.NormEps, a, bt))
		p.gpu("q epilogue", func() error { return p.g.HeadNormRope(q.g, d.NormEps, a, bt) })
		p.check(fmt.Sprintf("head_norm_rope q %dx%dx%d", n, d.Heads, d.HeadDim), q, 2e-3)
		x, o := p.rand(n, d.HeadDim, 1), p.out(n, d.HeadDim)
		p.cpu("kv epilogue", p.c.NormRopeKVQuant(x.c, cw, d.NormEps, a, nope, 64, bt, o.c))
		p.gpu("kv epilogue", func() error { return p.g.NormRopeKVQuant(x.g, gw, d.NormEps, a, nope, 64, bt, o.g) })
		p.check(fmt.Sprintf("rmsnorm_rope_kvq kv %dx%d nope=%d", n, d.HeadDim, nope), o, kvLim)
	}
}
