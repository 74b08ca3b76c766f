package gpu

import (
	"fmt"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/rope"
)

// TestIndexerFP4VsCPU: the indexer on compact stores at the real head dim
// (128, a multiple of 16 heads: the tensor-core scores) with queries as the
// model hands them over (FP4-simulated per 32, bf16 weights) selects exactly
// the CPU's entries, prefill chunks and decode steps, index_topk below the
// available entries.
func TestIndexerFP4VsCPU(t *testing.T) {
	const ID, W, D, RD = 128, 16, 128, 64
	for _, c := range []struct{ heads, topK int }{{16, 12}, {32, 40}} {
		t.Run(fmt.Sprintf("heads%d_topk%d", c.heads, c.topK), func(t *testing.T) {
			if testing.Short() && c.heads > 16 {
				t.Skip("short: 16 heads only")
			}
			spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 8, MaxSlots: 2, Compact: true, Layers: []backend.LayerKV{
				{Window: W, HeadDim: D, RopeDim: RD, Ratio: 4, IndexDim: ID}}}
			p := newPair(t, backend.Faithful)
			fr, err := rope.New(RD, 10000, nil)
			must(t, err)
			kv := newKVTwin(t, p, spec)
			kf, err := kvcache.NewIndexKeyFormat(ID)
			must(t, err)
			a := p.Rand(4, 2*ID, 0.5)
			cm := cpu.NewMat(4, 2*ID, a.Host)
			gm, err := p.G.NewMat(4, 2*ID, a.Host)
			must(t, err)
			nv := p.Rand(1, ID, 0.1)
			for i := range nv.Host {
				nv.Host[i] += 1
			}
			cn := cpu.NewVec(nv.Host)
			gn, err := p.G.NewVec(nv.Host)
			must(t, err)
			starts := []int{0, 0}
			for si, st := range [][2]int{{120, 40}, {60, 30}, {1, 1}, {2, 1}} {
				bt := opcheck.StepBatch(starts, st[:])
				n := bt.Rows()
				A, Z := p.Rand(n, 2*ID, 1), p.Rand(n, 2*ID, 1)
				ca := backend.CompressArgs{Layer: 0, Kind: backend.CompressIndex, Ratio: 4, Dim: ID, APE: cm, Norm: cn, NormEps: 1e-6, Rope: fr}
				ga := ca
				ga.APE, ga.Norm = gm, gn
				must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
				must(t, p.G.Compress(kv.G, A.G, Z.G, ga, bt))
				// Queries FP4-simulated per head as the model's indexer q path
				// leaves them (the index keys' codec), weights bf16.
				qh := p.Rand(n, c.heads*ID, 1).Host
				buf := make([]byte, kf.Bytes())
				for h := 0; h < len(qh); h += ID {
					must(t, kf.Encode(buf, qh[h:h+ID]))
					must(t, kf.Decode(qh[h:h+ID], buf))
				}
				wh := p.Rand(n, c.heads, 0.5).Host
				for i := range wh {
					wh[i] = num.RoundBF16(wh[i])
				}
				iq, iw := p.From(n, c.heads*ID, qh), p.From(n, c.heads, wh)
				ia := backend.IndexerArgs{Layer: 0, Heads: c.heads, HeadDim: ID, TopK: c.topK, Ratio: 4}
				o := p.OutI32(n, c.topK)
				must(t, p.C.IndexerTopK(kv.C, iq.C, iw.C, ia, bt, o.C))
				must(t, p.G.IndexerTopK(kv.G, iq.G, iw.G, ia, bt, o.G))
				want, got := o.C.(*cpu.Tensor).I, make([]int32, n*c.topK)
				must(t, p.G.DownloadI32(o.G, got))
				if !slices.Equal(got, want) {
					t.Fatalf("step %d: GPU selection differs from the CPU's\ngot  %v\nwant %v", si, got, want)
				}
				for i := range starts {
					starts[i] += st[i]
				}
			}
		})
	}
}
