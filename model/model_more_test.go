package model

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// TestHashLayersUseTid2Eid: the router of hash layers returns tid2eid[token].
func TestHashLayersUseTid2Eid(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	m, err := New(w, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	be := m.Backend()
	toks := prompt(9, c.Vocab, 3)
	f := be.Alloc(len(toks), c.Dim, backend.F32)
	fv := make([]float32, len(toks)*c.Dim)
	for i := range fv {
		fv[i] = float32(math.Sin(float64(i)))
	}
	be.Upload(f, fv)
	for l := range c.Layers {
		_, ids, err := m.blocks[l].ffn.Route(be, f, toks)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]int32, len(toks)*c.TopK)
		be.DownloadI32(ids, got)
		match := true
		for r, tok := range toks {
			for k := range c.TopK {
				if l < c.HashLayers {
					want := int32(binary.LittleEndian.Uint64(w.Layers[l].FFN.Tid2Eid.Data[8*(int(tok)*c.TopK+k):]))
					if got[r*c.TopK+k] != want {
						t.Errorf("layer %d row %d: expert %d, tid2eid says %d", l, r, got[r*c.TopK+k], want)
					}
				}
			}
			_ = match
		}
	}
}

func TestForwardErrors(t *testing.T) {
	c := checkpoint.SmallConfig()
	m, err := New(genWeights(t, c, 1), nil, Options{CacheBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := m.Cache().NewSequence()
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{1}}}}); !errors.Is(err, kvcache.ErrCacheFull) {
		t.Errorf("tiny cache: %v", err)
	}
	m2, _ := New(genWeights(t, c, 1), nil, Options{})
	s2 := m2.Cache().NewSequence()
	for _, b := range []*Batch{nil, {}, {Items: []BatchItem{{Seq: s2, Tokens: []int32{int32(c.Vocab)}}}},
		{Items: []BatchItem{{Seq: s2, Tokens: []int32{-1}}}}, {Items: []BatchItem{{Seq: nil, Tokens: []int32{1}}}},
		{Items: []BatchItem{{Seq: s2}}}, {Items: []BatchItem{{Seq: s2, Tokens: []int32{1}}, {Seq: s2, Tokens: []int32{2}}}}} {
		if _, err := m2.Forward(b); err == nil {
			t.Errorf("batch %+v accepted", b)
		}
	}
	if s2.Len() != 0 || m2.Cache().UsedBytes() != 0 {
		t.Error("rejected batches changed the cache")
	}
	if _, err := New(genWeights(t, c, 1), nil, Options{Numerics: "bogus"}); err == nil {
		t.Error("bogus numerics accepted")
	}
}

// TestLongPromptFinite: 2,000 tokens (wraps the window many times, 15 HCA
// entries, 500 CSA entries with top-4 selection) stay finite in both modes.
func TestLongPromptFinite(t *testing.T) {
	start := time.Now()
	modes := []string{"faithful", "exact"}
	if testing.Short() {
		modes = modes[:1]
	}
	for _, mode := range modes {
		m := newSynth(t, checkpoint.SmallConfig(), mode)
		s := m.Cache().NewSequence()
		toks := prompt(2000, 512, 9)
		var all [][]float32
		for i := 0; i < len(toks); i += 500 {
			o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[i : i+500], AllLogits: true}}})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, o.Rows(0)...)
		}
		for p, row := range all {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s: non-finite logit at position %d", mode, p)
				}
			}
		}
	}
	t.Logf("%d×2000 tokens in %v", len(modes), time.Since(start))
}

// TestMTP: shapes, finiteness, chunking consistency (whole vs token by token)
// and that the MTP input token matters.
func TestMTP(t *testing.T) {
	for _, mode := range []string{"exact", "faithful"} {
		m := newSynth(t, checkpoint.SmallConfig(), mode)
		c := m.Config()
		toks := prompt(30, c.Vocab, 4)
		s := m.Cache().NewSequence()
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks, AllLogits: true, Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		hid := o.Hidden[0]
		w := c.HcDim()
		if len(hid) != 30*w || o.HiddenDim != w {
			t.Fatalf("hidden size %d, want 30×%d", len(hid), w)
		}
		// Whole: positions 0..28 predict token i+2 from hidden i and token i+1.
		whole, err := m.ForwardMTP([]MTPItem{{Seq: s, Start: 0, Hidden: hid[:29*w], Next: toks[1:30], AllLogits: true}})
		if err != nil {
			t.Fatal(err)
		}
		if len(whole.Rows(0)) != 29 || len(whole.Rows(0)[0]) != c.Vocab {
			t.Fatalf("mtp logits shape")
		}
		for p, row := range whole.Rows(0) {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("non-finite mtp logit at %d", p)
				}
			}
		}
		// Token by token on a second sequence with the same history.
		s2 := m.Cache().NewSequence()
		if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s2, Tokens: toks}}}); err != nil {
			t.Fatal(err)
		}
		var step [][]float32
		for i := range 29 {
			r, err := m.ForwardMTP([]MTPItem{{Seq: s2, Start: i, Hidden: hid[i*w : (i+1)*w], Next: toks[i+1 : i+2]}})
			if err != nil {
				t.Fatal(err)
			}
			step = append(step, r.Last(0))
		}
		if d, at := maxRelDiff(whole.Rows(0), step); d > tol[mode] {
			t.Errorf("%s: mtp whole vs stepwise %.3g at %d", mode, d, at)
		}
		// Changing the next token changes the prediction.
		alt := append([]int32(nil), toks[1:2]...)
		alt[0] = (alt[0] + 1) % int32(c.Vocab)
		s3 := m.Cache().NewSequence()
		m.Forward(&Batch{Items: []BatchItem{{Seq: s3, Tokens: toks[:1]}}})
		r, err := m.ForwardMTP([]MTPItem{{Seq: s3, Start: 0, Hidden: hid[:w], Next: alt}})
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := maxRelDiff(whole.Rows(0)[:1], r.Rows(0)); d == 0 {
			t.Error("mtp ignores the next token")
		}
		if _, err := m.ForwardMTP([]MTPItem{{Seq: s3, Start: 5, Hidden: hid[5*w : 6*w], Next: toks[6:7]}}); err == nil {
			t.Error("mtp beyond processed positions accepted")
		}
	}
}
