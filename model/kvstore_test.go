package model

import (
	"math"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// storeLogits runs two sequences of different lengths (one batched prefill,
// then batched decode steps, then the MTP block over each prefill) on the
// small model with the given store and returns every logits row.
func storeLogits(t *testing.T, w *checkpoint.Weights, store string, lens []int, decode int) [][]float32 {
	t.Helper()
	m, err := New(w, nil, Options{KVStore: store, CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	seqs := make([]*kvcache.Sequence, len(lens))
	var items []BatchItem
	for i, n := range lens {
		seqs[i] = m.Cache().NewSequence()
		defer m.FreeSequence(seqs[i])
		items = append(items, BatchItem{Seq: seqs[i], Tokens: prompt(n+decode+1, m.cfg.Vocab, uint64(i+1))[:n], AllLogits: true, Hidden: true})
	}
	var out [][]float32
	o, err := m.Forward(&Batch{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	var mtp []MTPItem
	for i, it := range items {
		out = append(out, o.Rows(i)...)
		toks := prompt(lens[i]+decode+1, m.cfg.Vocab, uint64(i+1))
		mtp = append(mtp, MTPItem{Seq: it.Seq, Hidden: o.Hidden[i], Next: toks[1 : lens[i]+1], AllLogits: true})
	}
	for d := range decode {
		var step []BatchItem
		for i, s := range seqs {
			toks := prompt(lens[i]+decode+1, m.cfg.Vocab, uint64(i+1))
			step = append(step, BatchItem{Seq: s, Tokens: toks[lens[i]+d : lens[i]+d+1]})
		}
		o, err := m.Forward(&Batch{Items: step})
		if err != nil {
			t.Fatal(err)
		}
		for i := range step {
			out = append(out, o.Rows(i)...)
		}
	}
	if o, err = m.ForwardMTP(mtp); err != nil {
		t.Fatal(err)
	}
	for i := range mtp {
		out = append(out, o.Rows(i)...)
	}
	return out
}

// TestCompactStoreLogits: in faithful numerics the compact cache store gives
// the fp32 store's logits bit for bit, over prefills that fill several blocks
// of compressed entries, wrap the window and select among many more entries
// than index_topk, then decode steps and the MTP block.
func TestCompactStoreLogits(t *testing.T) {
	lens, decode := []int{600, 530}, 3
	if testing.Short() {
		lens, decode = []int{200, 90}, 2
	}
	w := genWeights(t, checkpoint.SmallConfig(), 1)
	want, got := storeLogits(t, w, "fp32", lens, decode), storeLogits(t, w, "compact", lens, decode)
	if len(got) != len(want) {
		t.Fatalf("%d logits rows, want %d", len(got), len(want))
	}
	for r := range want {
		for i := range want[r] {
			if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
				t.Fatalf("row %d logit %d: compact %g, fp32 %g", r, i, got[r][i], want[r][i])
			}
		}
	}
}

// TestKVStoreOption: the store follows the numerics (StoreFor) unless forced,
// a compact store needs faithful numerics, and a model refuses to run after
// its backend's numerics changed.
func TestKVStoreOption(t *testing.T) {
	w := genWeights(t, checkpoint.SmallConfig(), 1)
	for _, tc := range []struct {
		numerics, store string
		want            kvcache.Store
		err             string
	}{
		{"faithful", "", kvcache.StoreCompact, ""},
		{"exact", "", kvcache.StoreF32, ""},
		{"faithful", "fp32", kvcache.StoreF32, ""},
		{"exact", "compact", 0, "needs faithful numerics"},
		{"faithful", "fp8", 0, `kv store "fp8"`},
	} {
		m, err := New(w, nil, Options{Numerics: tc.numerics, KVStore: tc.store, CacheBytes: 16 << 20})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s/%q: error %v, want %q", tc.numerics, tc.store, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s/%q: %v", tc.numerics, tc.store, err)
		}
		if got := m.Cache().Layout().Store; got != tc.want {
			t.Errorf("%s/%q: store %s, want %s", tc.numerics, tc.store, got, tc.want)
		}
	}
	m, err := New(w, nil, Options{CacheBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m.Backend().SetNumerics(backend.Exact)
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{5}}}}); err == nil || !strings.Contains(err.Error(), "numerics changed") {
		t.Errorf("forward after a numerics change: %v", err)
	}
}
