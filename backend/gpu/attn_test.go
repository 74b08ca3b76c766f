package gpu

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/rope"
)

// TestKVStoreSteps runs compressor, indexer, sparse attention and window
// writes over a multi-step schedule (prefill chunks, then decode) on layers of
// ratio 0, 4 (with indexer) and 128, comparing every output with the CPU.
func TestKVStoreSteps(t *testing.T) {
	const (
		D, RD, W, ID, IH, H, topK = 128, 64, 16, 64, 4, 8, 12
	)
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 8, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D}, {Window: W, HeadDim: D, Ratio: 4, IndexDim: ID}, {Window: W, HeadDim: D, Ratio: 128}}}
	// Rows per sequence and step: prefill chunks, then decode; the second
	// sequence starts short (window padding with Start > 0) and crosses
	// position 128 in a decode step, the first inside a prefill chunk.
	steps := [][2]int{{37, 5}, {40, 32}, {60, 30}, {1, 1}, {1, 55}, {3, 1}, {1, 1}, {1, 2}, {1, 1}, {1, 1}}
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t, mode)
			fr, err := rope.New(RD, 10000, nil)
			must(t, err)
			kv := newKVTwin(t, p, spec)
			type params struct {
				cm, gm backend.Mat
				cn, gn backend.Vec
			}
			mk := func(r, w, dc int) (pr params) {
				a := p.rand(r, w, 0.5)
				pr.cm = cpu.NewMat(r, w, a.host)
				pr.gm, err = p.g.NewMat(r, w, a.host)
				must(t, err)
				nv := p.rand(1, dc, 0.1)
				for i := range nv.host {
					nv.host[i] += 1
				}
				pr.cn = cpu.NewVec(nv.host)
				pr.gn, err = p.g.NewVec(nv.host)
				must(t, err)
				return
			}
			// Compressor parameters per layer: main [0], indexer [1].
			prm := make([][2]params, len(spec.Layers))
			for i, l := range spec.Layers {
				if l.Ratio > 0 {
					prm[i][0] = mk(l.Ratio, coff(l.Ratio)*D, D)
					if l.IndexDim > 0 {
						prm[i][1] = mk(l.Ratio, coff(l.Ratio)*ID, ID)
					}
				}
			}
			sinkH := p.rand(1, H, 1).host
			cs := cpu.NewVec(sinkH)
			gs, err := p.g.NewVec(sinkH)
			must(t, err)
			starts := []int{0, 0}
			for si, st := range steps {
				bt := stepBatch(starts, st[:])
				n := bt.Rows()
				for layer, l := range spec.Layers {
					tag := fmt.Sprintf("step %d layer %d (ratio %d)", si, layer, l.Ratio)
					kvr := p.rand(n, D, 1)
					q := p.rand(n, H*D, 1)
					var sel twin
					if l.Ratio > 0 {
						c := coff(l.Ratio)
						cm, gm, cn, gn := prm[layer][0].cm, prm[layer][0].gm, prm[layer][0].cn, prm[layer][0].gn
						A, Z := p.rand(n, c*D, 1), p.rand(n, c*D, 1)
						ca := backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: D, APE: cm, Norm: cn, NormEps: 1e-6, Rope: fr}
						ga := ca
						ga.APE, ga.Norm = gm, gn
						must(t, p.c.Compress(kv.c, A.c, Z.c, ca, bt))
						must(t, p.g.Compress(kv.g, A.g, Z.g, ga, bt))
						if l.IndexDim > 0 {
							cm, gm, cn, gn := prm[layer][1].cm, prm[layer][1].gm, prm[layer][1].cn, prm[layer][1].gn
							A, Z := p.rand(n, c*ID, 1), p.rand(n, c*ID, 1)
							ca := backend.CompressArgs{Layer: layer, Kind: backend.CompressIndex, Ratio: l.Ratio, Dim: ID, APE: cm, Norm: cn, NormEps: 1e-6, Rope: fr}
							ga := ca
							ga.APE, ga.Norm = gm, gn
							must(t, p.c.Compress(kv.c, A.c, Z.c, ca, bt))
							must(t, p.g.Compress(kv.g, A.g, Z.g, ga, bt))
							iq, iw := p.rand(n, IH*ID, 1), p.rand(n, IH, 0.5)
							ia := backend.IndexerArgs{Layer: layer, Heads: IH, HeadDim: ID, TopK: topK, Ratio: l.Ratio, Trace: true}
							co := p.c.Alloc(n, topK, backend.I32)
							goT := p.g.Alloc(n, topK, backend.I32)
							must(t, p.g.Poison(goT))
							must(t, p.c.IndexerTopK(kv.c, iq.c, iw.c, ia, bt, co))
							must(t, p.g.IndexerTopK(kv.g, iq.g, iw.g, ia, bt, goT))
							want := co.(*cpu.Tensor).I
							got := make([]int32, len(want))
							must(t, p.g.DownloadI32(goT, got))
							diff := 0
							for i := range want {
								if want[i] != got[i] {
									diff++
								}
							}
							t.Logf("%s: indexer top-k %d/%d differ", tag, diff, len(want))
							// Summation order may flip near-ties; a wrong algorithm differs wholesale.
							if diff > len(want)/20 {
								t.Errorf("%s: indexer top-k: %d of %d indices differ\nwant %v\ngot  %v", tag, diff, len(want), want, got)
							}
							// Attention uses the CPU's selection on both sides (plus a -1 and an out-of-range entry).
							ws := append([]int32(nil), want...)
							ws[0], ws[len(ws)-1] = -1, 1<<20
							sel.c = p.c.Alloc(n, topK, backend.I32)
							copy(sel.c.(*cpu.Tensor).I, ws)
							sel.g = p.g.Alloc(n, topK, backend.I32)
							must(t, p.g.UploadI32(sel.g.(*Tensor), ws))
						}
					}
					aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: W, Ratio: l.Ratio, Scale: 0.088, Sink: cs}
					ga := aa
					ga.Sink = gs
					o := p.out(n, H*D)
					must(t, p.c.SparseAttention(kv.c, q.c, kvr.c, sel.c, aa, bt, o.c))
					must(t, p.g.SparseAttention(kv.g, q.g, kvr.g, sel.g, ga, bt, o.g))
					p.check("attention "+tag, o, 2e-3)
					must(t, p.c.WriteWindow(kv.c, layer, kvr.c, bt))
					must(t, p.g.WriteWindow(kv.g, layer, kvr.g, bt))
				}
				for i := range starts {
					starts[i] += st[i]
				}
			}
		})
	}
}

