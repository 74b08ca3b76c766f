package api

import (
	"context"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// goldenOracle forces the MTP block's drafts toward the golden outputs: right
// at four positions in five, wrong at the others, so that greedy
// verification accepts and rejects at every draft position.
type goldenOracle struct {
	engine.Speculator
	want  []golden
	bySeq map[int64][]int32 // kv sequence id → prompt + golden output
}

func (o *goldenOracle) ForwardMTP(items []model.MTPItem) ([][]float32, [][]float32, error) {
	logits, hidden, err := o.Speculator.ForwardMTP(items)
	if err != nil {
		return nil, nil, err
	}
	for i, it := range items {
		if !it.Draft && it.Start == 0 {
			for _, g := range o.want {
				if len(it.Next) == len(g.Prompt) && slices.Equal(it.Next[:len(g.Prompt)-1], g.Prompt[1:]) {
					o.bySeq[it.Seq.ID] = append(slices.Clone(g.Prompt), g.Output...)
				}
			}
		}
		full := o.bySeq[it.Seq.ID]
		if pos := it.Start + len(it.Next) + 1; pos < len(full) {
			tok := full[pos]
			if pos%5 == 0 {
				tok = (tok + 1) % int32(len(logits[i]))
			}
			logits[i][tok] = 1e4
		}
	}
	return logits, hidden, nil
}

// TestGoldenWithDrafts: the greedy regression outputs are unchanged with MTP
// drafts on (faithful numerics, the served default), with the embedded
// model's own drafts and with drafts forced right and wrong.
func TestGoldenWithDrafts(t *testing.T) {
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Skipf("embedded model unavailable: %v", err)
	}
	w, _, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := readGoldens(t)
	for _, tc := range []struct {
		name   string
		k      int
		forced bool
	}{{"mtp k=2", 2, false}, {"forced k=3", 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && !tc.forced {
				t.Skip("the forced drafts cover the paths")
			}
			m, err := model.New(w, nil, model.Options{CacheBytes: 64 << 20, Drafts: tc.k})
			if err != nil {
				t.Fatal(err)
			}
			var em engine.Model = engine.FromModel(m)
			if tc.forced {
				em = &goldenOracle{Speculator: em.(engine.Speculator), want: want, bySeq: map[int64][]int32{}}
			}
			eng, err := engine.New(em, engine.Config{MaxModelLen: testMaxLen, Speculative: engine.SpecConfig{Method: "mtp", NumTokens: tc.k}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { _ = eng.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			got := runGoldens(t, eng)
			for i := range want {
				if !slices.Equal(got[i].Output, want[i].Output) {
					t.Errorf("%s: output %v with drafts, golden %v", want[i].Name, got[i].Output, want[i].Output)
				}
			}
			s := eng.Stats().Spec
			t.Logf("%d drafted, %d accepted, per position %v", s.Drafted, s.Accepted, s.PerPos)
			if tc.forced && (s.PerPos[tc.k-1] == 0 || s.Accepted == s.Drafted) {
				t.Errorf("forced drafts: per position %v of %d drafted: want every position accepted and some rejected", s.PerPos, s.Drafted)
			}
		})
	}
}
