package opcheck

import (
	"fmt"
	"math"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/rope"
)

// coff is the compressor's width factor c (spec: 2 for the overlapping
// ratio-4 compressor, else 1): A, Z and the APE are c·dim wide.
func coff(ratio int) int {
	if ratio == 4 {
		return 2
	}
	return 1
}

// kvParams are one compressor's parameters on both backends.
type kvParams struct {
	cm, gm backend.Mat
	cn, gn backend.Vec
}

func (p *Pair) kvParams(ratio, dc int) kvParams {
	var k kvParams
	a := p.Rand(ratio, coff(ratio)*dc, 0.5)
	k.cm = cpu.NewMat(ratio, coff(ratio)*dc, a.Host)
	var err error
	k.gm, err = p.G.NewMat(ratio, coff(ratio)*dc, a.Host)
	p.Must(err)
	nv := HCRand(p, dc, 0.1)
	for i := range nv {
		nv[i] += 1
	}
	k.cn, k.gn = p.vec(nv)
	return k
}

// compress runs one compressor on both backends with fresh A and Z.
func (p *Pair) compress(kv KVTwin, k kvParams, a backend.CompressArgs, bt *backend.Batch) {
	n, w := bt.Rows(), coff(a.Ratio)*a.Dim
	A, Z := p.Rand(n, w, 1), p.Rand(n, w, 1)
	ca, ga := a, a
	ca.APE, ca.Norm = k.cm, k.cn
	ga.APE, ga.Norm = k.gm, k.gn
	p.cpu("compress", p.C.Compress(kv.C, A.C, Z.C, ca, bt))
	if err := p.G.Compress(kv.G, A.G, Z.G, ga, bt); err != nil {
		p.t.Fatalf("compress gpu: %v", err)
	}
}

// checkKVPath runs compressor (main and indexer), indexer top-k, sparse
// attention and window writes on layers of ratio 0, 4 and 128 over one
// prefill chunk (two sequences) and a few decode steps, as TestKVStoreSteps;
// in faithful numerics a second time with the device's store compact (the
// CPU's stays fp32).
func checkKVPath(p *Pair, d OpDims, _ *embedTable) {
	kvPath(p, d, false)
	if p.C.Numerics() == backend.Faithful {
		kvPath(p, d, true)
	}
}

func kvPath(p *Pair, d OpDims, compact bool) {
	const blockTokens = 256
	D, H, ID, IH := d.HeadDim, d.Heads, d.IndexHeadDim, d.IndexHeads
	nb := (max(d.Prefill, d.Prefill2)+d.DecodeSteps)/blockTokens + 1
	spec := backend.KVSpec{BlockTokens: blockTokens, MaxBlocks: 2 * nb, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: d.Window, HeadDim: D, RopeDim: d.RopeDim}, {Window: d.Window, HeadDim: D, RopeDim: d.RopeDim, Ratio: 4, IndexDim: ID},
		{Window: d.Window, HeadDim: D, RopeDim: d.RopeDim, Ratio: 128}}}
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.Must(err)
	ef, err := kvcache.NewEntryFormat(D, d.RopeDim)
	p.Must(err)
	var kv KVTwin
	kv.C, err = p.C.NewKVStore(spec)
	p.Must(err)
	gspec := spec
	gspec.Compact = compact
	kv.G, err = p.G.NewKVStore(gspec)
	p.Must(err)
	for s := range spec.MaxSlots {
		p.Must(p.C.ResetSlot(kv.C, s))
		p.Must(p.G.ResetSlot(kv.G, s))
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
	cs, gs := p.vec(HCRand(p, H, 1))
	steps := [][2]int{{d.Prefill, d.Prefill2}}
	for range d.DecodeSteps {
		steps = append(steps, [2]int{1, 1})
	}
	keep := len(p.allocs) // parameters stay; per-step tensors are freed
	starts := []int{0, 0}
	for si, st := range steps {
		bt := StepBatchBlocks(starts, st[:], nb)
		n := bt.Rows()
		for layer, l := range spec.Layers {
			tag := fmt.Sprintf("step %d (%d+%d rows) ratio %d", si, st[0], st[1], l.Ratio)
			kvr := p.Rand(n, D, 1)
			if compact { // as NormRopeKVQuant leaves them: in the entry format
				tag += " compact"
				kvr = p.From(n, D, RoundEntries(p, ef, kvr.Host))
			}
			q := p.Rand(n, H*D, 1)
			var sel Twin
			if l.Ratio > 0 {
				p.compress(kv, prm[layer][0], backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: D, NormEps: d.NormEps, Rope: fr}, bt)
			}
			if l.IndexDim > 0 {
				p.compress(kv, prm[layer][1], backend.CompressArgs{Layer: layer, Kind: backend.CompressIndex, Ratio: l.Ratio, Dim: ID, NormEps: d.NormEps, Rope: fr}, bt)
				iq, iw := p.Rand(n, IH*ID, 1), p.Rand(n, IH, 0.5)
				ia := backend.IndexerArgs{Layer: layer, Heads: IH, HeadDim: ID, TopK: d.IndexTopK, Ratio: l.Ratio}
				o := p.OutI32(n, d.IndexTopK)
				p.cpu("indexer", p.C.IndexerTopK(kv.C, iq.C, iw.C, ia, bt, o.C))
				p.gpu("indexer", func() error { return p.G.IndexerTopK(kv.G, iq.G, iw.G, ia, bt, o.G) })
				// Summation order may flip near-ties; a wrong algorithm differs wholesale.
				p.CheckIDsTol(fmt.Sprintf("indexer_topk %s %dx%dx%d k=%d", tag, n, IH, ID, d.IndexTopK), o, 0.05)
				// Attention uses the CPU's selection on both sides (plus a -1 and an out-of-range entry).
				ws := append([]int32(nil), o.C.(*cpu.Tensor).I...)
				ws[0], ws[len(ws)-1] = -1, 1<<20
				sel = p.IDs(n, d.IndexTopK, ws)
			}
			aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: d.Window, Ratio: l.Ratio, Scale: float32(1 / math.Sqrt(float64(D))), Sink: cs}
			ga := aa
			ga.Sink = gs
			o := p.Out(n, H*D)
			p.cpu("attention", p.C.SparseAttention(kv.C, q.C, kvr.C, sel.C, aa, bt, o.C))
			p.gpu("attention", func() error { return p.G.SparseAttention(kv.G, q.G, kvr.G, sel.G, ga, bt, o.G) })
			p.Check(fmt.Sprintf("sparse_attention %s %dx%dx%d", tag, n, H, D), o, 2e-3)
			p.cpu("write window", p.C.WriteWindow(kv.C, layer, kvr.C, bt))
			p.gpu("write window", func() error { return p.G.WriteWindow(kv.G, layer, kvr.G, bt) })
			p.takeDur() // no row of its own: the next step's attention reads the window
			for _, t := range p.allocs[keep:] {
				p.G.Free(t)
			}
			p.allocs = p.allocs[:keep]
		}
		for i := range starts {
			starts[i] += st[i]
		}
	}
}

