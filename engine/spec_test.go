package engine

import (
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/megamoe/megamoe/grammar"
)

func toyRequests(n, maxTokens int, params func(i int) SamplingParams) []*Request {
	var reqs []*Request
	for i := range n {
		p := make([]int32, 3+i*5)
		for j := range p {
			p[j] = int32((i*7 + j*3) % 50)
		}
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: maxTokens, Params: params(i)})
	}
	return reqs
}

func equalOutputs(t *testing.T, want, got [][]int32) {
	t.Helper()
	for i := range want {
		if !slices.Equal(want[i], got[i]) {
			t.Fatalf("request %d: with drafts %v\nwithout %v", i, got[i], want[i])
		}
	}
}

// Greedy outputs with drafts are those of plain decoding, for every draft
// count, with perfect and with missing drafts, batched, with max_tokens,
// stop tokens and min_tokens falling inside a step's drafts; the cache is
// empty afterwards.
func TestSpecGreedyMatchesPlain(t *testing.T) {
	greedy := func(int) SamplingParams { return SamplingParams{} }
	plain, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 4096, MaxBatchTokens: 16}, toyRequests(6, 30, greedy))
	for _, tc := range []struct {
		k      int
		missOf uint32
	}{{1, 0}, {3, 0}, {3, 3}, {5, 2}, {8, 4}} {
		t.Run(fmt.Sprintf("k=%d miss=%d", tc.k, tc.missOf), func(t *testing.T) {
			for _, maxTok := range []int{1, 2, 5, 30} {
				reqs := toyRequests(6, maxTok, greedy)
				// Stop tokens: the 4th generated token of request 2 and the 7th of request 4.
				reqs[2].StopTokens = []int32{plain[2][3]}
				reqs[4].StopTokens = []int32{plain[4][6]}
				// min_tokens holds back the 2nd generated token of request 1 as a stop.
				reqs[1].StopTokens, reqs[1].MinTokens = []int32{plain[1][1]}, min(6, maxTok)
				want, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 4096, MaxBatchTokens: 16}, reqs)
				m := newToySpec(newToy(t, 1<<20), tc.missOf)
				got, e := runEngine(t, m, Config{MaxModelLen: 4096, MaxBatchTokens: 16, Speculative: SpecConfig{Method: "mtp", NumTokens: tc.k}}, reqs)
				equalOutputs(t, want, got)
				st := e.Stats().Spec
				if maxTok > 2 && (st.Accepted == 0 || tc.missOf > 0 && st.Accepted == st.Drafted) {
					t.Errorf("max_tokens %d: %d of %d drafts accepted", maxTok, st.Accepted, st.Drafted)
				}
				var perPos int64
				for _, n := range st.PerPos {
					perPos += n
				}
				// A verification that ends its sequence on an accepted draft emits no extra token.
				if perPos != st.Accepted || st.Emitted > st.Steps+st.Accepted || st.Emitted < st.Accepted {
					t.Errorf("stats %+v do not add up", st)
				}
				if u := m.cache.UsedBytes(); u != 0 {
					t.Errorf("cache holds %d bytes after all finished", u)
				}
			}
		})
	}
}

// With a cache so small that sequences are preempted (and their drafting
// state with them), greedy outputs with drafts are still plain decoding's.
var capTest = 6200

func TestSpecPreemption(t *testing.T) {
	greedy := func(int) SamplingParams { return SamplingParams{} }
	reqs := toyRequests(6, 12, greedy)
	want, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 1024, MaxBatchTokens: 16}, reqs)
	m := newToySpec(newToy(t, 3*1000+6*16), 3) // three states (a spare is one), six blocks
	got, e := runEngine(t, m, Config{MaxModelLen: 1024, MaxBatchTokens: 16, Speculative: SpecConfig{Method: "mtp", NumTokens: 3}}, reqs)
	equalOutputs(t, want, got)
	if st := e.Stats(); st.Preemptions == 0 || st.Spec.Accepted == 0 {
		t.Errorf("%d preemptions, %d drafts accepted: want both", st.Preemptions, st.Spec.Accepted)
	}
	if u := m.cache.UsedBytes(); u != 0 {
		t.Errorf("cache holds %d bytes after all finished", u)
	}
}

