package model

import (
	"math"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// TestFillCache: sequences filled to a depth past one fill chunk (its pooled
// and its tail path) decode from the state it wrote: finite logits that
// differ from a decode of the same token at depth 0 and between the two
// sequences, the same again for the same seed on a new model, and the
// sequence length and cache use of a prefill of that depth.
func TestFillCache(t *testing.T) {
	c := checkpoint.SmallConfig()
	n := fillChunk + 300 // 2,123 CSA entries for index_topk 4
	if testing.Short() {
		n = 700
	}
	w := genWeights(t, c, 3)
	tok := []int32{42}
	for _, mode := range []string{"faithful", "exact"} {
		decode := func(seed uint64) [][]float32 {
			m, err := New(w, nil, Options{Numerics: mode, CacheBytes: 64 << 20})
			if err != nil {
				t.Fatal(err)
			}
			seqs := []*kvcache.Sequence{m.Cache().NewSequence(), m.Cache().NewSequence()}
			if err := m.FillCache(seqs, n, seed); err != nil {
				t.Fatal(err)
			}
			for _, s := range seqs {
				if s.Len() != n {
					t.Fatalf("%s: filled sequence holds %d tokens, want %d", mode, s.Len(), n)
				}
			}
			if got, want := m.Cache().UsedBytes(), 2*m.Cache().BytesFor(n); got != want {
				t.Errorf("%s: cache holds %d bytes, two sequences of %d tokens take %d", mode, got, n, want)
			}
			fresh := m.Cache().NewSequence()
			b := &Batch{}
			for _, s := range append(seqs, fresh) {
				b.Items = append(b.Items, BatchItem{Seq: s, Tokens: tok})
			}
			out, err := m.Forward(b)
			if err != nil {
				t.Fatal(err)
			}
			rows := make([][]float32, len(b.Items))
			for i := range rows {
				rows[i] = out.Last(i)
				for _, v := range rows[i] {
					if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
						t.Fatalf("%s: item %d: non-finite logit %v", mode, i, v)
					}
				}
			}
			return rows
		}
		a, b := decode(1), decode(1)
		for i := range a {
			if !slices.Equal(a[i], b[i]) {
				t.Errorf("%s: item %d: the same seed gave other logits", mode, i)
			}
		}
		if slices.Equal(a[0], a[2]) || slices.Equal(a[1], a[2]) {
			t.Errorf("%s: a decode at depth %d gave the logits of depth 0", mode, n)
		}
		if slices.Equal(a[0], a[1]) {
			t.Errorf("%s: two filled sequences gave the same logits", mode)
		}
		if other := decode(2); slices.Equal(other[0], a[0]) {
			t.Errorf("%s: another seed gave the same logits", mode)
		}
	}
}

func TestFillCacheBadInput(t *testing.T) {
	m, err := New(genWeights(t, checkpoint.SmallConfig(), 3), nil, Options{CacheBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	used := m.Cache().NewSequence()
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: used, Tokens: []int32{1, 2}}}}); err != nil {
		t.Fatal(err)
	}
	s := m.Cache().NewSequence()
	for name, tc := range map[string]struct {
		seqs   []*kvcache.Sequence
		tokens int
	}{
		"no tokens":    {[]*kvcache.Sequence{s}, 0},
		"nil sequence": {[]*kvcache.Sequence{nil}, 10},
		"twice":        {[]*kvcache.Sequence{s, s}, 10},
		"not empty":    {[]*kvcache.Sequence{used}, 10},
		"too long":     {[]*kvcache.Sequence{s}, 1 << 30},
	} {
		if err := m.FillCache(tc.seqs, tc.tokens, 1); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
