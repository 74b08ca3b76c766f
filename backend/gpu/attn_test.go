package gpu

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/rope"
)

// TestKVStoreSteps runs compressor, indexer, sparse attention and window
// writes over a multi-step schedule (prefill chunks, then decode) on layers of
// ratio 0, 4 (with indexer) and 128, comparing every output with the CPU.
func TestKVStoreSteps(t *testing.T) {
	// Rows per sequence and step: prefill chunks, then decode; the second
	// sequence starts short (window padding with Start > 0) and crosses
	// position 128 in a decode step, the first inside a prefill chunk.
	steps := [][2]int{{37, 5}, {40, 32}, {60, 30}, {1, 1}, {1, 55}, {3, 1}, {1, 1}, {1, 2}, {1, 1}, {1, 1}}
	kvStoreSteps(t, 0, steps, steps)
}

// TestKVStoreRollback is TestKVStoreSteps with positional rollback on a
// store with slack 3: after prefill, steps of the last token and 3 drafts
// per sequence commit 1 to 4 rows (the rest stay written in rings and
// blocks; nothing is copied, committed rows are not fed again), across
// window wraps and the entries of ratio 4 and 128. The CPU's rollback is
// exact against a run without drafts (cpu.TestPositionalRollback).
func TestKVStoreRollback(t *testing.T) {
	steps := [][2]int{{60, 6}, {60, 1}}
	commit := [][2]int{{60, 6}, {60, 1}}
	for i := range 9 {
		steps = append(steps, [2]int{4, 4})
		commit = append(commit, [2]int{1 + i%4, 1 + (i+2)%4})
	}
	kvStoreSteps(t, 3, steps, commit)
}