// TestAttnSmallWindows: decode rows over windows of two and four key blocks
// (128, 256), where most CTAs of the split kernel's 8-CTA cluster have no
// block, match the CPU; one sequence is past its window, one still filling it.
func TestAttnSmallWindows(t *testing.T) {
	const D, H = 128, 8
	for _, W := range []int{128, 256} {
		t.Run(fmt.Sprint("window ", W), func(t *testing.T) {
			p := newPair(t, backend.Faithful)
			spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 4, MaxSlots: 2, Layers: []backend.LayerKV{{Window: W, HeadDim: D}}}
			kv := newKVTwin(t, p, spec)
			sinkH := p.rand(1, H, 1).host
			cs := cpu.NewVec(sinkH)
			gs, err := p.g.NewVec(sinkH)
			must(t, err)
			// Two sequences: one past the window, one still filling it.
			starts := []int{0, 0}
			for si, rows := range [][]int{{W + 40, 9}, {1, 1}, {1, 1}, {1, 1}} {
				bt := stepBatch(starts, rows)
				n := bt.Rows()
				kvr, q := p.rand(n, D, 1), p.rand(n, H*D, 1)
				if rows[0] == 1 {
					a := backend.AttnArgs{Heads: H, HeadDim: D, Window: W, Scale: 0.088, Sink: cs}
					ga := a
					ga.Sink = gs
					o := p.out(n, H*D)
					must(t, p.c.SparseAttention(kv.c, q.c, kvr.c, nil, a, bt, o.c))
					must(t, p.g.SparseAttention(kv.g, q.g, kvr.g, nil, ga, bt, o.g))
					p.check(fmt.Sprintf("attention step %d", si), o, 2e-3)
				}
				must(t, p.c.WriteWindow(kv.c, 0, kvr.c, bt))
				must(t, p.g.WriteWindow(kv.g, 0, kvr.g, bt))
				for i := range starts {
					starts[i] += rows[i]
				}
			}
		})
	}
}

// newKVTwin makes the CPU's and the GPU's store of spec, every slot reset.
func newKVTwin(t *testing.T, p *pair, spec backend.KVSpec) kvTwin {
	t.Helper()
	var kv kvTwin
	var err error
	kv.c, err = p.c.NewKVStore(spec)
	must(t, err)
	kv.g, err = p.g.NewKVStore(spec)
	must(t, err)
	for s := range spec.MaxSlots {
		must(t, p.c.ResetSlot(kv.c, s))
		must(t, p.g.ResetSlot(kv.g, s))
	}
	return kv
}
