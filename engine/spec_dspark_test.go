package engine

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// dsparkOracle forces the real DSpark drafter's drafts right or wrong: the
// blocks run (so the windows are written as in serving), then each row's
// logits get the reference continuation's token far ahead, or another one
// at a hashed quarter of the positions.
type dsparkOracle struct {
	Speculator
	ref   map[int32][]int32 // prompt[1] → prompt + plain decoding's output
	bySeq map[*kvcache.Sequence][]int32
	vocab int
}

func (o *dsparkOracle) ForwardHidden(items []ForwardItem) ([][]float32, [][]float32, error) {
	for _, it := range items {
		if it.Seq.Len() == 0 && len(it.Tokens) > 1 {
			o.bySeq[it.Seq] = o.ref[it.Tokens[1]]
		}
	}
	return o.Speculator.ForwardHidden(items)
}

func (o *dsparkOracle) ForwardDSpark(items []model.DSparkItem) ([][]float32, error) {
	logits, err := o.Speculator.ForwardDSpark(items)
	if err != nil {
		return nil, err
	}
	for i, it := range items {
		full := o.bySeq[it.Seq]
		for j := 0; it.Draft && j < len(logits[i])/o.vocab; j++ {
			pos := it.Start + 1 + j // the anchor is at Start
			if pos >= len(full) {
				break
			}
			tok := int(full[pos])
			if h := (uint32(pos)*2654435761 ^ uint32(it.Seq.ID)*40503) >> 13; h%4 == 0 {
				tok = (tok + 1) % o.vocab
			}
			logits[i][j*o.vocab+tok] = 1e4
		}
	}
	return logits, nil
}

func loadDSpark(t *testing.T) *checkpoint.Weights {
	t.Helper()
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "small-dspark"), checkpoint.GenSpec{Seed: 3, Preset: "small-dspark"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return w
}

func dsparkModel(t *testing.T, w *checkpoint.Weights, rows int, cache int64) Speculator {
	t.Helper()
	m, err := model.New(w, nil, model.Options{Numerics: "exact", CacheBytes: cache, Threads: 2, DSparkRows: rows})
	if err != nil {
		t.Fatal(err)
	}
	return FromModel(m).(Speculator)
}

// dsparkRequests: prompts across window wraps (window 16) and CSA/HCA
// entries, one twice (n > 1), a stop token and a max_tokens inside the
// drafts of a step.
func dsparkRequests(vocab int, lens ...int) []*Request {
	var reqs []*Request
	for i, n := range lens {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i%3*131 + j*17 + j*j) % vocab)
		}
		p[1] = int32(i % 3) // the oracle's key; requests 1 and 3 are the same
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: 16})
	}
	reqs[0].MaxTokens = 6
	return reqs
}

// TestSpecDSparkSmallModel: on the small DSpark model (exact numerics)
// greedy outputs with DSpark drafts are plain decoding's, token for token,
// with the drafter's own drafts and with drafts forced right and wrong (so
// that every acceptance count occurs), for the full block and a shorter
// one, beside a seeded sampled request, with a stop token; the cache is
// empty afterwards.
func TestSpecDSparkSmallModel(t *testing.T) {
	w := loadDSpark(t)
	vocab := w.Config.Vocab
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 64}
	reqs := dsparkRequests(vocab, 9, 30, 70, 30)
	want, _ := runEngine(t, dsparkModel(t, w, 0, 64<<20), cfg, reqs)
	reqs[2].StopTokens = []int32{want[2][6]}
	want[2] = want[2][:1+slicesIndex(want[2], want[2][6])]
	ref := map[int32][]int32{}
	for i, r := range reqs {
		ref[r.Prompt[1]] = append(append([]int32(nil), r.Prompt...), want[i]...)
	}
	ref[reqs[1].Prompt[1]] = append(append([]int32(nil), reqs[1].Prompt...), want[1]...)
	sampled := &Request{Prompt: []int32{5, 99, 7, 8}, MaxTokens: 10, Params: SamplingParams{Temperature: 0.8, Seed: seed(1)}}
	for _, tc := range []struct {
		rows   int
		oracle bool
	}{{0, false}, {0, true}, {2, true}} {
		t.Run(fmt.Sprintf("rows=%d oracle=%v", tc.rows, tc.oracle), func(t *testing.T) {
			if testing.Short() && tc.rows == 2 {
				t.Skip("the full block covers the paths")
			}
			m := dsparkModel(t, w, tc.rows, 64<<20)
			if tc.oracle {
				m = &dsparkOracle{Speculator: m, ref: ref, bySeq: map[*kvcache.Sequence][]int32{}, vocab: vocab}
			}
			c := cfg
			c.Speculative = SpecConfig{Method: "dspark", NumTokens: tc.rows}
			got, e := runEngine(t, m, c, append(reqs[:len(reqs):len(reqs)], sampled))
			equalOutputs(t, want, got[:len(reqs)])
			s := e.Stats().Spec
			k := len(s.PerPos)
			t.Logf("%d drafted, %d accepted, per position %v, mean acceptance length %.2f", s.Drafted, s.Accepted, s.PerPos, s.MeanAcceptance())
			if want := m.DSparkRows(); k != want {
				t.Errorf("%d draft positions, want the block's %d", k, want)
			}
			if s.Drafted == 0 || tc.oracle && (s.PerPos[k-1] == 0 || s.Accepted == s.Drafted) {
				t.Errorf("per position %v of %d drafted: want every position accepted and some rejected", s.PerPos, s.Drafted)
			}
			if u := m.Cache().UsedBytes(); u != 0 {
				t.Errorf("cache holds %d bytes after all finished", u)
			}
		})
	}
}

