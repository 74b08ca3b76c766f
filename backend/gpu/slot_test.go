package gpu

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/backend/gpu/opcheck"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/rope"
)

// TestCopySlotRestore snapshots a slot, runs a speculative step that wraps
// the window ring and completes (and rolls) a CSA compressor window, restores
// the snapshot and reruns the positions with other rows: the GPU matches the
// CPU, which holds the same snapshot semantics as the speculative decoder;
// for the fp32 store (exact) and the compact one (faithful).
func TestCopySlotRestore(t *testing.T) {
	for _, compact := range []bool{false, true} {
		t.Run(fmt.Sprintf("compact=%v", compact), func(t *testing.T) { copySlotRestore(t, compact) })
	}
}

func copySlotRestore(t *testing.T, compact bool) {
	const D, RD, W, H, topK = 128, 64, 16, 8, 16
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 2, Compact: compact, Layers: []backend.LayerKV{
		{Window: W, HeadDim: D, RopeDim: RD}, {Window: W, HeadDim: D, RopeDim: RD, Ratio: 4}}}
	num := backend.Exact
	if compact {
		num = backend.Faithful
	}
	p := newPair(t, num)
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
	// The snapshot in parts, as a speculative step takes it.
	copySlot(backend.SlotCopy{Dst: 1, Src: 0, From: 0, To: 2, Part: backend.SlotWindow})
	copySlot(backend.SlotCopy{Dst: 1, Src: 0, From: 1, To: 2, Part: backend.SlotComp})
	step("speculative", 30, 5, false) // completes entry 7 at position 31 and rolls
	copySlot(backend.SlotCopy{Dst: 0, Src: 1, From: 0, To: 2})
	step("rerun", 30, 4, true)
	step("decode", 34, 1, true)
}

// TestSpeculativeRollbackOnGPU runs the small model on the GPU as the
// speculative decoder does (the last token and drafts of which a random
// number are right, the sequence rewound to them; window wraps and CSA/HCA
// entries inside the drafts): the rows conditioned on right tokens, and
// decoding afterwards, match plain decoding on the GPU.
func TestSpeculativeRollbackOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	const n, pre, k = 150, 20, 4
	dir := filepath.Join(t.TempDir(), "small")
	w, st, err := checkpoint.GenerateLoad(dir, checkpoint.GenSpec{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := model.New(w, g, model.Options{CacheBytes: 64 << 20, Numerics: "exact", Drafts: k})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 7))
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(r.IntN(w.Config.Vocab))
	}
	ref := forced(t, m, toks[:pre], pre, toks[pre:])
	check := func(what string, pos int, got []float32) {
		t.Helper()
		if d := worstRow(ref[pos], got, 1); d > 1e-3 {
			t.Fatalf("%s at position %d: rel %.3g from plain decoding", what, pos, d)
		}
	}
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	prefill(t, m, s, toks[:pre], pre)
	kept := pre // cached tokens; the next one is known, not yet fed
	for kept+1+k < n-5 {
		a := r.IntN(k + 1)
		in := append([]int32(nil), toks[kept:kept+1+k]...)
		for j := 1 + a; j < len(in); j++ {
			in[j] = (in[j] + int32(1+r.IntN(50))) % int32(w.Config.Vocab)
		}
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: in, AllLogits: true}}})
		must(t, err)
		for j := range 1 + a {
			check("verify row", kept+j, o.Rows(0)[j])
		}
		kept += 1 + a
		must(t, m.Rewind(s, kept))
		m.Cache().Shrink(s, kept+1)
	}
	for L := kept; L < n; L++ {
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[L : L+1]}}})
		must(t, err)
		check("decode after speculation", L, o.Last(0))
	}
}
