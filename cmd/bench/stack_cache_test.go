package main

import (
	"io"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestCacheForFollowsModelStore: bench stack sizes its cache in the store the
// model picks (compact in faithful numerics, fp32 in exact), exactly for its
// sequences.
func TestCacheForFollowsModelStore(t *testing.T) {
	for _, tc := range []struct {
		numerics string
		store    kvcache.Store
	}{{"faithful", kvcache.StoreCompact}, {"exact", kvcache.StoreF32}} {
		f, err := parseStack([]string{"--preset", "small", "--device", "cpu", "--numerics", tc.numerics,
			"--prefill", "300", "--decode", "4", "--batch", "2", "--prefill-seqs", "2"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		c, err := checkpoint.PresetConfig(f.preset)
		if err != nil {
			t.Fatal(err)
		}
		w, err := checkpoint.RandomWeights(c, f.format, f.seed)
		if err != nil {
			t.Fatal(err)
		}
		bytes := cacheFor(c, f)
		m, err := model.New(w, nil, model.Options{Numerics: f.numerics, CacheBytes: bytes})
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Cache().Layout().Store; got != tc.store {
			t.Errorf("%s: model store %s, want %s", tc.numerics, got, tc.store)
		}
		if want := int64(f.batch+f.prefillSeqs) * m.Cache().BytesFor(f.prefill+f.decode); bytes != want {
			t.Errorf("%s: cache %d bytes, the model's store needs %d", tc.numerics, bytes, want)
		}
	}
}
