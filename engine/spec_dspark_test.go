package engine

import (
	"context"
	"fmt"
	"math"
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
	m, err := model.New(w, nil, model.Options{Numerics: "exact", CacheBytes: cache, Threads: 2, DSparkRows: rows, Drafts: -1})
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
	// Before the model is built, against the checkpoint's config.
	for _, tc := range []struct {
		cc   *checkpoint.Config
		c    SpecConfig
		want string
	}{
		{w.Config, SpecConfig{Method: "dspark", NumTokens: 5}, "num_speculative_tokens 5 out of [1, dspark_block_size 4]"},
		{w.Config, SpecConfig{Method: "dspark", NumTokens: 4}, ""},
		{checkpoint.SmallConfig(), SpecConfig{Method: "dspark"}, "no DSpark drafter"},
		{checkpoint.SmallConfig(), SpecConfig{Method: "mtp", NumTokens: 2}, ""},
	} {
		err := tc.c.CheckCheckpoint(tc.cc)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("CheckCheckpoint %+v: error %v, want %q", tc.c, err, tc.want)
		}
	}
}

// chainSpec is a DSpark drafter on a vocabulary of 8 for the sampling
// test: fixed base rows and a Markov bias table.
type chainSpec struct {
	Speculator
	cache  *kvcache.Manager
	base   []float32   // rows × 8
	markov [][]float32 // by previous token
}

func (c *chainSpec) HiddenDim() int          { return 1 }
func (c *chainSpec) Vocab() int              { return 8 }
func (c *chainSpec) DSparkRows() int         { return len(c.base) / 8 }
func (c *chainSpec) Cache() *kvcache.Manager { return c.cache }
func (c *chainSpec) ForwardDSpark(items []model.DSparkItem) ([][]float32, error) {
	out := make([][]float32, len(items))
	for i := range out {
		out[i] = append([]float32(nil), c.base...)
	}
	return out, nil
}

func (c *chainSpec) MarkovBias(prev []int32) ([][]float32, error) {
	out := make([][]float32, len(prev))
	for i, p := range prev {
		out[i] = c.markov[p]
	}
	return out, nil
}

// TestDSparkSamplingChiSquare: two drafts chained through the Markov head
// (the second one's proposal depends on the first draft), verified by the
// acceptance rule, give token pairs distributed as the target's p(t1)
// p(t2|t1), the second token drawn by the next step after a first-row
// rejection: Pearson's chi-square over a fixed seed's 60000 pairs on 8×8
// cells stays under the 0.1% critical value.
func TestDSparkSamplingChiSquare(t *testing.T) {
	first := []float32{2, 1.5, 1, 0.2, -1, 3, 0, 0.5}
	second := make([][]float32, 8) // the target's row after each first token
	markov := make([][]float32, 8)
	for a := range 8 {
		second[a], markov[a] = make([]float32, 8), make([]float32, 8)
		for b := range 8 {
			second[a][b] = float32((a*3+b*5)%7) * 0.4
			markov[a][b] = float32((a+2*b)%5)*0.5 - 1
		}
	}
	drafter := &chainSpec{cache: kvcache.NewManager(kvcache.Layout{BlockTokens: kvcache.DefaultBlockTokens}, 1<<20),
		base: []float32{0, 2, 2, 1, 1, 0, 3, -2, 1, 0, -1, 2, 0, 1, 1, 0}, markov: markov}
	for _, p := range []SamplingParams{{Temperature: 1}, {Temperature: 0.8, TopK: 6, TopP: 0.95}} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			p.Seed = seed(5)
			s := NewSampler(p, nil)
			sp := &speculator{m: drafter, d: dsparkDrafter{}, k: 2, maxLen: 1 << 20, budget: 1 << 20}
			const n = 60000
			counts := make([]float64, 64)
			for range n {
				seq := &Sequence{Tokens: []int32{0}, NumPrompt: 1, KV: drafter.cache.NewSequence(), Req: &Request{MaxTokens: 10}, Sampler: s}
				props, err := sp.d.propose(sp, []Item{{Seq: seq, N: 1, Sample: true}})
				if err != nil || props[0] == nil || len(props[0].tokens) != 2 {
					t.Fatalf("proposal %v: %v", props, err)
				}
				d1 := props[0].tokens[0]
				rows := append(append(append([]float32(nil), first...), second[d1]...), first...) // the bonus row is not counted
				r, err := sp.verify(seq, rows, 8, props[0])
				if err != nil {
					t.Fatal(err)
				}
				t1 := r.tokens[0].ID
				t2 := int32(-1)
				if len(r.tokens) > 1 {
					t2 = r.tokens[1].ID
				} else {
					t2 = s.Sample(second[t1]).ID
				}
				counts[t1*8+t2]++
				drafter.cache.Free(seq.KV)
			}
			p1 := s.targetDist(first, nil)
			var chi float64
			df := -1
			for a := range 8 {
				p2 := s.targetDist(second[a], nil)
				for b := range 8 {
					e := p1[a] * p2[b] * n
					if e == 0 {
						if counts[a*8+b] != 0 {
							t.Errorf("pair %d,%d has probability 0 but came out %v times", a, b, counts[a*8+b])
						}
						continue
					}
					df++
					chi += (counts[a*8+b] - e) * (counts[a*8+b] - e) / e
				}
			}
			// 0.1% critical value (Wilson–Hilferty).
			h := 2 / (9 * float64(df))
			crit := float64(df) * math.Pow(1-h+3.09*math.Sqrt(h), 3)
			t.Logf("chi-square %.1f (df %d, critical %.1f)", chi, df, crit)
			if chi > crit {
				t.Errorf("chi-square %.1f > %.1f (df %d)", chi, crit, df)
			}
		})
	}
}

