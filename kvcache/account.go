package kvcache

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/megamoe/megamoe/checkpoint"
)

// Store is how the cache keeps its values.
type Store int

const (
	// StoreF32 keeps every value as fp32 (`exact` numerics).
	StoreF32 Store = iota
	// StoreCompact keeps entries in EntryFormat and index keys in IndexKeyFormat;
	// the compressor pending state stays fp32.
	StoreCompact
)

func (s Store) String() string {
	if s == StoreCompact {
		return "compact"
	}
	return "fp32"
}

// Component is one part of the cache over all layers of one kind.
type Component struct {
	Name   string
	Layers int
	// Ratio is the number of tokens per stored entry of a growing component,
	// 0 for a component of fixed size.
	Ratio int
	// EntryBytes is the size of one stored entry (or ring slot) of one layer.
	EntryBytes int
	// PerToken is the bytes per token over all these layers (a fraction when
	// one entry covers several tokens).
	PerToken float64
	// Fixed is the bytes per sequence independent of its length.
	Fixed int64
}

// Footprint is the byte accounting of one model's cache per sequence.
type Footprint struct {
	Store      Store
	Components []Component
}

// PerToken is the bytes per token of all growing components.
func (f Footprint) PerToken() float64 {
	var s float64
	for _, c := range f.Components {
		s += c.PerToken
	}
	return s
}

// Fixed is the bytes per sequence of all fixed components.
func (f Footprint) Fixed() int64 {
	var s int64
	for _, c := range f.Components {
		s += c.Fixed
	}
	return s
}

// BytesAt is the cache size of one sequence of n tokens: the fixed part plus
// the entries completed so far (⌊n/ratio⌋ per layer).
func (f Footprint) BytesAt(n int) int64 {
	b := f.Fixed()
	for _, c := range f.Components {
		if c.Ratio > 0 && n > 0 {
			b += int64(n/c.Ratio) * int64(c.EntryBytes) * int64(c.Layers)
		}
	}
	return b
}

// Parts of a layer's cache, in report order.
const (
	partWindow = iota
	partEntries
	partIndexKeys
	partMainState
	partIndexState
)

// FootprintFromConfig accounts a checkpoint's cache (spec §5.9) per component:
// the window rings, compressed entries, indexer keys and compressor pending
// state (fp32 in both stores) of the SWA, CSA and HCA main layers, and the
// same parts of the MTP layers on their own.
func FootprintFromConfig(c *checkpoint.Config, s Store) (Footprint, error) {
	n := c.Layers + c.MTPLayers
	if len(c.CompressRatios) < n || c.Window <= 0 {
		return Footprint{}, fmt.Errorf("kvcache: footprint: %d compress ratios for %d layers, window %d", len(c.CompressRatios), n, c.Window)
	}
	entry, err := NewEntryFormat(c.HeadDim, c.RopeDim)
	if err != nil {
		return Footprint{}, fmt.Errorf("kvcache: footprint: %w", err)
	}
	entryBytes, indexBytes := c.HeadDim*4, c.IndexHeadDim*4
	if s == StoreCompact {
		entryBytes = entry.Bytes()
	}
	partNames := [...]string{"window ring", "compressed KV", "indexer keys", "compressor state", "indexer compressor state"}
	type key struct{ mtp, part, ratio int }
	comps := map[key]*Component{}
	add := func(k key, name string, ratio, bytes int, fixed int64) {
		p, ok := comps[k]
		if !ok {
			p = &Component{Name: name, Ratio: ratio, EntryBytes: bytes}
			comps[k] = p
		}
		p.Layers++
		p.Fixed += fixed
		if ratio > 0 {
			p.PerToken += float64(bytes) / float64(ratio)
		}
	}
	for i := range n {
		r := c.Ratio(i)
		if r != 0 && r != 4 && r != 128 {
			return Footprint{}, fmt.Errorf("kvcache: footprint: layer %d ratio %d, want 0, 4 or 128", i, r)
		}
		k := key{ratio: r}
		label := map[int]string{0: "SWA", 4: "CSA", 128: "HCA"}[r]
		if i >= c.Layers {
			k.mtp, label = 1, "MTP"
		}
		part := func(p int) (key, string) { k.part = p; return k, partNames[p] + " (" + label + ")" }
		kk, name := part(partWindow)
		add(kk, name, 0, entryBytes, int64(c.Window*entryBytes))
		if r == 0 {
			continue
		}
		cc := 1
		if r == 4 {
			cc = 2 // overlapping windows: two halves, the previous window kept
		}
		// Pending state: A and Z+ape in fp32, cc·r rows of cc·Dc values.
		state := func(dc int) int64 { return int64(2*cc*r*cc*dc) * 4 }
		kk, name = part(partEntries)
		add(kk, name, r, entryBytes, 0)
		kk, name = part(partMainState)
		add(kk, name, 0, 0, state(c.HeadDim))
		if r == 4 {
			if s == StoreCompact {
				f, err := NewIndexKeyFormat(c.IndexHeadDim)
				if err != nil {
					return Footprint{}, fmt.Errorf("kvcache: footprint: %w", err)
				}
				indexBytes = f.Bytes()
			}
			kk, name = part(partIndexKeys)
			add(kk, name, r, indexBytes, 0)
			kk, name = part(partIndexState)
			add(kk, name, 0, 0, state(c.IndexHeadDim))
		}
	}
	keys := slices.SortedFunc(maps.Keys(comps), func(a, b key) int {
		return cmp.Or(a.mtp-b.mtp, a.part-b.part, a.ratio-b.ratio)
	})
	f := Footprint{Store: s}
	for _, k := range keys {
		f.Components = append(f.Components, *comps[k])
	}
	return f, nil
}