// RoundEntries rounds rows of v to the compact entry format (encode, decode), in place.
func RoundEntries(p *Pair, f kvcache.EntryFormat, v []float32) []float32 {
	b := make([]byte, f.Bytes())
	for r := 0; r < len(v); r += f.Dim() {
		p.Must(f.Encode(b, v[r:r+f.Dim()]))
		p.Must(f.Decode(v[r:r+f.Dim()], b))
	}
	return v
}

func checkRouter(p *Pair, d OpDims, _ *embedTable) {
	E, K := d.Experts, d.TopK
	cg, gg := p.prep(RandLinear(p.Rng, checkpoint.FormatBF16, E, d.Dim))
	// Bias from few values: zero input rows give equal scores, so ties must
	// break to the lower index.
	bias := make([]float32, E)
	for i := range bias {
		bias[i] = float32(p.Rng.IntN(3)) * 0.25
	}
	cb, gb := p.vec(bias)
	vocab := d.HashRows
	tab := make([]int64, vocab*K)
	for i := range tab {
		tab[i] = int64(p.Rng.IntN(E))
	}
	ct, err := p.C.PrepareIDTable("tid2eid", I64Table(tab, vocab, K), vocab, K)
	p.Must(err)
	gt, err := p.G.PrepareIDTable("tid2eid", I64Table(tab, vocab, K), vocab, K)
	p.Must(err)
	for _, n := range d.Tokens {
		x := p.Rand(n, d.Dim, 1)
		for r := 1; r < n; r += 3 {
			clear(x.Host[r*d.Dim : (r+1)*d.Dim])
		}
		x = p.From(n, d.Dim, x.Host)
		tok := make([]int32, n)
		for i := range tok {
			tok[i] = int32(p.Rng.IntN(vocab))
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
			w, id := p.Out(n, K), p.OutI32(n, K)
			p.cpu("router", p.C.Router(x.C, cg, ca, w.C, id.C))
			p.gpu("router", func() error { return p.G.Router(x.G, gg, ga, w.G, id.G) })
			if diff := p.CheckIDsTol("router ids "+tag, id, allow); diff > 0 {
				p.excludeFlips(id, w, K)
			}
			p.Check("router weights "+tag, w, 1e-5)
		}
	}
}

