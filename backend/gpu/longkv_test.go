package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/rope"
)

// TestKVOpsAtMillion fills the cache of a CSA and an HCA layer (compressors
// only, fresh inputs every chunk) for one sequence up to position 1,048,511
// on both backends, then runs a 64-row step ending at position 1,048,575: the
// compressors, the indexer (262,144 candidate keys) and sparse attention on
// both layers. At the config's longest context the block ids and entry
// offsets are largest: the GPU must select the CPU's entries and attend alike,
// in the fp32 store (exact) and the compact one (faithful). About a minute of
// CPU time.
func TestKVOpsAtMillion(t *testing.T) {
	g := openLongGPU(t)
	for _, tc := range []struct {
		mode    backend.Numerics
		compact bool
	}{{backend.Exact, false}, {backend.Faithful, true}} {
		t.Run(tc.mode.String(), func(t *testing.T) { kvOpsAt(t, g, tc.mode, tc.compact, 1<<20) })
	}
}

// kvComp is one compressor's parameters on both backends.
type kvComp struct {
	layer, ratio, dim int
	kind              backend.CompressKind
	cm, gm            backend.Mat
	cn, gn            backend.Vec
}

// fastTwin uploads rows×cols bf16-rounded uniform values in [-scale, scale)
// (the Pair's normal draws cost too much over a million rows).
func fastTwin(p *opcheck.Pair, r *rand.Rand, rows, cols int, scale float32) opcheck.Twin {
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(int32(r.Uint32()>>16)-32768) * (scale / 32768)
	}
	return p.From(rows, cols, v)
}