// TestSpecDSparkCancel: a request cancelled while it decodes with DSpark
// drafts frees its cache (its snapshot included); the others decode as
// without drafts.
func TestSpecDSparkCancel(t *testing.T) {
	w := loadDSpark(t)
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 64}
	reqs := dsparkRequests(w.Config.Vocab, 30, 9, 40)
	want, _ := runEngine(t, dsparkModel(t, w, 0, 64<<20), cfg, reqs[1:])
	m := dsparkModel(t, w, 0, 64<<20)
	cfg.Speculative = SpecConfig{Method: "dspark"}
	e, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	stopped := false
	stop := func() {
		if !stopped {
			cancel()
			<-done
			stopped = true
		}
	}
	defer stop()
	reqs[0].MaxTokens = 400
	var streams []*Stream
	for _, r := range reqs {
		st, err := e.Submit(r)
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for got := 0; got < 3; { // cancel after some drafted steps
		select {
		case <-streams[0].Ready():
		case <-t.Context().Done():
			t.Fatal("no tokens")
		}
		for ev, ok := streams[0].Next(); ok; ev, ok = streams[0].Next() {
			got += len(ev.Tokens)
		}
	}
	streams[0].Cancel()
	if _, fin := collect(t, streams[0]); fin != FinishCancelled {
		t.Fatalf("cancelled stream finished %q", fin)
	}
	for i, st := range streams[1:] {
		toks, _ := collect(t, st)
		equalOutputs(t, want[i:i+1], [][]int32{toks})
	}
	if e.Stats().Spec.Drafted == 0 {
		t.Error("no drafts")
	}
	stop()
	if u := m.Cache().UsedBytes(); u != 0 {
		t.Errorf("cache holds %d bytes after the others finished", u)
	}
}

// TestSpecDSparkPrefixHit: a request whose prompt prefix comes from the
// prefix cache drafts from its first decode step (the drafter's positions
// start after the hit) and decodes as without drafts.
func TestSpecDSparkPrefixHit(t *testing.T) {
	if testing.Short() {
		t.Skip("prefills a 300-token prompt twice")
	}
	w := loadDSpark(t)
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 128, PrefixCaching: true}
	req := func() *Request { return dsparkRequests(w.Config.Vocab, 300)[0] }
	want, _ := runEngine(t, dsparkModel(t, w, 0, 64<<20), cfg, []*Request{req()})
	cfg.Speculative = SpecConfig{Method: "dspark"}
	m := dsparkModel(t, w, 0, 64<<20)
	e, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var drafted int64
	for i := range 2 {
		st, err := e.Submit(req())
		if err != nil {
			t.Fatal(err)
		}
		got, _ := collect(t, st)
		equalOutputs(t, want, [][]int32{got})
		s := e.Stats()
		if i == 1 && (s.PrefixHits == 0 || s.Spec.Drafted == drafted) {
			t.Errorf("second request: %d prefix hits, %d drafts (%d before): want both", s.PrefixHits, s.Spec.Drafted-drafted, drafted)
		}
		drafted = s.Spec.Drafted
	}
}
