package cpu

import (
	"reflect"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/rope"
)

type compressor struct {
	kind backend.CompressKind
	dim  int
}

// TestCopySlot: a slot copied at a block boundary continues exactly as the
// original: same state after the copy, same entries and same window after
// the same next rows (the prefix cache's snapshot and restore).
func TestCopySlot(t *testing.T) {
	f, _ := rope.New(16, 10000, nil)
	const dc, idim, bt = 32, 16, 256
	spec := backend.KVSpec{BlockTokens: bt, MaxBlocks: 3, MaxSlots: 2, Layers: []backend.LayerKV{
		{Window: 8, HeadDim: dc}, {Window: 8, HeadDim: dc, Ratio: 4, IndexDim: idim}, {Window: 8, HeadDim: dc, Ratio: 128}}}
	for _, tc := range []struct {
		num     backend.Numerics
		compact bool
	}{{backend.Exact, false}, {backend.Faithful, false}, {backend.Faithful, true}} {
		num := tc.num
		spec := spec
		spec.Compact = tc.compact
		for i := range spec.Layers {
			spec.Layers[i].RopeDim = 16
		}
		b := newB(num)
		st, err := b.NewKVStore(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.ResetSlot(st, 0); err != nil {
			t.Fatal(err)
		}
		// step runs every layer's cache writes for rows [start, start+n) of one slot.
		step := func(slot int, blocks []int32, start, n int, seed uint64) {
			t.Helper()
			r := rnd(seed)
			bat := seqBatch(slot, blocks, start, n)
			for li, l := range spec.Layers {
				if l.Ratio > 0 {
					kinds := []compressor{{backend.CompressKV, dc}}
					if l.IndexDim > 0 {
						kinds = append(kinds, compressor{backend.CompressIndex, idim})
					}
					for _, k := range kinds {
						w := coff(l.Ratio) * k.dim
						norm := randVec(rnd(4), k.dim, 0.1, false)
						a := backend.CompressArgs{Layer: li, Kind: k.kind, Ratio: l.Ratio, Dim: k.dim, NormEps: 1e-6, Rope: f,
							APE: NewMat(l.Ratio, w, randVec(rnd(3), l.Ratio*w, 1, false)), Norm: NewVec(norm)}
						A, Z := randVec(r, n*w, 1, false), randVec(r, n*w, 1, false)
						if err := b.Compress(st, NewTensor(n, w, A), NewTensor(n, w, Z), a, bat); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := b.WriteWindow(st, li, NewTensor(n, dc, randVec(r, n*dc, 1, false)), bat); err != nil {
					t.Fatal(err)
				}
			}
		}
		k := st.(*kvStore)
		step(0, []int32{0, 1}, 0, bt, 1) // one full block
		if err := b.CopySlot(st, backend.WholeSlot(st, 0, 1)); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(k.slots[0], k.slots[1]) {
			t.Fatalf("%v: the copy differs from its source", num)
		}
		// Both continue from the boundary with the same rows, in their own block.
		step(0, []int32{0, 1}, bt, 130, 2)
		step(1, []int32{0, 2}, bt, 130, 2)
		if !reflect.DeepEqual(k.slots[0], k.slots[1]) {
			t.Errorf("%v: the states differ after the same rows", num)
		}
		for li := range spec.Layers {
			b1, b2 := k.blocks[1].layers[li], k.blocks[2].layers[li]
			if !reflect.DeepEqual(b1, b2) {
				t.Errorf("%v: layer %d entries differ after the same rows", num, li)
			}
		}
	}
	b := newB(backend.Exact)
	st, _ := b.NewKVStore(spec)
	for _, tc := range []struct {
		src, dst int
		want     string
	}{{1, 0, "slot 1 not initialised"}, {0, 2, "slots 2 <- 0 of 2"}} {
		if err := b.CopySlot(st, backend.SlotCopy{Src: tc.src, Dst: tc.dst, To: len(st.Spec().Layers)}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("copy %d to %d: %v, want %q", tc.src, tc.dst, err, tc.want)
		}
	}
}

// BenchmarkCopySlot times a snapshot or restore of one sequence's state at
// the small and Flash shapes (fp32 store), the cost that replaces recomputing
// the window's tokens on a prefix cache hit.
func BenchmarkCopySlot(b *testing.B) {
	for _, preset := range []string{"small", "flash"} {
		b.Run(preset, func(b *testing.B) {
			c, err := checkpoint.PresetConfig(preset)
			if err != nil {
				b.Fatal(err)
			}
			l, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, kvcache.StoreF32)
			if err != nil {
				b.Fatal(err)
			}
			spec := backend.KVSpec{BlockTokens: l.BlockTokens, MaxSlots: 2, MaxBlocks: 1}
			for _, k := range l.Layers {
				spec.Layers = append(spec.Layers, backend.LayerKV{Window: k.Window, HeadDim: k.HeadDim, RopeDim: k.RopeDim, Ratio: k.Ratio, IndexDim: k.IndexDim})
			}
			be := newB(backend.Exact)
			st, err := be.NewKVStore(spec)
			if err != nil {
				b.Fatal(err)
			}
			for s := range 2 {
				if err := be.ResetSlot(st, s); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(l.StateBytes)
			for b.Loop() {
				if err := be.CopySlot(st, backend.WholeSlot(st, 0, 1)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
