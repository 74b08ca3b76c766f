package model

import (
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// equalRows fails unless got and want are bit-identical logits rows.
func equalRows(t *testing.T, what string, pos int, want, got []float32) {
	t.Helper()
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s at position %d: logit %d = %v, want %v", what, pos, i, got[i], want[i])
		}
	}
}

// TestSpeculativeRollback runs the main model as a speculative decoder does:
// a step feeds the tokens not yet kept (replays of drafts accepted last
// step, then the last token) and k drafts of which a random number are
// right, keeps the first rows' state in the spare slot and, after a
// rejection, restores it. Across window wraps and CSA/HCA entry boundaries
// (rejected tokens complete entries and roll compressor windows) every row
// conditioned on right tokens equals plain decoding's bit for bit, and so
// does decoding afterwards, with the fp32 store (exact numerics) and the
// compact one (faithful).
func TestSpeculativeRollback(t *testing.T) {
	for _, mode := range []string{"exact", "faithful"} {
		t.Run(mode, func(t *testing.T) { speculativeRollback(t, mode) })
	}
}

func speculativeRollback(t *testing.T, mode string) {
	const n, pre, k = 150, 20, 4
	m := newSynth(t, checkpoint.SmallConfig(), mode)
	toks := prompt(n, m.Config().Vocab, 9)
	ref := run(t, m, toks, []int{pre, 1})
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[:pre]}}}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	kept, known := pre, pre+1 // cached tokens; tokens known (the last one not yet fed)
	for known+k < n-5 {
		if err := m.Snapshot(s, true); err != nil {
			t.Fatal(err)
		}
		a := rng.IntN(k + 1)
		in := append([]int32(nil), toks[kept:known+k]...)
		nKeep := known - kept
		for j := nKeep + a; j < len(in); j++ {
			in[j] = (in[j] + int32(1+rng.IntN(50))) % int32(m.Config().Vocab) // rejected drafts
		}
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: in, AllLogits: true, Keep: nKeep}}})
		if err != nil {
			t.Fatal(err)
		}
		for r := range nKeep + a {
			equalRows(t, "verify row", kept+r, ref[kept+r], o.Rows(0)[r])
		}
		if a == k {
			kept += nKeep + k
		} else {
			if err := m.Restore(s, kept+nKeep, false); err != nil {
				t.Fatal(err)
			}
			kept += nKeep
		}
		known += a + 1
		m.Cache().Shrink(s, kept+1)
		if s.Len() != kept {
			t.Fatalf("length %d after the step, want %d", s.Len(), kept)
		}
	}
	o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[kept:known], AllLogits: true}}})
	if err != nil {
		t.Fatal(err)
	}
	for r, row := range o.Rows(0) {
		equalRows(t, "replay after speculation", kept+r, ref[kept+r], row)
	}
	for L := known; L < n; L++ {
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[L : L+1]}}})
		if err != nil {
			t.Fatal(err)
		}
		equalRows(t, "decode after speculation", L, ref[L], o.Last(0))
	}
}

// TestMTPDraftRollback chains drafts through the MTP block (rows ahead of the
// main model on its own hidden state), restores the MTP state and catches up
// with the true hidden states: the catch-up rows equal a run without drafts.
func TestMTPDraftRollback(t *testing.T) {
	const n, pre, k = 60, 10, 4
	m := newSynth(t, checkpoint.SmallConfig(), "exact")
	c := m.Config()
	w := c.HcDim()
	toks := prompt(n, c.Vocab, 5)
	mtpRun := func(spec bool) [][]float32 {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks, Hidden: true}}})
		if err != nil {
			t.Fatal(err)
		}
		hid := o.Hidden[0]
		var rows [][]float32
		rng := rand.New(rand.NewPCG(1, 2))
		for p := 0; p < n-1; {
			cnt := pre
			if p > 0 {
				cnt = min(1+rng.IntN(k+1), n-1-p)
			}
			r, err := m.ForwardMTP([]MTPItem{{Seq: s, Start: p, Hidden: hid[p*w : (p+cnt)*w], Next: toks[p+1 : p+1+cnt], AllLogits: true, WantHidden: true}})
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, r.Rows(0)...)
			p += cnt
			if !spec {
				continue
			}
			if err := m.Snapshot(s, true); err != nil {
				t.Fatal(err)
			}
			h := r.Hidden[0]
			for j := range k - 1 { // chained drafts at positions p, p+1, …
				d, err := m.ForwardMTP([]MTPItem{{Seq: s, Start: p + j, Hidden: h, Next: []int32{int32(j % c.Vocab)}, WantHidden: true, Draft: true}})
				if err != nil {
					t.Fatal(err)
				}
				h = d.Hidden[0]
			}
			if err := m.Restore(s, 0, true); err != nil {
				t.Fatal(err)
			}
		}
		return rows
	}
	want, got := mtpRun(false), mtpRun(true)
	for p := range want {
		equalRows(t, "mtp row", p, want[p], got[p])
	}
}

// TestDSparkCheckpointServes: a DSpark checkpoint (no MTP block, its drafter
// under mtp.*) loads and decodes as the target model; it has no MTP to draft
// with.
func TestDSparkCheckpointServes(t *testing.T) {
	w := loadGenerated(t, checkpoint.GenSpec{Seed: 1, Preset: "small-dspark"})
	m, err := New(w, nil, Options{Numerics: "exact"})
	if err != nil {
		t.Fatal(err)
	}
	if m.HasMTP() || w.DSpark == nil {
		t.Fatalf("HasMTP %v, drafter %v", m.HasMTP(), w.DSpark != nil)
	}
	run(t, m, prompt(20, m.Config().Vocab, 1), []int{15, 1})
}
