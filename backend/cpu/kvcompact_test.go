package cpu

import (
	"math"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/rope"
)

// storeRun is what one run of the cache ops produced on a store.
type storeRun struct {
	store *kvStore
	attn  [][]float32 // per step and layer
	sel   [][]int32   // per step (the CSA layer)
}

// Two sequences of different lengths in one batch per step: prefill chunks
// that fill several blocks of 256 and wrap the window, then decode steps.
var compactChunks = [][2]int{{300, 7}, {1, 250}, {40, 1}, {180, 300}, {1, 1}, {1, 1}}

const (
	cD, cRope, cH, cW     = 192, 64, 2, 16
	cDi, cHi, cTopK, cBlk = 128, 2, 8, 256
)

func compactSpec(compact bool) backend.KVSpec {
	return backend.KVSpec{BlockTokens: cBlk, MaxBlocks: 6, MaxSlots: 2, Compact: compact, Layers: []backend.LayerKV{
		{Window: cW, HeadDim: cD, RopeDim: cRope, Ratio: 4, IndexDim: cDi},
		{Window: cW, HeadDim: cD, RopeDim: cRope, Ratio: 128},
		{Window: cW, HeadDim: cD, RopeDim: cRope},
	}}
}

// runCacheOps runs Compress, IndexerTopK, SparseAttention and WriteWindow as
// the attention sub-layer does, on inputs drawn from one seed.
func runCacheOps(t *testing.T, mode backend.Numerics, compact bool) storeRun {
	t.Helper()
	b := newB(mode)
	s, err := b.NewKVStore(compactSpec(compact))
	if err != nil {
		t.Fatal(err)
	}
	for slot := range 2 {
		if err := b.ResetSlot(s, slot); err != nil {
			t.Fatal(err)
		}
	}
	f, err := rope.New(cRope, 160000, &rope.YaRN{Factor: 16, OriginalLen: 65536, BetaFast: 32, BetaSlow: 1})
	if err != nil {
		t.Fatal(err)
	}
	rg := rnd(31)
	compArgs := func(layer, ratio, dim int, kind backend.CompressKind) backend.CompressArgs {
		w := coff(ratio) * dim
		norm := randVec(rg, dim, 0.3, true)
		for i := range norm {
			norm[i]++
		}
		return backend.CompressArgs{Layer: layer, Kind: kind, Ratio: ratio, Dim: dim, APE: NewMat(ratio, w, randVec(rg, ratio*w, 1, true)),
			Norm: NewVec(norm), NormEps: 1e-6, Rope: f}
	}
	comps := []backend.CompressArgs{compArgs(0, 4, cD, backend.CompressKV), compArgs(0, 4, cDi, backend.CompressIndex), compArgs(1, 128, cD, backend.CompressKV)}
	sink := NewVec([]float32{0.3, -0.5})
	run := storeRun{store: s.(*kvStore)}
	blocks := [][]int32{{0, 1, 2}, {3, 4, 5}}
	var start [2]int
	for _, ch := range compactChunks {
		bt := &backend.Batch{}
		for si, rows := range ch {
			bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: si, Blocks: blocks[si], Start: start[si], Row0: len(bt.Pos), Rows: rows})
			for i := range rows {
				bt.Pos = append(bt.Pos, int32(start[si]+i))
				bt.Seq = append(bt.Seq, int32(si))
			}
			start[si] += rows
		}
		n := bt.Rows()
		for _, a := range comps {
			w := coff(a.Ratio) * a.Dim
			A, Z := NewTensor(n, w, randVec(rg, n*w, 1, false)), NewTensor(n, w, randVec(rg, n*w, 2, false))
			if err := b.Compress(s, A, Z, a, bt); err != nil {
				t.Fatal(err)
			}
		}
		qi := NewTensor(n, cHi*cDi, randVec(rg, n*cHi*cDi, 1, mode == backend.Faithful))
		wi := NewTensor(n, cHi, randVec(rg, n*cHi, 0.5, false))
		sel := b.Alloc(n, cTopK, backend.I32).(*Tensor)
		if err := b.IndexerTopK(s, qi, wi, backend.IndexerArgs{Layer: 0, Heads: cHi, HeadDim: cDi, TopK: cTopK, Ratio: 4}, bt, sel); err != nil {
			t.Fatal(err)
		}
		run.sel = append(run.sel, sel.I)
		for layer, ratio := range []int{4, 128, 0} {
			// kv rows as NormRopeKVQuant leaves them: bf16, nope dims FP8-simulated (faithful).
			kv := NewTensor(n, cD, randVec(rg, n*cD, 1, mode == backend.Faithful))
			if err := b.KVQuant(kv, cD-cRope, 64); err != nil {
				t.Fatal(err)
			}
			q := NewTensor(n, cH*cD, randVec(rg, n*cH*cD, 1, false))
			out := b.Alloc(n, cH*cD, backend.F32).(*Tensor)
			var st backend.Tensor
			if ratio == 4 {
				st = sel
			}
			a := backend.AttnArgs{Layer: layer, Heads: cH, HeadDim: cD, Window: cW, Ratio: ratio, Scale: float32(1 / math.Sqrt(cD)), Sink: sink}
			if err := b.SparseAttention(s, q, kv, st, a, bt, out); err != nil {
				t.Fatal(err)
			}
			if err := b.WriteWindow(s, layer, kv, bt); err != nil {
				t.Fatal(err)
			}
			run.attn = append(run.attn, out.F)
		}
	}
	return run
}