// excludeFlips copies the GPU's weights into the CPU's for rows whose ids
// differ, so the weight check covers the rows that routed alike.
func (p *Pair) excludeFlips(id, w Twin, K int) {
	want := id.C.(*cpu.Tensor).I
	got := make([]int32, len(want))
	p.Must(p.G.DownloadI32(id.G, got))
	gw := make([]float32, len(want))
	p.Must(p.G.Download(w.G, gw))
	cw := w.C.(*cpu.Tensor).F
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
func checkExperts(p *Pair, d OpDims, _ *embedTable) {
	E := min(d.ExpertSample, d.Experts)
	if E < d.TopK+2 {
		p.t.Fatalf("experts: %d sampled experts for top-%d", E, d.TopK)
	}
	lim := 2e-2 // FP8 activations, bf16 outputs
	if p.C.Numerics() == backend.Exact {
		lim = 1e-4 // fp32 throughout; only the summation order differs
	}
	for _, f := range []checkpoint.Format{checkpoint.FormatMXFP4, checkpoint.FormatNVFP4} {
		ex := RandExperts(p, f, E, d.Dim, d.Inter)
		ce, err := p.C.PrepareExperts("moe", ex, d.Dim, d.Inter)
		p.Must(err)
		ge, err := p.G.PrepareExperts("moe", ex, d.Dim, d.Inter)
		p.Must(err)
		for _, n := range d.BigTokens {
			idv, wv := Routing(p, n, E, d.TopK)
			ids, w := p.IDs(n, d.TopK, idv), p.From(n, d.TopK, wv)
			x := p.Rand(n, d.Dim, 1)
			a := backend.ExpertsArgs{Limit: d.SwigluLimit}
			acc := p.Out(n, d.Dim)
			p.cpu("experts", p.C.Experts(x.C, ce, w.C, ids.C, a, acc.C))
			p.gpu("experts", func() error { return p.G.Experts(x.G, ge, w.G, ids.G, a, acc.G) })
			p.Check(fmt.Sprintf("experts %v %d(of %d) experts K=%d n=%d %dx%d", f, E, d.Experts, d.TopK, n, d.Dim, d.Inter), acc, lim)
			sh, o := p.Rand(n, d.Dim, 1), p.Out(n, d.Dim)
			p.cpu("experts combine", p.C.ExpertsCombine(x.C, ce, w.C, ids.C, a, sh.C, o.C))
			p.gpu("experts combine", func() error { return p.G.ExpertsCombine(x.G, ge, w.G, ids.G, a, sh.G, o.G) })
			p.Check(fmt.Sprintf("experts_combine %v K=%d n=%d %dx%d", f, d.TopK, n, d.Dim, d.Inter), o, lim)
			// The block's MoE as the model runs it: the combine, then the ffn
			// site's hc post of its output into the streams.
			hs, mix, o2 := p.Rand(n, d.HcMult*d.Dim, 1), p.Rand(n, d.HcMult+d.HcMult*d.HcMult, 0.5), p.Out(n, d.Dim)
			h := p.hcArgs(d)
			p.cpu("experts combine post", p.C.ExpertsCombinePost(x.C, ce, w.C, ids.C, a, sh.C, o2.C, hs.C, mix.C, h))
			p.gpu("experts combine post", func() error { return p.G.ExpertsCombinePost(x.G, ge, w.G, ids.G, a, sh.G, o2.G, hs.G, mix.G, h) })
			tag := fmt.Sprintf("%v K=%d n=%d %dx%d streams %d", f, d.TopK, n, d.Dim, d.Inter, d.HcMult)
			p.Check("experts_combine_post "+tag, o2, lim)
			p.Check("experts_combine_post hc_post "+tag, hs, lim)
		}
		p.Release()
	}
}

// checkEpilogues runs the attention's q and kv epilogues as the model does
// (fused where the backend offers them) against the CPU's separate ops.
func checkEpilogues(p *Pair, d OpDims, _ *embedTable) {
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.Must(err)
	a := backend.RopeArgs{Freqs: fr, HeadDim: d.HeadDim}
	cw, gw := p.NormWeights(d.HeadDim)
	nope := d.HeadDim - d.RopeDim
	kvLim := 2e-3
	if p.C.Numerics() == backend.Faithful {
		kvLim = 2e-2 // a bf16 step of the norm can move an FP8 value a whole e4m3 step
	}
	for _, rows := range d.Tokens {
		bt := ropeBatch(max(rows, 2))
		n := bt.Rows()
		q := p.Rand(n, d.Heads*d.HeadDim, 1)
		p.cpu("q epilogue", p.C.HeadNormRope(q.C, d.NormEps, a, bt))
		p.gpu("q epilogue", func() error { return p.G.HeadNormRope(q.G, d.NormEps, a, bt) })
		p.Check(fmt.Sprintf("head_norm_rope q %dx%dx%d", n, d.Heads, d.HeadDim), q, 2e-3)
		x, o := p.Rand(n, d.HeadDim, 1), p.Out(n, d.HeadDim)
		p.cpu("kv epilogue", p.C.NormRopeKVQuant(x.C, cw, d.NormEps, a, nope, 64, bt, o.C))
		p.gpu("kv epilogue", func() error { return p.G.NormRopeKVQuant(x.G, gw, d.NormEps, a, nope, 64, bt, o.G) })
		p.Check(fmt.Sprintf("rmsnorm_rope_kvq kv %dx%d nope=%d", n, d.HeadDim, nope), o, kvLim)
	}
}