func kvOpsAt(t *testing.T, g *Backend, mode backend.Numerics, compact bool, n int) {
	const blockTokens, chunk, last = 256, 1 << 16, 64
	c := checkpoint.SmallConfig()
	D, R, ID, IH, K, W, H := c.HeadDim, c.RopeDim, c.IndexHeadDim, c.IndexHeads, c.IndexTopK, c.Window, c.Heads
	nb := n / blockTokens
	spec := backend.KVSpec{BlockTokens: blockTokens, Compact: compact, MaxBlocks: nb, MaxSlots: 1, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D, RopeDim: R, Ratio: 4, IndexDim: ID}, {Window: W, HeadDim: D, RopeDim: R, Ratio: 128}}}
	cb := cpu.New(cpu.Options{})
	cb.SetNumerics(mode)
	g.SetNumerics(mode)
	p := opcheck.NewPair(t, cb, g, 7)
	r := rand.New(rand.NewPCG(7, 8))
	fr, err := rope.ForLayer(c, 4)
	p.Must(err)
	var kv opcheck.KVTwin
	kv.C, err = cb.NewKVStore(spec)
	p.Must(err)
	kv.G, err = g.NewKVStore(spec)
	p.Must(err)
	p.Must(cb.ResetSlot(kv.C, 0))
	p.Must(g.ResetSlot(kv.G, 0))
	var comps []kvComp
	for _, k := range []kvComp{{layer: 0, ratio: 4, dim: D}, {layer: 0, ratio: 4, dim: ID, kind: backend.CompressIndex}, {layer: 1, ratio: 128, dim: D}} {
		w := backend.CompressCoff(k.ratio) * k.dim
		ape := make([]float32, k.ratio*w)
		for i := range ape {
			ape[i] = float32(r.NormFloat64() * 0.5)
		}
		nv := make([]float32, k.dim)
		for i := range nv {
			nv[i] = 1 + float32(r.NormFloat64()*0.1)
		}
		k.cm = cpu.NewMat(k.ratio, w, ape)
		k.gm, err = g.NewMat(k.ratio, w, ape)
		p.Must(err)
		k.cn = cpu.NewVec(nv)
		k.gn, err = g.NewVec(nv)
		p.Must(err)
		comps = append(comps, k)
	}
	blocks := make([]int32, nb)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	batch := func(start, rows int) *backend.Batch {
		b := &backend.Batch{Seqs: []backend.SeqInfo{{Slot: 0, Blocks: blocks, Start: start, Rows: rows}}}
		for i := range rows {
			b.Pos = append(b.Pos, int32(start+i))
			b.Seq = append(b.Seq, 0)
		}
		return b
	}
	compress := func(bt *backend.Batch) {
		for _, k := range comps {
			w := backend.CompressCoff(k.ratio) * k.dim
			A, Z := fastTwin(p, r, bt.Rows(), w, 1), fastTwin(p, r, bt.Rows(), w, 1)
			a := backend.CompressArgs{Layer: k.layer, Kind: k.kind, Ratio: k.ratio, Dim: k.dim, NormEps: float32(c.NormEps), Rope: fr}
			ca, ga := a, a
			ca.APE, ca.Norm, ga.APE, ga.Norm = k.cm, k.cn, k.gm, k.gn
			p.Must(cb.Compress(kv.C, A.C, Z.C, ca, bt))
			p.Must(g.Compress(kv.G, A.G, Z.G, ga, bt))
		}
	}
	// kvRows are window rows as the model writes them: FP8 nope and bf16
	// rope values in faithful numerics, which the compact store keeps exactly.
	kvRows := func(rows int) opcheck.Twin {
		x := fastTwin(p, r, rows, D, 1)
		if mode == backend.Faithful {
			ct := cpu.NewTensor(rows, D, x.Host)
			p.Must(cb.KVQuant(ct, D-R, 64))
			x = p.From(rows, D, ct.F)
		}
		return x
	}
	for start := 0; start < n-last; start += chunk {
		rows := min(chunk, n-last-start)
		bt := batch(start, rows)
		compress(bt)
		if start+rows == n-last {
			for l := range spec.Layers {
				x := kvRows(rows)
				p.Must(cb.WriteWindow(kv.C, l, x.C, bt))
				p.Must(g.WriteWindow(kv.G, l, x.G, bt))
			}
		}
		p.Must(g.Sync())
		p.Release()
	}
	bt := batch(n-last, last)
	compress(bt)
	iq, iw := fastTwin(p, r, last, IH*ID, 1), fastTwin(p, r, last, IH, 0.5)
	ia := backend.IndexerArgs{Layer: 0, Heads: IH, HeadDim: ID, TopK: K, Ratio: 4}
	ids := p.OutI32(last, K)
	p.Must(cb.IndexerTopK(kv.C, iq.C, iw.C, ia, bt, ids.C))
	p.Must(g.IndexerTopK(kv.G, iq.G, iw.G, ia, bt, ids.G))
	p.CheckIDsTol(fmt.Sprintf("%v indexer top-%d of %d keys", mode, K, n/4), ids, 0.05)
	sel := p.IDs(last, K, ids.C.(*cpu.Tensor).I) // the CPU's selection on both sides
	csink := make([]float32, H)
	for i := range csink {
		csink[i] = float32(r.NormFloat64())
	}
	gsink, err := g.NewVec(csink)
	p.Must(err)
	for l, lk := range spec.Layers {
		q, x, o := fastTwin(p, r, last, H*D, 1), kvRows(last), p.Out(last, H*D)
		aa := backend.AttnArgs{Layer: l, Heads: H, HeadDim: D, Window: W, Ratio: lk.Ratio, Scale: float32(1 / math.Sqrt(float64(D))), Sink: cpu.NewVec(csink)}
		ga := aa
		ga.Sink = gsink
		p.Must(cb.SparseAttention(kv.C, q.C, x.C, sel.C, aa, bt, o.C))
		p.Must(g.SparseAttention(kv.G, q.G, x.G, sel.G, ga, bt, o.G))
		p.Check(fmt.Sprintf("%v sparse attention ratio %d at positions %d..%d", mode, lk.Ratio, n-last, n-1), o, 2e-3)
	}
	p.Release()
}
