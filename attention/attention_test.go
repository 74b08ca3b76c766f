package attention

import (
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
)

func TestPrepare(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	be := cpu.New(cpu.Options{Threads: 1})
	for i, want := range []struct{ comp, idx bool }{{false, false}, {true, true}, {true, false}, {true, true}} {
		l, err := Prepare(be, c, &w.Layers[i])
		if err != nil {
			t.Fatal(err)
		}
		if (l.Comp != nil) != want.comp || (l.Idx != nil) != want.idx {
			t.Errorf("layer %d: compressor %v indexer %v", i, l.Comp != nil, l.Idx != nil)
		}
		if (l.Rope.YaRN) != (c.Ratio(i) != 0) || l.Rope.Low != map[bool]int{true: 15, false: 0}[c.Ratio(i) != 0] {
			t.Errorf("layer %d: rope table yarn=%v low=%d", i, l.Rope.YaRN, l.Rope.Low)
		}
	}
	bad := *c
	bad.Heads = 4 // wq_b no longer matches
	if _, err := Prepare(be, &bad, &w.Layers[0]); err == nil {
		t.Error("mismatched heads accepted")
	}
	l3 := w.Layers[3]
	l3.Attn.Indexer = nil
	if _, err := Prepare(be, c, &l3); err == nil {
		t.Error("CSA layer without indexer accepted")
	}
}

// TestForwardShapes runs one CSA attention layer for two sequences and checks
// the output shape and that the layer wrote its window.
func TestForwardShapes(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	be := cpu.New(cpu.Options{Threads: 2})
	l, err := Prepare(be, c, &w.Layers[1])
	if err != nil {
		t.Fatal(err)
	}
	st, err := be.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 2, Layers: []backend.LayerKV{{}, {Window: 16, HeadDim: 128, Ratio: 4, IndexDim: 64}}})
	if err == nil {
		t.Fatal("zero window accepted")
	}
	st, err = be.NewKVStore(backend.KVSpec{BlockTokens: 256, MaxBlocks: 2, MaxSlots: 2, Layers: []backend.LayerKV{{Window: 16, HeadDim: 128}, {Window: 16, HeadDim: 128, Ratio: 4, IndexDim: 64}}})
	if err != nil {
		t.Fatal(err)
	}
	be.ResetSlot(st, 0)
	be.ResetSlot(st, 1)
	b := &backend.Batch{Seqs: []backend.SeqInfo{{Slot: 0, Blocks: []int32{0}, Start: 0, Row0: 0, Rows: 9}, {Slot: 1, Blocks: []int32{1}, Start: 0, Row0: 9, Rows: 3}}}
	for s, n := range []int{9, 3} {
		for i := range n {
			b.Pos = append(b.Pos, int32(i))
			b.Seq = append(b.Seq, int32(s))
		}
	}
	a := be.Alloc(12, c.Dim, backend.F32)
	v := make([]float32, 12*c.Dim)
	for i := range v {
		v[i] = float32(i%7) - 3
	}
	be.Upload(a, v)
	out, err := l.Forward(be, st, a, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if out.Rows() != 12 || out.Cols() != c.Dim {
		t.Fatalf("output %dx%d", out.Rows(), out.Cols())
	}
	if s := be.Stats(out); s.FirstBad >= 0 || s.AbsMax == 0 {
		t.Fatalf("output stats %+v", s)
	}
}

// genWeights draws the weights of c as the small-checkpoint generator does
// (checkpoint.GenWeights, official formats).
func genWeights(t testing.TB, c *checkpoint.Config, seed uint64) *checkpoint.Weights {
	t.Helper()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, seed)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
