package engine

import (
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestPrefixCachePartialBlocks: hits that end mid-block, at the exact end of
// an earlier request (its kept partial block, copied on write), give the
// outputs of the uncached run: bit-identical logprobs in exact numerics,
// greedy tokens in faithful numerics. Each case's waves may be built from
// the uncached run's answers (a chat's next turn resends them).
func TestPrefixCachePartialBlocks(t *testing.T) {
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "m"), checkpoint.GenSpec{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	V := w.Config.Vocab
	greedy := func(p []int32, n int) *Request {
		return &Request{Prompt: p, MaxTokens: n, Params: SamplingParams{Logprobs: true, TopLogprobs: 3}}
	}
	p1 := seqTokens(300, 21, V) // one full block and 44 tokens
	// turns builds a chat: each turn resends the previous prompt and answer.
	turns := func(n, answer int, adds ...[]int32) func(run func([][]*Request) prefixRun) ([][]*Request, []int) {
		return func(run func([][]*Request) prefixRun) ([][]*Request, []int) {
			var waves [][]*Request
			var hits []int
			prompt := adds[0]
			for i := range n {
				waves = append(waves, []*Request{greedy(prompt, answer)})
				if i+1 == n {
					break
				}
				out := run(waves[len(waves)-1:]).tokens[0]
				hits = append(hits, len(prompt)+len(out)-1) // the last token was sampled, not computed
				prompt = cat(prompt, out, adds[i+1])
			}
			return waves, append([]int{0}, hits...)
		}
	}
	fixed := func(hits []int, waves ...[]*Request) func(func([][]*Request) prefixRun) ([][]*Request, []int) {
		return func(func([][]*Request) prefixRun) ([][]*Request, []int) { return waves, hits }
	}
	suffixes := func(n int) []*Request {
		var r []*Request
		for i := range n {
			r = append(r, greedy(cat(p1, seqTokens(5+7*i, 30+i, V)), 5))
		}
		return r
	}
	cases := []struct {
		name      string
		cfg       Config
		cacheB    func(l kvcache.Layout) int64
		build     func(run func([][]*Request) prefixRun) ([][]*Request, []int)
		preempted bool
		spec      bool // greedy tokens only: drafts change the verification batches
		slow      bool
	}{
		{name: "next turns hit the previous request's end mid-block", cfg: Config{MaxModelLen: 2048},
			build: turns(3, 8, p1, seqTokens(20, 22, V), seqTokens(230, 23, V)), slow: true},
		{name: "thinking turns hit the previous prompt but its generation prefix", cfg: Config{MaxModelLen: 2048},
			// Turn 2's prompt but its last token ends on a block boundary.
			build: thinkingTurns(8, 3, int32(V-1), int32(V-2), seqTokens(299, 41, V), seqTokens(207, 42, V), seqTokens(20, 43, V)), slow: true},
		{name: "chunked thinking turns", cfg: Config{MaxModelLen: 2048, MaxBatchTokens: 48},
			build: thinkingTurns(6, 2, int32(V-1), int32(V-2), seqTokens(100, 44, V), seqTokens(150, 45, V), seqTokens(30, 46, V)), slow: true},
		{name: "MTP drafts after a partial hit", cfg: Config{MaxModelLen: 2048, Speculative: SpecConfig{Method: "mtp", NumTokens: 2}},
			build: turns(2, 12, p1, seqTokens(30, 29, V)), spec: true, slow: true},
		{name: "concurrent sequences copy one partial block", cfg: Config{MaxModelLen: 2048, MaxNumSeqs: 3},
			build: fixed([]int{0, 300, 300, 300}, []*Request{greedy(p1, 1)}, suffixes(3)), slow: true},
		{name: "chunked prefill after a partial hit", cfg: Config{MaxModelLen: 2048, MaxBatchTokens: 48},
			build: fixed([]int{0, 300}, []*Request{greedy(p1, 1)}, []*Request{greedy(cat(p1, seqTokens(150, 24, V)), 6)}), slow: true},
		{name: "the hit evicts the partial block it copies", cfg: Config{MaxModelLen: 1024},
			// The first request leaves its block 0, a snapshot at 256 and its
			// partial block with its slot: the cache is full, and the hit's
			// slot and block can only come from evicting what it copies.
			cacheB: func(l kvcache.Layout) int64 { return 2*l.StateBytes + 2*l.BlockBytes },
			build:  fixed([]int{0, 300}, []*Request{greedy(p1, 1)}, []*Request{greedy(cat(p1, seqTokens(9, 25, V)), 6)})},
		{name: "preemption with kept ends", cfg: Config{MaxModelLen: 1024, MaxBatchTokens: 64},
			// Two slots and four blocks: the first request's decode into its
			// third block preempts the second, which resumes from its end.
			cacheB: func(l kvcache.Layout) int64 { return 2*l.StateBytes + 4*l.BlockBytes },
			build: fixed([]int{0, 0}, []*Request{greedy(cat(p1, seqTokens(200, 26, V)), 60),
				greedy(cat(seqTokens(200, 27, V), seqTokens(40, 28, V)), 60)}),
			preempted: true, slow: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.slow && testing.Short() {
				t.Skip("slow")
			}
			for _, numerics := range []string{"exact", "faithful"} {
				if numerics == "faithful" && testing.Short() {
					continue
				}
				capB := int64(256 << 20)
				if c.cacheB != nil {
					m, err := model.New(w, nil, model.Options{Numerics: numerics, Drafts: c.cfg.Speculative.Drafts()})
					if err != nil {
						t.Fatal(err)
					}
					capB = c.cacheB(m.Cache().Layout())
				}
				off, on := c.cfg, c.cfg
				on.PrefixCaching = true
				waves, hits := c.build(func(ws [][]*Request) prefixRun { return runWaves(t, w, numerics, capB, off, ws) })
				ref := runWaves(t, w, numerics, capB, off, waves)
				got := runWaves(t, w, numerics, capB, on, waves)
				for i := range ref.tokens {
					if !slices.Equal(got.tokens[i], ref.tokens[i]) {
						t.Errorf("%s: request %d: tokens %v, without the cache %v", numerics, i, got.tokens[i], ref.tokens[i])
					}
					if numerics == "exact" && !c.spec && !slices.EqualFunc(got.logprobs[i], ref.logprobs[i], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Errorf("%s: request %d: logprobs differ from the uncached run", numerics, i)
					}
				}
				t.Logf("%s: cached tokens %v, preemptions %d, drafts accepted %d/%d (%d/%d without the cache)", numerics, got.cached,
					got.stats.Preemptions, got.stats.Spec.Accepted, got.stats.Spec.Drafted, ref.stats.Spec.Accepted, ref.stats.Spec.Drafted)
				if !slices.Equal(got.cached, hits) {
					t.Errorf("%s: cached tokens %v, want %v", numerics, got.cached, hits)
				}
				if s := got.stats.Spec; c.spec && (s.Drafted == 0 || s.Steps <= ref.stats.Spec.Steps/2) {
					t.Errorf("%s: %d drafts in %d verifications, %d without the cache", numerics, s.Drafted, s.Steps, ref.stats.Spec.Steps)
				}
				if c.preempted && got.stats.Preemptions == 0 {
					t.Errorf("%s: no preemption", numerics)
				}
			}
		})
	}
}