// storedValues returns every stored value of both sequences (ring slots,
// entries, index keys), each entry as the op that reads it sees it.
func storedValues(t *testing.T, k *kvStore) [][]float32 {
	t.Helper()
	var out [][]float32
	blocks := [][]int32{{0, 1, 2}, {3, 4, 5}}
	for si, bl := range blocks {
		sq := &backend.SeqInfo{Slot: si, Blocks: bl}
		for layer, l := range k.spec.Layers {
			for p := range l.Window {
				v, err := k.readRing(&k.slots[si].layers[layer], layer, p, make([]float32, l.HeadDim))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, v)
			}
			if l.Ratio == 0 {
				continue
			}
			for j := range len(bl) * cBlk / l.Ratio {
				v, err := k.readEntry(sq, layer, j, false, make([]float32, l.HeadDim))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, v)
				if l.IndexDim > 0 {
					if v, err = k.readEntry(sq, layer, j, true, make([]float32, l.IndexDim)); err != nil {
						t.Fatal(err)
					}
					out = append(out, v)
				}
			}
		}
	}
	return out
}

func firstDiff[T float32 | int32](a, b []T) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		x, y := float32(a[i]), float32(b[i])
		if math.Float32bits(x) != math.Float32bits(y) && (x == x || y == y) {
			return i
		}
	}
	return -1
}

// TestCompactStoreMatchesF32: in faithful numerics every op reading or
// writing a compact store gives the fp32 store's outputs bit for bit (the
// values are already rounded to the formats). In exact numerics the compact
// store holds the formats' rounding of what the fp32 store holds.
func TestCompactStoreMatchesF32(t *testing.T) {
	for _, mode := range []backend.Numerics{backend.Faithful, backend.Exact} {
		t.Run(mode.String(), func(t *testing.T) {
			f32, cmp := runCacheOps(t, mode, false), runCacheOps(t, mode, true)
			want, got := storedValues(t, f32.store), storedValues(t, cmp.store)
			ef, _ := kvcache.NewEntryFormat(cD, cRope)
			xf, _ := kvcache.NewIndexKeyFormat(cDi)
			for i := range want {
				w := want[i]
				if mode == backend.Exact { // what the formats make of the fp32 values
					w = roundTrip(t, ef, xf, w)
				}
				if d := firstDiff(got[i], w); d >= 0 {
					t.Fatalf("stored vector %d differs at %d: %g, want %g", i, d, got[i][d], w[d])
				}
			}
			if mode == backend.Exact {
				return
			}
			for i := range f32.sel {
				if d := firstDiff(cmp.sel[i], f32.sel[i]); d >= 0 {
					t.Fatalf("step %d: indexer selection differs at %d", i, d)
				}
			}
			for i := range f32.attn {
				if d := firstDiff(cmp.attn[i], f32.attn[i]); d >= 0 {
					t.Fatalf("step %d layer %d: attention output differs at %d: %g, want %g", i/3, i%3, d, cmp.attn[i][d], f32.attn[i][d])
				}
			}
		})
	}
}

func roundTrip(t *testing.T, ef kvcache.EntryFormat, xf kvcache.IndexKeyFormat, x []float32) []float32 {
	t.Helper()
	y := make([]float32, len(x))
	var err error
	if len(x) == ef.Dim() {
		buf := make([]byte, ef.Bytes())
		if err = ef.Encode(buf, x); err == nil {
			err = ef.Decode(y, buf)
		}
	} else {
		buf := make([]byte, xf.Bytes())
		if err = xf.Encode(buf, x); err == nil {
			err = xf.Decode(y, buf)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// TestCompactSpecErrors: a compact spec whose layers have no valid format is
// refused at NewKVStore.
func TestCompactSpecErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    backend.LayerKV
	}{
		{"rope dim = head dim", backend.LayerKV{Window: 4, HeadDim: 64, RopeDim: 64}},
		{"negative rope dim", backend.LayerKV{Window: 4, HeadDim: 64, RopeDim: -2}},
	} {
		_, err := newB(backend.Faithful).NewKVStore(backend.KVSpec{BlockTokens: 256, MaxSlots: 1, Compact: true, Layers: []backend.LayerKV{tc.l}})
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}
