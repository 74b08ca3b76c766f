package engine

import (
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// oracle forces the real MTP block's drafts to be right or wrong: it runs
// the block (so its state is written and rolled back as in serving), then
// replaces each row's argmax by the reference continuation's token, or by
// another one at a hashed third of the positions.
type oracle struct {
	Speculator
	ref   map[int32][]int32 // prompt[1] → prompt + plain decoding's output
	bySeq map[*kvcache.Sequence][]int32
	vocab int32
}

func (o *oracle) ForwardMTP(items []model.MTPItem) ([][]float32, [][]float32, error) {
	logits, hidden, err := o.Speculator.ForwardMTP(items)
	if err != nil {
		return nil, nil, err
	}
	o.force(items, logits)
	return logits, hidden, nil
}

// The oracle keeps the streams on the device as the model does
// (streamKeeper), forcing the drafts the same way.

func (o *oracle) keeper() streamKeeper { return o.Speculator.(streamKeeper) }

func (o *oracle) ForwardKept(items []ForwardItem) (verifyOut, error) {
	return o.keeper().ForwardKept(items)
}

func (o *oracle) ForwardMTPKept(items []model.MTPItem) (mtpOut, error) {
	out, err := o.keeper().ForwardMTPKept(items)
	if err == nil {
		o.force(items, out.logits)
	}
	return out, err
}

func (o *oracle) FreeHidden(h *model.Hidden) { o.keeper().FreeHidden(h) }

func (o *oracle) DownloadHidden(r model.HiddenRef) ([]float32, error) {
	return o.keeper().DownloadHidden(r)
}

// force makes each row's draft plain decoding's token, but where a hash of
// the position says to miss.
func (o *oracle) force(items []model.MTPItem, logits [][]float32) {
	for i, it := range items {
		if !it.Draft && it.Start == 0 {
			o.bySeq[it.Seq] = o.ref[it.Next[0]]
		}
		full := o.bySeq[it.Seq]
		pos := it.Start + len(it.Next) + 1 // the position the row predicts
		if pos >= len(full) {
			continue
		}
		tok := full[pos]
		if (pos*7+int(it.Seq.ID))%3 == 0 {
			tok = (tok + 1) % o.vocab
		}
		logits[i][tok] = 1e4
	}
}

// TestSpecSmallModelGreedy: on the small model (exact numerics) greedy
// outputs with MTP drafts are plain decoding's, token for token, with the
// block's own drafts and with drafts forced right and wrong (so that every
// acceptance count occurs), beside a seeded sampled request; the windows
// wrap and CSA/HCA entries complete inside verified drafts.
func TestSpecSmallModelGreedy(t *testing.T) {
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "small"), checkpoint.GenSpec{Seed: 3, Preset: "small"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	newModel := func() Speculator {
		m, err := model.New(w, nil, model.Options{Numerics: "exact", CacheBytes: 64 << 20, Threads: 2, Drafts: MaxSpeculativeTokens})
		if err != nil {
			t.Fatal(err)
		}
		return FromModel(m).(Speculator)
	}
	var reqs []*Request
	for i, n := range []int{9, 30, 118} {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i*131 + j*17 + j*j) % w.Config.Vocab)
		}
		p[1] = int32(i) // the oracle's key
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: 20})
	}
	sampled := &Request{Prompt: []int32{5, 99, 7, 8}, MaxTokens: 10, Params: SamplingParams{Temperature: 0.8, Seed: seed(1)}}
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 64}
	want, _ := runEngine(t, newModel(), cfg, reqs)
	ref := map[int32][]int32{}
	for i, r := range reqs {
		ref[r.Prompt[1]] = append(append([]int32(nil), r.Prompt...), want[i]...)
	}
	for _, tc := range []struct {
		name   string
		k      int
		oracle bool
	}{{"mtp k=2", 2, false}, {"forced k=3", 3, true}} {
		t.Run(tc.name, func(t *testing.T) {
			if testing.Short() && !tc.oracle {
				t.Skip("the forced drafts cover the paths")
			}
			m := newModel()
			if tc.oracle {
				m = &oracle{Speculator: m, ref: ref, bySeq: map[*kvcache.Sequence][]int32{}, vocab: int32(w.Config.Vocab)}
			}
			c := cfg
			c.Speculative = SpecConfig{Method: "mtp", NumTokens: tc.k}
			got, e := runEngine(t, m, c, append(reqs[:len(reqs):len(reqs)], sampled))
			equalOutputs(t, want, got[:len(reqs)])
			s := e.Stats().Spec
			t.Logf("%s: %d drafted, %d accepted, per position %v, mean acceptance length %.2f", tc.name, s.Drafted, s.Accepted, s.PerPos, s.MeanAcceptance())
			if tc.oracle && (s.PerPos[tc.k-1] == 0 || s.Accepted == s.Drafted) {
				t.Errorf("forced drafts: per position %v of %d: want every position accepted and some rejected", s.PerPos, s.Drafted)
			}
			if u := m.Cache().UsedBytes(); u != 0 {
				t.Errorf("cache holds %d bytes after all finished", u)
			}
		})
	}
}
