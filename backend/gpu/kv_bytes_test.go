package gpu

import (
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// TestKVStoreBytes: what NewKVStore allocates per state slot and per block
// is the kvcache accounting (the cache's capacity and `bench kv` report), in
// both store kinds, and with the slack rows of speculative decoding. Needs
// no GPU.
func TestKVStoreBytes(t *testing.T) {
	for _, c := range []struct {
		preset string
		store  kvcache.Store
	}{
		{"flash", kvcache.StoreF32}, {"flash", kvcache.StoreCompact},
		{"pro", kvcache.StoreF32}, {"pro", kvcache.StoreCompact},
		{"small", kvcache.StoreCompact},
	} {
		t.Run(c.preset+" "+c.store.String(), func(t *testing.T) {
			cfg, err := checkpoint.PresetConfig(c.preset)
			must(t, err)
			l, err := kvcache.LayoutFromConfig(cfg, kvcache.DefaultBlockTokens, c.store)
			must(t, err)
			fp, err := kvcache.FootprintFromConfig(cfg, c.store)
			must(t, err)
			var slot, block int64
			for i, k := range l.Layers {
				lk := backend.LayerKV{Window: k.Window, HeadDim: k.HeadDim, RopeDim: k.RopeDim, Ratio: k.Ratio, IndexDim: k.IndexDim}
				kl, err := newKVLayer(lk, c.store == kvcache.StoreCompact, l.BlockTokens, 0)
				if err != nil {
					t.Fatalf("layer %d: %v", i, err)
				}
				slot += int64(kl.slotBytes())
				block += int64(kl.blockBytes())
			}
			var slack int64
			sl := l.WithSlack(3)
			for _, k := range l.Layers {
				lk := backend.LayerKV{Window: k.Window, HeadDim: k.HeadDim, RopeDim: k.RopeDim, Ratio: k.Ratio, IndexDim: k.IndexDim}
				kl, err := newKVLayer(lk, c.store == kvcache.StoreCompact, l.BlockTokens, 3)
				must(t, err)
				slack += int64(kl.slotBytes())
			}
			if slack != sl.StateBytes || sl.Slack != 3 {
				t.Errorf("GPU store with 3 slack rows: slot %d bytes; layout: %d (slack %d)", slack, sl.StateBytes, sl.Slack)
			}
			perTok := float64(block) / float64(l.BlockTokens)
			t.Logf("%s %v: GPU store %.2f bytes/token (block %d bytes), %d bytes per sequence slot; bench kv %.2f bytes/token, %d fixed",
				c.preset, c.store, perTok, block, slot, fp.PerToken(), fp.Fixed())
			if slot != l.StateBytes || block != l.BlockBytes {
				t.Errorf("GPU store: slot %d, block %d bytes; layout: %d, %d", slot, block, l.StateBytes, l.BlockBytes)
			}
			if perTok != fp.PerToken() || slot != fp.Fixed() {
				t.Errorf("GPU store: %v bytes/token, %d fixed; footprint: %v, %d", perTok, slot, fp.PerToken(), fp.Fixed())
			}
		})
	}
}
