package gpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/rope"
)

// TestAttnSplitPaths runs decode attention on every path against the CPU:
// one CTA per (row, head group), 8-CTA clusters (sm_90 devices) and the
// plain-grid splits with 1 to 64 CTAs per (row, head group), uneven and
// more splits than blocks among them, at batch 1, 3 and 8. The layers are
// window-only, CSA (150 selected entries with repeats, -1 and out of range:
// up to 5 key blocks) and HCA (window plus up to 2 entries: 3 blocks), with a
// sink per head and 12 heads (the second head group half empty); rows from
// position 5 (a window of one block) to 300. The stores: fp32 in both
// numerics and compact in faithful; the split with 8 CTAs must equal the
// cluster's output bit for bit.
func TestAttnSplitPaths(t *testing.T) {
	const D, RD, W, H, selCols = 128, 64, 128, 12, 150
	lens := []int{300, 40, 140, 129, 5, 70, 64, 20} // prefilled rows per sequence
	type setup struct {
		mode    backend.Numerics
		compact bool
	}
	setups := []setup{{backend.Faithful, false}, {backend.Faithful, true}, {backend.Exact, false}}
	paths := []cuda.KernelChoice{
		{}, {Attn: cuda.PathAttnRow}, {Attn: cuda.PathAttnCluster},
		{Attn: cuda.PathAttnSplit, AttnSplits: 1}, {Attn: cuda.PathAttnSplit, AttnSplits: 2},
		{Attn: cuda.PathAttnSplit, AttnSplits: 3}, {Attn: cuda.PathAttnSplit, AttnSplits: 8},
		{Attn: cuda.PathAttnSplit, AttnSplits: 64}, {Attn: cuda.PathAttnSplit},
	}
	batches := []int{1, 3, 8}
	if testing.Short() {
		setups, batches = setups[1:2], []int{3}
	}
	for _, su := range setups {
		t.Run(fmt.Sprintf("%v compact=%v", su.mode, su.compact), func(t *testing.T) {
			p := newPair(t, su.mode)
			g := p.G.(*Backend)
			t.Cleanup(func() { _ = g.Context().SetKernelChoice(cuda.KernelChoice{}) })
			clusters := g.Context().Device().Major >= 9
			spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 4 * len(lens), MaxSlots: len(lens), Compact: su.compact, Layers: []backend.LayerKV{
				{Window: W, HeadDim: D, RopeDim: RD}, {Window: W, HeadDim: D, RopeDim: RD, Ratio: 4}, {Window: W, HeadDim: D, RopeDim: RD, Ratio: 128}}}
			kv := newKVTwin(t, p, spec)
			fr, err := rope.New(RD, 10000, nil)
			must(t, err)
			// Prefill: the compressors' entries and the window rings.
			bt := opcheck.StepBatch(make([]int, len(lens)), lens)
			n := bt.Rows()
			for layer, l := range spec.Layers {
				if l.Ratio > 0 {
					c := coff(l.Ratio)
					ap := p.Rand(l.Ratio, c*D, 0.5)
					nv := p.Rand(1, D, 0.1)
					for i := range nv.Host {
						nv.Host[i] += 1
					}
					gm, err := g.NewMat(l.Ratio, c*D, ap.Host)
					must(t, err)
					gn, err := g.NewVec(nv.Host)
					must(t, err)
					A, Z := p.Rand(n, c*D, 1), p.Rand(n, c*D, 1)
					ca := backend.CompressArgs{Layer: layer, Kind: backend.CompressKV, Ratio: l.Ratio, Dim: D, APE: cpu.NewMat(l.Ratio, c*D, ap.Host), Norm: cpu.NewVec(nv.Host), NormEps: 1e-6, Rope: fr}
					ga := ca
					ga.APE, ga.Norm = gm, gn
					must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
					must(t, p.G.Compress(kv.G, A.G, Z.G, ga, bt))
				}
				kvr := p.Rand(n, D, 1)
				must(t, p.C.WriteWindow(kv.C, layer, kvr.C, bt))
				must(t, p.G.WriteWindow(kv.G, layer, kvr.G, bt))
			}
			sinkH := p.Rand(1, H, 1).Host
			gs, err := g.NewVec(sinkH)
			must(t, err)
			for _, b := range batches {
				dt := opcheck.StepBatch(lens[:b], ones(b))
				q, kvr := p.Rand(b, H*D, 1), p.Rand(b, D, 1)
				// The selection: entries below each row's (t+1)/4 with repeats, one -1 and one past the end.
				si := make([]int32, b*selCols)
				for r := range b {
					avail := (lens[r] + 1) / 4
					for j := range selCols {
						si[r*selCols+j] = int32(p.Rng.IntN(max(avail, 1)))
					}
					si[r*selCols], si[r*selCols+selCols-1] = -1, int32(avail+3)
				}
				sel := p.IDs(b, selCols, si)
				for layer, l := range spec.Layers {
					aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: W, Ratio: l.Ratio, Scale: 0.088, Sink: cpu.NewVec(sinkH)}
					ga := aa
					ga.Sink = gs
					var cs, gsl backend.Tensor
					if l.Ratio == 4 {
						cs, gsl = sel.C, sel.G
					}
					want := p.Out(b, H*D)
					must(t, p.C.SparseAttention(kv.C, q.C, kvr.C, cs, aa, dt, want.C))
					var split8, cluster []float32
					for _, kc := range paths {
						if kc.Attn == cuda.PathAttnCluster && !clusters {
							continue
						}
						must(t, g.Context().SetKernelChoice(kc))
						o := p.Out(b, H*D)
						o.C = want.C
						must(t, p.G.SparseAttention(kv.G, q.G, kvr.G, gsl, ga, dt, o.G))
						p.Check(fmt.Sprintf("batch %d ratio %d path %q splits %d", b, l.Ratio, kc.Attn, kc.AttnSplits), o, 2e-3)
						got := make([]float32, b*H*D)
						must(t, p.G.Download(o.G, got))
						switch {
						case kc.Attn == cuda.PathAttnCluster:
							cluster = got
						case kc.Attn == cuda.PathAttnSplit && kc.AttnSplits == 8:
							split8 = got
						}
					}
					if cluster != nil && split8 != nil {
						for i := range cluster {
							if math.Float32bits(cluster[i]) != math.Float32bits(split8[i]) {
								t.Errorf("batch %d ratio %d: 8 splits differ from the cluster at %d: %g vs %g", b, l.Ratio, i, split8[i], cluster[i])
								break
							}
						}
					}
				}
			}
		})
	}
}