func slicesIndex(s []int32, v int32) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// TestSpecDSparkPreemption: with a cache so small that sequences are
// preempted (mid-step, their drafts and snapshots with them) and
// recomputed, greedy outputs with DSpark drafts are still plain decoding's
// and the cache is empty afterwards.
func TestSpecDSparkPreemption(t *testing.T) {
	if testing.Short() {
		t.Skip("prefills four 240-token prompts twice")
	}
	w := loadDSpark(t)
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 64}
	reqs := dsparkRequests(w.Config.Vocab, 236, 240, 250, 244)
	for _, r := range reqs {
		r.MaxTokens = 24 // past the 256-token block
	}
	m := dsparkModel(t, w, 0, 64<<20)
	want, _ := runEngine(t, m, cfg, reqs)
	layout := m.Cache().Layout()
	small := dsparkModel(t, w, 0, 3*layout.StateBytes+3*layout.BlockBytes)
	ref := map[int32][]int32{}
	for i, r := range reqs {
		ref[r.Prompt[1]] = append(append([]int32(nil), r.Prompt...), want[i]...)
	}
	o := &dsparkOracle{Speculator: small, ref: ref, bySeq: map[*kvcache.Sequence][]int32{}, vocab: w.Config.Vocab}
	cfg.Speculative = SpecConfig{Method: "dspark"}
	got, e := runEngine(t, o, cfg, reqs)
	equalOutputs(t, want, got)
	if st := e.Stats(); st.Preemptions == 0 || st.Spec.Accepted == 0 {
		t.Errorf("%d preemptions, %d drafts accepted: want both", st.Preemptions, st.Spec.Accepted)
	}
	if u := small.Cache().UsedBytes(); u != 0 {
		t.Errorf("cache holds %d bytes after all finished", u)
	}
}

// TestSpecDSparkConfigErrors: DSpark on a model without the drafter, MTP on
// a DSpark checkpoint and a block the model was not loaded for are start-up
// errors naming the cause.
func TestSpecDSparkConfigErrors(t *testing.T) {
	w := loadDSpark(t)
	m := dsparkModel(t, w, 3, 16<<20)
	for _, tc := range []struct {
		m    Model
		c    SpecConfig
		want string
	}{
		{newToySpec(newToy(t, 1<<20), 0), SpecConfig{Method: "dspark"}, "no DSpark drafter"},
		{m, SpecConfig{Method: "mtp", NumTokens: 2}, `use method "dspark"`},
		{m, SpecConfig{Method: "dspark", NumTokens: 2}, "blocks of 3 rows"},
		{m, SpecConfig{Method: "dspark", NumTokens: 3}, ""},
		{m, SpecConfig{Method: "dspark"}, ""},
	} {
		_, err := New(tc.m, Config{MaxModelLen: 64, Speculative: tc.c})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: error %v, want %q", tc.c, err, tc.want)
		}
	}
}