// kvStoreSteps runs steps (rows per sequence) on a store with the slack,
// each advancing the sequences by commit's rows.
func kvStoreSteps(t *testing.T, slack int, steps, commit [][2]int) {
	const (
		D, RD, W, ID, IH, H, topK = 128, 64, 16, 64, 4, 8, 12
	)
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 8, MaxSlots: 2, Slack: slack, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D}, {Window: W, HeadDim: D, Ratio: 4, IndexDim: ID}, {Window: W, HeadDim: D, Ratio: 128}}}
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
				a := p.Rand(r, w, 0.5)
				pr.cm = cpu.NewMat(r, w, a.Host)
				pr.gm, err = p.G.NewMat(r, w, a.Host)
				must(t, err)
				nv := p.Rand(1, dc, 0.1)
				for i := range nv.Host {
					nv.Host[i] += 1
				}
				pr.cn = cpu.NewVec(nv.Host)
				pr.gn, err = p.G.NewVec(nv.Host)
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
			sinkH := p.Rand(1, H, 1).Host
			cs := cpu.NewVec(sinkH)
			gs, err := p.G.NewVec(sinkH)
			must(t, err)
			starts := []int{0, 0}
			for si, st := range steps {
				bt := opcheck.StepBatch(starts, st[:])
				n := bt.Rows()
				for layer, l := range spec.Layers {
					tag := fmt.Sprintf("step %d layer %d (ratio %d)", si, layer, l.Ratio)
					kvr := p.Rand(n, D, 1)
					q := p.Rand(n, H*D, 1)
					var sel opcheck.Twin
					if l.Ratio > 0 {
						c := coff(l.Ratio)
						cm, gm, cn, gn := prm[layer][0].cm, prm[layer][0].gm, prm[layer][0].cn, prm[layer][0].gn
						A, Z := p.Rand(n, c*D, 1), p.Rand(n, c*D, 1)
						ca := backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: D, APE: cm, Norm: cn, NormEps: 1e-6, Rope: fr}
						ga := ca
						ga.APE, ga.Norm = gm, gn
						must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
						must(t, p.G.Compress(kv.G, A.G, Z.G, ga, bt))
						if l.IndexDim > 0 {
							cm, gm, cn, gn := prm[layer][1].cm, prm[layer][1].gm, prm[layer][1].cn, prm[layer][1].gn
							A, Z := p.Rand(n, c*ID, 1), p.Rand(n, c*ID, 1)
							ca := backend.CompressArgs{Layer: layer, Kind: backend.CompressIndex, Ratio: l.Ratio, Dim: ID, APE: cm, Norm: cn, NormEps: 1e-6, Rope: fr}
							ga := ca
							ga.APE, ga.Norm = gm, gn
							must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
							must(t, p.G.Compress(kv.G, A.G, Z.G, ga, bt))
							iq, iw := p.Rand(n, IH*ID, 1), p.Rand(n, IH, 0.5)
							ia := backend.IndexerArgs{Layer: layer, Heads: IH, HeadDim: ID, TopK: topK, Ratio: l.Ratio, Trace: true}
							co := p.C.Alloc(n, topK, backend.I32)
							goT := p.G.Alloc(n, topK, backend.I32)
							must(t, p.G.Poison(goT))
							must(t, p.C.IndexerTopK(kv.C, iq.C, iw.C, ia, bt, co))
							must(t, p.G.IndexerTopK(kv.G, iq.G, iw.G, ia, bt, goT))
							want := co.(*cpu.Tensor).I
							got := make([]int32, len(want))
							must(t, p.G.DownloadI32(goT, got))
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
							sel.C = p.C.Alloc(n, topK, backend.I32)
							copy(sel.C.(*cpu.Tensor).I, ws)
							sel.G = p.G.Alloc(n, topK, backend.I32)
							must(t, p.G.UploadI32(sel.G.(*Tensor), ws))
						}
					}
					aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: W, Ratio: l.Ratio, Scale: 0.088, Sink: cs}
					ga := aa
					ga.Sink = gs
					o := p.Out(n, H*D)
					must(t, p.C.SparseAttention(kv.C, q.C, kvr.C, sel.C, aa, bt, o.C))
					must(t, p.G.SparseAttention(kv.G, q.G, kvr.G, sel.G, ga, bt, o.G))
					p.Check("attention "+tag, o, 2e-3)
					must(t, p.C.WriteWindow(kv.C, layer, kvr.C, bt))
					must(t, p.G.WriteWindow(kv.G, layer, kvr.G, bt))
				}
				for i := range starts {
					starts[i] += commit[si][i]
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
			sinkH := p.Rand(1, H, 1).Host
			cs := cpu.NewVec(sinkH)
			gs, err := p.G.NewVec(sinkH)
			must(t, err)
			// Two sequences: one past the window, one still filling it.
			starts := []int{0, 0}
			for si, rows := range [][]int{{W + 40, 9}, {1, 1}, {1, 1}, {1, 1}} {
				bt := opcheck.StepBatch(starts, rows)
				n := bt.Rows()
				kvr, q := p.Rand(n, D, 1), p.Rand(n, H*D, 1)
				if rows[0] == 1 {
					a := backend.AttnArgs{Heads: H, HeadDim: D, Window: W, Scale: 0.088, Sink: cs}
					ga := a
					ga.Sink = gs
					o := p.Out(n, H*D)
					must(t, p.C.SparseAttention(kv.C, q.C, kvr.C, nil, a, bt, o.C))
					must(t, p.G.SparseAttention(kv.G, q.G, kvr.G, nil, ga, bt, o.G))
					p.Check(fmt.Sprintf("attention step %d", si), o, 2e-3)
				}
				must(t, p.C.WriteWindow(kv.C, 0, kvr.C, bt))
				must(t, p.G.WriteWindow(kv.G, 0, kvr.G, bt))
				for i := range starts {
					starts[i] += rows[i]
				}
			}
		})
	}
}

// newKVTwin makes the CPU's and the GPU's store of spec, every slot reset.
func newKVTwin(t *testing.T, p *opcheck.Pair, spec backend.KVSpec) opcheck.KVTwin {
	t.Helper()
	var kv opcheck.KVTwin
	var err error
	kv.C, err = p.C.NewKVStore(spec)
	must(t, err)
	kv.G, err = p.G.NewKVStore(spec)
	must(t, err)
	for s := range spec.MaxSlots {
		must(t, p.C.ResetSlot(kv.C, s))
		must(t, p.G.ResetSlot(kv.G, s))
	}
	return kv
}