// Seeded sampling with drafts is reproducible, and n identical requests
// (n > 1) with other seeds get their own outputs.
func TestSpecSeededReproducible(t *testing.T) {
	sampled := func(i int) SamplingParams {
		return SamplingParams{Temperature: 0.9, TopP: 0.95, Seed: seed(uint64(i % 2)), Logprobs: true, TopLogprobs: 2}
	}
	cfg := Config{MaxModelLen: 4096, MaxBatchTokens: 32, Speculative: SpecConfig{Method: "mtp", NumTokens: 3}}
	a, e := runEngine(t, newToySpec(newToy(t, 1<<20), 3), cfg, toyRequests(4, 25, sampled))
	b, _ := runEngine(t, newToySpec(newToy(t, 1<<20), 3), cfg, toyRequests(4, 25, sampled))
	equalOutputs(t, a, b)
	if st := e.Stats().Spec; st.Accepted == 0 {
		t.Errorf("no draft accepted: %+v", st)
	}
}

// Constrained outputs with drafts: drafts outside the grammar are rejected,
// greedy outputs equal plain constrained decoding, sampled ones match the
// grammar.
func TestSpecConstrained(t *testing.T) {
	table, vocab, eos := toyTable(t)
	const pattern = `(ab|c)[0-9]{2}x?`
	g, err := grammar.CompileRegex(pattern)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^(?:` + pattern + `)$`)
	for _, temp := range []float64{0, 1.2} {
		mk := func(i int) SamplingParams { return SamplingParams{Temperature: temp, Seed: seed(uint64(i))} }
		reqs := toyRequests(5, 40, mk)
		for _, r := range reqs {
			r.StopTokens = []int32{eos}
			r.Constraint = &Constraint{Grammar: g, Table: table}
		}
		got, e := runEngine(t, newToySpec(newToy(t, 1<<20), 0), Config{MaxModelLen: 200, Speculative: SpecConfig{Method: "mtp", NumTokens: 4}}, reqs)
		// The drafter ignores the grammar: only the mask rejects its drafts.
		if st := e.Stats().Spec; st.Accepted == 0 || st.Accepted == st.Drafted {
			t.Errorf("temperature %g: %d of %d drafts accepted, want some rejected by the grammar", temp, st.Accepted, st.Drafted)
		}
		if temp == 0 {
			want, _ := runEngine(t, newToy(t, 1<<20), Config{MaxModelLen: 200}, reqs)
			equalOutputs(t, want, got)
		}
		for i, toks := range got {
			var text strings.Builder
			for _, id := range toks[:len(toks)-1] {
				text.Write(vocab[id])
			}
			if toks[len(toks)-1] != eos || !re.MatchString(text.String()) {
				t.Errorf("temperature %g request %d: output %q (%v) does not match %s", temp, i, text.String(), toks, pattern)
			}
		}
	}
}

func TestSpecConfigErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"method":"mtp","num_speculative_tokens":2}`, ""},
		{`{"method":"mtp","num_speculative_tokens":0}`, "num_speculative_tokens 0 out of [1, 8]"},
		{`{"method":"mtp","num_speculative_tokens":9}`, "num_speculative_tokens 9"},
		{`{"method":"eagle","num_speculative_tokens":2}`, `method "eagle" unsupported, want "mtp" or "dspark"`},
		{`{"method":"dspark","num_speculative_tokens":2}`, ""},
		{`{"method":"dspark"}`, ""},
		{`{"method":"dspark","num_speculative_tokens":65}`, "num_speculative_tokens 65 out of [1, dspark_block_size]"},
		{`{"method":"dspark","num_speculative_tokens":-1}`, "num_speculative_tokens -1"},
		{`{"method":"mtp","num_speculative_tokens":2,"draft_tp":1}`, `unknown field "draft_tp"`},
		{`{"method":"mtp","num_speculative_tokens":"2"}`, "num_speculative_tokens"},
		{`{"method":"mtp"`, "unexpected EOF"},
		{`{"method":"mtp","num_speculative_tokens":2} x`, "trailing data"},
	} {
		_, err := ParseSpecConfig(tc.in)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.in, err, tc.want)
		}
	}
	// A model without a drafter is refused at start.
	_, err := New(newToy(t, 1<<20), Config{MaxModelLen: 64, Speculative: SpecConfig{Method: "mtp", NumTokens: 2}})
	if err == nil || !strings.Contains(err.Error(), "cannot draft") {
		t.Errorf("engine without a drafter: %v", err)
	}
	// More drafts than the model's cache has slack for are refused at start.
	_, err = New(slackSpec{newToySpec(newToy(t, 1<<20), 0), 1}, Config{MaxModelLen: 64, Speculative: SpecConfig{Method: "mtp", NumTokens: 2}})
	if err == nil || !strings.Contains(err.Error(), "slack for 1 drafts") {
		t.Errorf("engine with 2 drafts on a model with slack 1: %v", err)
	}
}

