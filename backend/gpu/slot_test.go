package gpu

import (
	"fmt"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/rope"
)

// TestCopySlotRestore snapshots a slot, runs a speculative step that wraps
// the window ring and completes (and rolls) a CSA compressor window, restores
// the snapshot and reruns the positions with other rows: the GPU matches the
// CPU, which holds the same snapshot semantics as the speculative decoder.
func TestCopySlotRestore(t *testing.T) {
	const D, RD, W, H, topK = 128, 64, 16, 8, 16
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D}, {Window: W, HeadDim: D, Ratio: 4}}}
	p := newPair(t, backend.Exact)
	fr, err := rope.New(RD, 10000, nil)
	must(t, err)
	kv := newKVTwin(t, p, spec)
	ape := p.Rand(4, 2*D, 0.5)
	nv := p.Rand(1, D, 0.1)
	for i := range nv.Host {
		nv.Host[i]++
	}
	gm, err := p.G.NewMat(4, 2*D, ape.Host)
	must(t, err)
	gn, err := p.G.NewVec(nv.Host)
	must(t, err)
	ca := backend.CompressArgs{Layer: 1, Kind: backend.CompressKV, Ratio: 4, Dim: D, APE: cpu.NewMat(4, 2*D, ape.Host), Norm: cpu.NewVec(nv.Host), NormEps: 1e-6, Rope: fr}
	ga := ca
	ga.APE, ga.Norm = gm, gn
	sinkH := p.Rand(1, H, 1).Host
	cs := cpu.NewVec(sinkH)
	gs, err := p.G.NewVec(sinkH)
	must(t, err)
	step := func(tag string, start, rows int, check bool) {
		bt := opcheck.StepBatchBlocks([]int{start}, []int{rows}, 1)
		for layer, l := range spec.Layers {
			kvr, q := p.Rand(rows, D, 1), p.Rand(rows, H*D, 1)
			var sel opcheck.Twin
			if l.Ratio > 0 {
				A, Z := p.Rand(rows, 2*D, 1), p.Rand(rows, 2*D, 1)
				must(t, p.C.Compress(kv.C, A.C, Z.C, ca, bt))
				must(t, p.G.Compress(kv.G, A.G, Z.G, ga, bt))
				ids := make([]int32, rows*topK)
				for i := range ids {
					ids[i] = int32(i % topK) // every entry; those not yet complete are skipped
				}
				sel.C = p.C.Alloc(rows, topK, backend.I32)
				copy(sel.C.(*cpu.Tensor).I, ids)
				sel.G = p.G.Alloc(rows, topK, backend.I32)
				must(t, p.G.UploadI32(sel.G.(*Tensor), ids))
			}
			aa := backend.AttnArgs{Layer: layer, Heads: H, HeadDim: D, Window: W, Ratio: l.Ratio, Scale: 0.088, Sink: cs}
			gaa := aa
			gaa.Sink = gs
			o := p.Out(rows, H*D)
			must(t, p.C.SparseAttention(kv.C, q.C, kvr.C, sel.C, aa, bt, o.C))
			must(t, p.G.SparseAttention(kv.G, q.G, kvr.G, sel.G, gaa, bt, o.G))
			if check {
				p.Check(fmt.Sprintf("%s layer %d", tag, layer), o, 2e-3)
			}
			must(t, p.C.WriteWindow(kv.C, layer, kvr.C, bt))
			must(t, p.G.WriteWindow(kv.G, layer, kvr.G, bt))
		}
	}
	copySlot := func(a backend.SlotCopy) {
		must(t, p.C.CopySlot(kv.C, a))
		must(t, p.G.CopySlot(kv.G, a))
	}
	step("prefill", 0, 30, true)
	copySlot(backend.SlotCopy{Dst: 1, Src: 0, From: 0, To: 2})
	step("speculative", 30, 5, false) // completes entry 7 at position 31 and rolls
	copySlot(backend.SlotCopy{Dst: 0, Src: 1, From: 0, To: 2})
	step("rerun", 30, 4, true)
	step("decode", 34, 1, true)
}
