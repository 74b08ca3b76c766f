package kvcache

import (
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

func TestFootprintPresets(t *testing.T) {
	cases := []struct {
		preset        string
		store         Store
		perToken      float64 // bytes per token
		components    int
		windowSWA     int64 // fixed bytes of the SWA main layers' rings
		perTokenLimit float64
	}{
		// Issue 31: today's fp32 store, 13,760 and 19,696 bytes per token.
		{"flash", StoreF32, 13760, 10, 2 * 128 * 512 * 4, 0},
		{"pro", StoreF32, 19696, 9, 0, 0},
		// 21 CSA·(584+68)/4 + 20 HCA·584/128; 30 CSA·(584+68)/4 + 31 HCA·584/128.
		{"flash", StoreCompact, 21*(584+68)/4.0 + 20*584/128.0, 10, 2 * 128 * 584, 3600},
		{"pro", StoreCompact, 30*(584+68)/4.0 + 31*584/128.0, 9, 0, 5100},
		// 3 CSA·(200+36)/4 + 2 HCA·200/128.
		{"small", StoreCompact, 3*(200+36)/4.0 + 2*200/128.0, 10, 16 * 200, 0},
	}
	for _, c := range cases {
		t.Run(c.preset+" "+c.store.String(), func(t *testing.T) {
			cfg, err := checkpoint.PresetConfig(c.preset)
			if err != nil {
				t.Fatal(err)
			}
			f, err := FootprintFromConfig(cfg, c.store)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.PerToken(); got != c.perToken {
				t.Errorf("%v bytes/token, want %v", got, c.perToken)
			}
			if c.perTokenLimit > 0 && f.PerToken() > c.perTokenLimit {
				t.Errorf("%v bytes/token over the target %v", f.PerToken(), c.perTokenLimit)
			}
			if len(f.Components) != c.components {
				t.Errorf("%d components, want %d: %+v", len(f.Components), c.components, f.Components)
			}
			layers := 0
			for _, p := range f.Components {
				if p.Name == "window ring (SWA)" && p.Fixed != c.windowSWA {
					t.Errorf("SWA rings %d bytes, want %d", p.Fixed, c.windowSWA)
				}
				if strings.HasPrefix(p.Name, "window ring") {
					layers += p.Layers
				}
			}
			if layers != cfg.Layers+cfg.MTPLayers {
				t.Errorf("window rings of %d layers, want %d", layers, cfg.Layers+cfg.MTPLayers)
			}
		})
	}
}

// TestFootprintMatchesLayout ties the accounting of both stores to the
// manager's layout, which sizes the backends' stores.
func TestFootprintMatchesLayout(t *testing.T) {
	for _, preset := range []string{"small", "flash", "pro"} {
		cfg, err := checkpoint.PresetConfig(preset)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []Store{StoreF32, StoreCompact} {
			f, err := FootprintFromConfig(cfg, s)
			if err != nil {
				t.Fatal(err)
			}
			l, err := LayoutFromConfig(cfg, DefaultBlockTokens, s)
			if err != nil {
				t.Fatal(err)
			}
			if f.Fixed() != l.StateBytes || f.PerToken()*DefaultBlockTokens != float64(l.BlockBytes) {
				t.Errorf("%s %s: footprint %d fixed, %v per token; layout %d state, %d per %d-token block",
					preset, s, f.Fixed(), f.PerToken(), l.StateBytes, l.BlockBytes, DefaultBlockTokens)
			}
			// At a multiple of every ratio the entries are exactly per-token bytes,
			// and the manager reserves exactly that.
			n := 1 << 20
			if f.BytesAt(n) != f.Fixed()+int64(f.PerToken()*float64(n)) {
				t.Errorf("%s %s: %d bytes at %d tokens", preset, s, f.BytesAt(n), n)
			}
			if got := NewManager(l, 0).BytesFor(n); got != f.BytesAt(n) {
				t.Errorf("%s %s: manager reserves %d bytes for %d tokens, footprint %d", preset, s, got, n, f.BytesAt(n))
			}
		}
	}
}

func TestFootprintBytesAt(t *testing.T) {
	cfg := &checkpoint.Config{Layers: 2, MTPLayers: 1, CompressRatios: []int{4, 128, 0}, Window: 8, HeadDim: 512, RopeDim: 64, IndexHeadDim: 128}
	f, err := FootprintFromConfig(cfg, StoreCompact)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ tokens, entries4, entries128 int64 }{{0, 0, 0}, {3, 0, 0}, {4, 1, 0}, {130, 32, 1}, {1000, 250, 7}}
	for _, c := range cases {
		want := f.Fixed() + c.entries4*(584+68) + c.entries128*584
		if got := f.BytesAt(int(c.tokens)); got != want {
			t.Errorf("%d tokens: %d bytes, want %d", c.tokens, got, want)
		}
	}
	bad := []*checkpoint.Config{
		{Layers: 2, CompressRatios: []int{4}, Window: 8, HeadDim: 512, RopeDim: 64},
		{Layers: 1, CompressRatios: []int{8}, Window: 8, HeadDim: 512, RopeDim: 64},
		{Layers: 1, CompressRatios: []int{4}, Window: 8, HeadDim: 512, RopeDim: 64},
		{Layers: 1, CompressRatios: []int{0}, Window: 0, HeadDim: 512, RopeDim: 64},
	}
	for i, c := range bad {
		if _, err := FootprintFromConfig(c, StoreCompact); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}