func ones(n int) []int {
	v := make([]int, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// TestAttnSplitGraph: the split path captured in a CUDA graph (the
// faithful maxima, the splits and the last CTA's combine, its counters left
// at zero by every launch) replays the eager output bit for bit, three
// times; 3 splits of 2 key blocks leave one empty.
func TestAttnSplitGraph(t *testing.T) {
	const D, RD, W, H = 128, 64, 128, 12
	p := newPair(t, backend.Faithful)
	g := p.G.(*Backend)
	t.Cleanup(func() { _ = g.Context().SetKernelChoice(cuda.KernelChoice{}) })
	must(t, g.Context().SetKernelChoice(cuda.KernelChoice{Attn: cuda.PathAttnSplit, AttnSplits: 3}))
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 8, MaxSlots: 2, Compact: true, Layers: []backend.LayerKV{{Window: W, HeadDim: D, RopeDim: RD}}}
	kv := newKVTwin(t, p, spec)
	lens := []int{200, 150}
	bt := opcheck.StepBatch([]int{0, 0}, lens)
	must(t, p.G.WriteWindow(kv.G, 0, p.Rand(bt.Rows(), D, 1).G, bt))
	sink, err := g.NewVec(p.Rand(1, H, 1).Host)
	must(t, err)
	dt := opcheck.StepBatch(lens, ones(len(lens)))
	q, kn := p.Rand(len(lens), H*D, 1), p.Rand(len(lens), D, 1)
	a := backend.AttnArgs{Heads: H, HeadDim: D, Window: W, Scale: 0.088, Sink: sink}
	want, got := p.Out(len(lens), H*D), p.Out(len(lens), H*D)
	must(t, p.G.SparseAttention(kv.G, q.G, kn.G, nil, a, dt, want.G)) // eager: compiles, uploads the batch
	wv := make([]float32, len(lens)*H*D)
	must(t, p.G.Download(want.G, wv))
	s := g.Stream()
	must(t, s.BeginCapture())
	err = p.G.SparseAttention(kv.G, q.G, kn.G, nil, a, dt, got.G)
	gr, cerr := s.EndCapture()
	must(t, err)
	must(t, cerr)
	defer gr.Close()
	exec, err := gr.Instantiate()
	must(t, err)
	defer exec.Close()
	gv := make([]float32, len(wv))
	for rep := range 3 {
		must(t, g.Poison(got.G))
		must(t, exec.Launch(s))
		must(t, p.G.Download(got.G, gv))
		for i := range wv {
			if math.Float32bits(gv[i]) != math.Float32bits(wv[i]) {
				t.Fatalf("replay %d: output %d is %g, eager %g", rep, i, gv[i], wv[i])
			}
		}
	}
}