// slackSpec is a Speculator whose cache has slack for n drafts.
type slackSpec struct {
	*toySpec
	n int
}

func (s slackSpec) Drafts() int { return s.n }

// TestSpeculativeSamplingChiSquare: drafts drawn from q and passed through
// the acceptance rule come out distributed as the target p (temperature,
// top-k, top-p, min-p applied), on a vocabulary of 8: Pearson's chi-square
// over a fixed seed's 40000 draws stays under the 0.1% critical value, and
// tokens the filters remove never come out.
func TestSpeculativeSamplingChiSquare(t *testing.T) {
	target := []float32{2, 1.5, 1, 0.2, -1, 3, 0, 0.5}
	draft := []float32{0, 2, 2, 1, 1, 0, 3, -2} // a poor drafter: much rejection
	// 0.1% critical values of chi-square by degrees of freedom.
	crit := map[int]float64{1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}
	for _, p := range []SamplingParams{
		{Temperature: 1},
		{Temperature: 0.7, TopK: 4},
		{Temperature: 1.3, TopP: 0.8},
		{Temperature: 1, MinP: 0.2},
		{Temperature: 1, TopK: 6, TopP: 0.9, MinP: 0.05, LogitBias: map[int32]float32{4: 2}},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			p.Seed = seed(11)
			s := NewSampler(p, nil)
			want := s.targetDist(target, nil)
			const n = 40000
			counts := make([]int, len(target))
			accepted := 0
			for range n {
				q := s.draftDist(draft)
				d := s.drawFrom(q)
				id, ok := s.acceptDraft(d, s.targetDist(target, nil), q)
				counts[id]++
				if ok {
					accepted++
				}
			}
			var chi float64
			df := -1
			for i, pi := range want {
				if pi == 0 {
					if counts[i] != 0 {
						t.Errorf("token %d has probability 0 but came out %d times", i, counts[i])
					}
					continue
				}
				df++
				e := pi * n
				chi += (float64(counts[i]) - e) * (float64(counts[i]) - e) / e
			}
			t.Logf("chi-square %.2f (df %d), %d of %d drafts accepted", chi, df, accepted, n)
			if df > 0 && chi > crit[df] {
				t.Errorf("chi-square %.2f > %.2f (df %d): counts %v, target %v", chi, crit[df], df, counts, want)
			}
			if accepted == 0 || accepted == n {
				t.Errorf("%d of %d accepted: the rule is not exercised", accepted, n)
			}
		})
	}
}

// The target distribution is the one Sample draws from.
func TestTargetDistMatchesSample(t *testing.T) {
	x := []float32{2, 1.5, 1, 0.2, -1, 3, 0, float32(math.NaN())}
	p := SamplingParams{Temperature: 0.8, TopK: 5, TopP: 0.9, Seed: seed(4)}
	s := NewSampler(p, nil)
	want := s.targetDist(x, nil)
	const n = 40000
	counts := make([]float64, len(x))
	for range n {
		counts[s.Sample(x).ID]++
	}
	for i := range x {
		if d := math.Abs(counts[i]/n - want[i]); d > 0.01 || want[i] == 0 && counts[i] > 0 {
			t.Errorf("token %d: sampled %.4f, target %.4f", i, counts[i]/n, want[i])
		}
	}
}

// The periodic log line reports the acceptance since the previous one.
func TestSpecReport(t *testing.T) {
	var buf strings.Builder
	sp, err := newSpeculator(newToySpec(newToy(t, 1<<20), 0), SpecConfig{Method: "mtp", NumTokens: 2},
		Config{MaxModelLen: 64, MaxBatchTokens: 16, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []SpecStats{{Steps: 4, Drafted: 8, Accepted: 6, Emitted: 10, PerPos: []int64{4, 2}},
		{Steps: 6, Drafted: 12, Accepted: 7, Emitted: 13, PerPos: []int64{5, 2}}} {
		sp.stats, sp.logged = st, time.Now().Add(-2*specLogEvery)
		sp.report()
		want := []string{"verifications=4 drafted=8 accepted=6", "mean_acceptance_length=2.5 per_position=1.00,0.50",
			"verifications=2 drafted=4 accepted=1", "mean_acceptance_length=1.5 per_position=0.50,0.00"}[2*i:][:2]
		for _, w := range want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("log %q lacks %q", buf.String(), w)
			}
		}
	}
}
