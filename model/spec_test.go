package model

import (
	"fmt"
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

// acceptPatterns are the drafts a verification accepts at step s of k
// drafts: the rollback tests run each.
var acceptPatterns = []struct {
	name   string
	accept func(rng *rand.Rand, s, k int) int
}{
	{"random", func(rng *rand.Rand, _, k int) int { return rng.IntN(k + 1) }},
	{"all rejected", func(*rand.Rand, int, int) int { return 0 }},
	{"all accepted", func(_ *rand.Rand, _, k int) int { return k }},
	{"alternating", func(_ *rand.Rand, s, k int) int { return k * (s % 2) }},
}

// TestSpeculativeRollback runs the main model as a speculative decoder does:
// a step feeds the last token and k drafts of which the first a are right,
// then rewinds the sequence to the right ones (positional rollback: nothing
// is copied, accepted drafts are not fed again). Across window wraps (past
// window + slack positions) and CSA/HCA entry boundaries (rejected tokens
// complete entries and write compressor rows) every row conditioned on
// right tokens equals plain decoding's bit for bit, and so does decoding
// afterwards, for k = 1…3 and every acceptance pattern with the fp32 store
// (exact numerics), and with the compact one (faithful).
func TestSpeculativeRollback(t *testing.T) {
	for _, mode := range []string{"exact", "faithful"} {
		for k := 1; k <= 3; k++ {
			for _, pt := range acceptPatterns {
				if mode == "faithful" && (k != 3 || pt.name != "random") || testing.Short() && k != 3 {
					continue
				}
				t.Run(fmt.Sprintf("%s k=%d %s", mode, k, pt.name), func(t *testing.T) {
					speculativeRollback(t, mode, k, pt.accept)
				})
			}
		}
	}
}

func speculativeRollback(t *testing.T, mode string, k int, accept func(rng *rand.Rand, s, k int) int) {
	const n, pre = 150, 20
	m, err := New(genWeights(t, checkpoint.SmallConfig(), 1), nil, Options{Numerics: mode, Drafts: k})
	if err != nil {
		t.Fatal(err)
	}
	toks := prompt(n, m.Config().Vocab, 9)
	ref := run(t, m, toks, []int{pre, 1})
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[:pre]}}}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	kept := pre // cached tokens; the next one is known, not yet fed
	for step := 0; kept+1+k < n-5; step++ {
		a := accept(rng, step, k)
		in := append([]int32(nil), toks[kept:kept+1+k]...)
		for j := 1 + a; j < len(in); j++ {
			in[j] = (in[j] + int32(1+rng.IntN(50))) % int32(m.Config().Vocab) // rejected drafts
		}
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: in, AllLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		for r := range 1 + a {
			equalRows(t, "verify row", kept+r, ref[kept+r], o.Rows(0)[r])
		}
		kept += 1 + a
		if err := m.Rewind(s, kept); err != nil {
			t.Fatal(err)
		}
		m.Cache().Shrink(s, kept+1)
		if s.Len() != kept {
			t.Fatalf("length %d after the step, want %d", s.Len(), kept)
		}
	}
	for L := kept; L < n; L++ {
		o, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[L : L+1]}}})
		if err != nil {
			t.Fatal(err)
		}
		equalRows(t, "decode after speculation", L, ref[L], o.Last(0))
	}
}

// TestMTPDraftRollback chains drafts through the MTP block (rows ahead of the
// main model on its own hidden state, written into its rolling state past
// the caught-up positions) and catches up with the true hidden states: the
// catch-up rows equal a run without drafts.
func TestMTPDraftRollback(t *testing.T) {
	const n, pre, k = 60, 10, 4
	m, err := New(genWeights(t, checkpoint.SmallConfig(), 1), nil, Options{Numerics: "exact", Drafts: k})
	if err != nil {
		t.Fatal(err)
	}
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
			h := r.Hidden[0]
			for j := range k - 1 { // chained drafts at positions p, p+1, …
				d, err := m.ForwardMTP([]MTPItem{{Seq: s, Start: p + j, Hidden: h, Next: []int32{int32(j % c.Vocab)}, WantHidden: true, Draft: true}})
				if err != nil {
					t.Fatal(err)
				}
				h = d.Hidden[0]
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

// TestDraftsOption: Options.Drafts sizes the cache's slack (the layout
// counts it); -1 takes the DSpark drafter's block rows and is an error
// without one.
func TestDraftsOption(t *testing.T) {
	w := genWeights(t, checkpoint.SmallConfig(), 1)
	for _, tc := range []struct {
		drafts, want int
		err          bool
	}{{0, 0, false}, {3, 3, false}, {-1, 0, true}, {-2, 0, true}} {
		m, err := New(w, nil, Options{Numerics: "exact", Drafts: tc.drafts})
		if tc.err {
			if err == nil {
				t.Errorf("drafts %d: no error", tc.drafts)
			}
			continue
		}
		if err != nil {
			t.Fatalf("drafts %d: %v", tc.drafts, err)
		}
		if m.Drafts() != tc.want || m.Cache().Layout().Slack != tc.want {
			t.Errorf("drafts %d: model %d, layout %d", tc.drafts, m.Drafts(), m.Cache().Layout().Slack)
		}
	}
	w = genWeights(t, checkpoint.SmallDSparkConfig(), 1)
	m, err := New(w, nil, Options{Numerics: "exact", Drafts: -1})
	if err != nil {
		t.Fatal(err)
	}
	if m.Drafts() != m.DSparkRows() || m.Drafts() == 0 {
		t.Errorf("drafts -1 with DSpark: %d, block rows %d", m.Drafts(), m.DSparkRows())
	}
}
