package gpu

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/backend"
)

// TestCopySlotMany checks the batched slot copies (one kernel per buffer for
// more than two copies of the same layers and part, as a step with drafts
// snapshots and restores its sequences) byte for byte: every destination
// slot gets its source's bytes of the copied buffers, every other byte stays.
func TestCopySlotMany(t *testing.T) {
	g := openGPU(t, Options{})
	spec := backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 8, Layers: []backend.LayerKV{
		{Window: 16, HeadDim: 128, RopeDim: 64}, {Window: 16, HeadDim: 128, RopeDim: 64, Ratio: 4, IndexDim: 64}}}
	st, err := g.NewKVStore(spec)
	must(t, err)
	for s := range spec.MaxSlots {
		must(t, g.ResetSlot(st, s))
	}
	k, err := g.store(st)
	must(t, err)
	var regions []slotRegion
	for l := range k.layers {
		regions = append(regions, k.slotRegions(l, backend.SlotAll)...)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func() [][]byte { // random bytes in every region; returns them
		var all [][]byte
		for _, r := range regions {
			b := make([]byte, r.bytes*spec.MaxSlots)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			must(t, g.s.CopyHtoD(r.buf.Ptr, b))
			all = append(all, b)
		}
		return all
	}
	read := func() [][]byte {
		var all [][]byte
		for _, r := range regions {
			b := make([]byte, r.bytes*spec.MaxSlots)
			must(t, g.s.CopyDtoH(b, r.buf.Ptr))
			all = append(all, b)
		}
		must(t, g.s.Synchronize())
		return all
	}
	for _, tc := range []struct {
		name string
		cs   []backend.SlotCopy
	}{
		{"whole", []backend.SlotCopy{{Dst: 4, Src: 0, To: 2}, {Dst: 5, Src: 1, To: 2}, {Dst: 6, Src: 3, To: 2}}},
		{"window of layer 1", []backend.SlotCopy{{Dst: 0, Src: 7, From: 1, To: 2, Part: backend.SlotWindow},
			{Dst: 2, Src: 6, From: 1, To: 2, Part: backend.SlotWindow}, {Dst: 3, Src: 5, From: 1, To: 2, Part: backend.SlotWindow}}},
		{"indexer compressor and mixed", []backend.SlotCopy{{Dst: 1, Src: 0, From: 1, To: 2, Part: backend.SlotIndexComp},
			{Dst: 2, Src: 4, From: 1, To: 2, Part: backend.SlotIndexComp}, {Dst: 3, Src: 5, From: 1, To: 2, Part: backend.SlotIndexComp},
			{Dst: 7, Src: 6, From: 0, To: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := fill()
			for _, a := range tc.cs {
				for l := a.From; l < a.To; l++ {
					for _, r := range k.slotRegions(l, a.Part) {
						for i, rr := range regions {
							if rr.buf == r.buf {
								copy(want[i][a.Dst*r.bytes:(a.Dst+1)*r.bytes], want[i][a.Src*r.bytes:(a.Src+1)*r.bytes])
							}
						}
					}
				}
			}
			must(t, g.CopySlot(st, tc.cs...))
			got := read()
			for i := range regions {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("region %d (%d bytes a slot): %s", i, regions[i].bytes, firstDiff(got[i], want[i], regions[i].bytes))
				}
			}
		})
	}
	// Copies that are not independent are refused.
	if err := g.CopySlot(st, backend.SlotCopy{Dst: 1, Src: 0, To: 2}, backend.SlotCopy{Dst: 2, Src: 1, To: 2}); err == nil {
		t.Error("a slot both written and read by one call was accepted")
	}
}

// firstDiff names the slot and byte of the first difference.
func firstDiff(got, want []byte, per int) string {
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("slot %d byte %d: got %d, want %d", i/per, i%per, got[i], want[i])
		}
	}
	return "equal"
}
