package opcheck

import (
	"fmt"
	"math"
	"slices"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/rope"
)

// checkCopySlot is the prefix cache's snapshot and restore: slot 0 fills one
// block, CopySlot copies it to slot 1, then both continue with the same rows
// in one batch (slot 1 in a block of its own, sharing the full one). On each
// backend the two sequences' attention outputs must be identical, and the
// GPU's must match the CPU's.
func checkCopySlot(p *Pair, d OpDims, _ *embedTable) { checkCopy(p, d, 0) }

// checkCopyBlock is a hit on a partial block: slot 0 fills one block and
// `tail` rows of the next, which CopyBlock copies for slot 1 (copy-on-write)
// beside the CopySlot; both continue inside that block.
func checkCopyBlock(p *Pair, d OpDims, _ *embedTable) { checkCopy(p, d, 37) }

func checkCopy(p *Pair, d OpDims, tail int) {
	const blockTokens = 256
	D, H, ID := d.HeadDim, d.Heads, d.IndexHeadDim
	spec := backend.KVSpec{BlockTokens: blockTokens, MaxBlocks: 3, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: d.Window, HeadDim: D}, {Window: d.Window, HeadDim: D, Ratio: 4, IndexDim: ID}, {Window: d.Window, HeadDim: D, Ratio: 128}}}
	fr, err := rope.New(d.RopeDim, d.CompressTheta, d.YaRN)
	p.Must(err)
	var kv KVTwin
	kv.C, err = p.C.NewKVStore(spec)
	p.Must(err)
	kv.G, err = p.G.NewKVStore(spec)
	p.Must(err)
	p.Must(p.C.ResetSlot(kv.C, 0))
	p.Must(p.G.ResetSlot(kv.G, 0))
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
	keep := len(p.allocs)
	// dup repeats n random rows for each of seqs sequences.
	dup := func(seqs, n, w int) Twin {
		v := p.Rand(n, w, 1).Host
		var all []float32
		for range seqs {
			all = append(all, v...)
		}
		return p.From(seqs*n, w, all)
	}
	compress := func(layer int, l backend.LayerKV, bt *backend.Batch, seqs, n int) {
		for k, dim := range []int{D, l.IndexDim} {
			if dim == 0 {
				continue
			}
			w := coff(l.Ratio) * dim
			A, Z := dup(seqs, n, w), dup(seqs, n, w)
			a := backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: dim, NormEps: d.NormEps, Rope: fr}
			if k == 1 {
				a.Kind = backend.CompressIndex
			}
			ca, ga := a, a
			ca.APE, ca.Norm = prm[layer][k].cm, prm[layer][k].cn
			ga.APE, ga.Norm = prm[layer][k].gm, prm[layer][k].gn
			p.cpu("compress", p.C.Compress(kv.C, A.C, Z.C, ca, bt))
			p.gpu("compress", func() error { return p.G.Compress(kv.G, A.G, Z.G, ga, bt) })
		}
	}
	free := func() {
		for _, t := range p.allocs[keep:] {
			p.G.Free(t)
		}
		p.allocs = p.allocs[:keep]
	}
	fill := seqBatch([]backend.SeqInfo{{Slot: 0, Blocks: []int32{0, 1}, Rows: blockTokens + tail}})
	for layer, l := range spec.Layers {
		if l.Ratio > 0 {
			compress(layer, l, fill, 1, blockTokens+tail)
		}
		kvr := p.Rand(blockTokens+tail, D, 1)
		p.cpu("write window", p.C.WriteWindow(kv.C, layer, kvr.C, fill))
		p.gpu("write window", func() error { return p.G.WriteWindow(kv.G, layer, kvr.G, fill) })
		free()
	}
	p.cpu("copy slot", p.C.CopySlot(kv.C, backend.WholeSlot(kv.C, 0, 1)))
	p.gpu("copy slot", func() error { return p.G.CopySlot(kv.G, backend.WholeSlot(kv.G, 0, 1)) })
	if tail > 0 {
		p.cpu("copy block", p.C.CopyBlock(kv.C, 2, 1))
		p.gpu("copy block", func() error { return p.G.CopyBlock(kv.G, 2, 1) })
	}
	p.takeDur()
	start := blockTokens + tail
	for _, n := range []int{5, 1, 3} {
		bt := seqBatch([]backend.SeqInfo{
			{Slot: 0, Blocks: []int32{0, 1}, Start: start, Rows: n},
			{Slot: 1, Blocks: []int32{0, 2}, Start: start, Row0: n, Rows: n}})
		for layer, l := range spec.Layers {
			tag := fmt.Sprintf("copy %d rows at %d ratio %d", n, start, l.Ratio)
			if l.Ratio > 0 {
				compress(layer, l, bt, 2, n)
			}
			q, kvr := dup(2, n, H*D), dup(2, n, D)
			var sel Twin
			if l.Ratio == 4 {
				// The latest entries: those written after the copy among them.
				var ws []int32
				for range 2 {
					for i := range n {
						avail := (start + i + 1) / l.Ratio
						for j := range d.IndexTopK {
							ws = append(ws, int32(max(avail-1-j, -1)))
						}
					}
				}
				sel = p.IDs(2*n, d.IndexTopK, ws)
			}
			aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: d.Window, Ratio: l.Ratio, Scale: float32(1 / math.Sqrt(float64(D))), Sink: cs}
			ga := aa
			ga.Sink = gs
			o := p.Out(2*n, H*D)
			p.cpu("attention", p.C.SparseAttention(kv.C, q.C, kvr.C, sel.C, aa, bt, o.C))
			p.gpu("attention", func() error { return p.G.SparseAttention(kv.G, q.G, kvr.G, sel.G, ga, bt, o.G) })
			p.Check(tag, o, 2e-3)
			got := make([]float32, 2*n*H*D)
			p.Must(p.G.Download(o.G, got))
			for side, v := range map[string][]float32{"cpu": o.C.(*cpu.Tensor).F, "gpu": got} {
				if h := len(v) / 2; !slices.Equal(v[:h], v[h:]) {
					p.t.Errorf("%s %s: the copied slot's attention differs from the original's", tag, side)
				}
			}
			p.cpu("write window", p.C.WriteWindow(kv.C, layer, kvr.C, bt))
			p.gpu("write window", func() error { return p.G.WriteWindow(kv.G, layer, kvr.G, bt) })
			p.takeDur()
			free()
		}
		start += n
	}
}

// seqBatch fills in the row layout of seqs (Row0 and Rows set, Start set).
func seqBatch(seqs []backend.SeqInfo) *backend.Batch {
	bt := &backend.Batch{Seqs: seqs}
	for i, s := range seqs {
		for k := range s.Rows {
			bt.Pos = append(bt.Pos, int32(s.Start+k))
			bt.Seq = append(bt.Seq, int32(i))
		}
	}
	return bt
}
