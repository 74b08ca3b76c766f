package engine

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/internal/testctx"
	"github.com/megamoe/megamoe/model"
)

// prefixRun is one engine over a fresh model: waves of requests, each wave
// submitted after the previous one finished (so its blocks are cached).
type prefixRun struct {
	tokens   [][]int32
	logprobs [][]float32 // the chosen tokens' and the top alternatives'
	stats    Stats
	cached   []int
}

func runWaves(t *testing.T, w *checkpoint.Weights, numerics string, cacheBytes int64, cfg Config, waves [][]*Request) prefixRun {
	t.Helper()
	m, err := model.New(w, nil, model.Options{Numerics: numerics, CacheBytes: cacheBytes, Threads: 2, Drafts: cfg.Speculative.Drafts()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(FromModel(m), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testctx.New(t))
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var r prefixRun
	for _, wave := range waves {
		var streams []*Stream
		for _, req := range wave {
			st, err := e.Submit(req)
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
		for _, st := range streams {
			toks, lps := collectLogprobs(t, st)
			r.tokens, r.logprobs = append(r.tokens, toks), append(r.logprobs, lps)
			r.cached = append(r.cached, st.CachedTokens())
		}
	}
	r.stats = e.Stats()
	if u := m.Cache().UsedBytes(); u != 0 {
		t.Errorf("cache holds %d bytes after all finished", u)
	}
	return r
}

func collectLogprobs(t *testing.T, st *Stream) ([]int32, []float32) {
	t.Helper()
	ctx := testctx.New(t)
	var toks []int32
	var lps []float32
	for {
		select {
		case <-st.Ready():
		case <-ctx.Done():
			t.Fatalf("stream unfinished after %d tokens: %v", len(toks), context.Cause(ctx))
		}
		for ev, ok := st.Next(); ok; ev, ok = st.Next() {
			for _, tk := range ev.Tokens {
				toks = append(toks, tk.ID)
				lps = append(lps, tk.Logprob)
				for _, a := range tk.Top {
					lps = append(lps, a.Logprob)
				}
			}
			if ev.Finish == FinishError {
				t.Fatalf("stream failed: %v", ev.Err)
			}
			if ev.Finish != FinishNone {
				return toks, lps
			}
		}
	}
}

func seqTokens(n, salt, vocab int) []int32 {
	p := make([]int32, n)
	for j := range p {
		p[j] = int32((salt*7919 + j*31 + j*j/7) % vocab)
	}
	return p
}

func cat(parts ...[]int32) []int32 { return slices.Concat(parts...) }

// TestPrefixCacheExact: outputs with the prefix cache equal those without:
// in exact numerics the logprobs of every generated token (and of the top
// alternatives) are bit-identical, in faithful numerics greedy tokens are.
func TestPrefixCacheExact(t *testing.T) {
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "m"), checkpoint.GenSpec{Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	V := w.Config.Vocab
	greedy := func(p []int32, n int) *Request {
		return &Request{Prompt: p, MaxTokens: n, Params: SamplingParams{Logprobs: true, TopLogprobs: 3}}
	}
	sys := seqTokens(300, 1, V) // a system prompt ending mid-block (and mid compressor window)
	long := seqTokens(700, 2, V)
	roomy := int64(256 << 20)
	type tc struct {
		name      string
		cfg       Config
		cacheB    func(m *model.Model) int64
		waves     [][]*Request
		wantHits  bool
		preempted bool
		slow      bool
	}
	cases := []tc{
		{name: "shared system prompt, hit ends mid-window", cfg: Config{MaxModelLen: 2048},
			waves: [][]*Request{{greedy(cat(sys, seqTokens(20, 3, V)), 6)},
				{greedy(cat(sys, seqTokens(9, 4, V)), 6), greedy(cat(sys, seqTokens(40, 5, V)), 6)}}, wantHits: true},
		{name: "chunked prefill after a hit", cfg: Config{MaxModelLen: 2048, MaxBatchTokens: 48},
			waves: [][]*Request{{greedy(long, 4)}, {greedy(cat(long, seqTokens(150, 6, V)), 6)}}, wantHits: true, slow: true},
		{name: "concurrent sequences share a prefix", cfg: Config{MaxModelLen: 2048, MaxBatchTokens: 96, MaxNumSeqs: 2},
			waves: [][]*Request{{greedy(cat(long, seqTokens(5, 7, V)), 5), greedy(cat(long, seqTokens(30, 8, V)), 5),
				greedy(cat(long[:520], seqTokens(3, 9, V)), 5), greedy(cat(long, seqTokens(1, 10, V)), 5)}}, wantHits: true, slow: true},
		{name: "decode snapshots serve the next turn", cfg: Config{MaxModelLen: 2048},
			waves: [][]*Request{{greedy(seqTokens(240, 11, V), 30)}}, wantHits: true, slow: true},
		{name: "eviction and preemption", cfg: Config{MaxModelLen: 1024, MaxBatchTokens: 64},
			// Two slots and five blocks: the third request waits, the first
			// one's decode into a fourth block preempts the second.
			cacheB: func(m *model.Model) int64 { l := m.Cache().Layout(); return 2*l.StateBytes + 5*l.BlockBytes },
			waves: [][]*Request{{greedy(cat(long, seqTokens(3, 12, V)), 4)},
				{greedy(cat(long, seqTokens(40, 13, V)), 40), greedy(cat(long[:300], seqTokens(200, 14, V)), 40), greedy(seqTokens(500, 15, V), 40)},
				{greedy(cat(long, seqTokens(2, 16, V)), 3)}}, wantHits: true, preempted: true, slow: true},
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
				capB := roomy
				if c.cacheB != nil {
					m, err := model.New(w, nil, model.Options{Numerics: numerics})
					if err != nil {
						t.Fatal(err)
					}
					capB = c.cacheB(m)
				}
				waves := c.waves
				if c.name == "decode snapshots serve the next turn" {
					waves = nil // built from the uncached run's answers below
				}
				off := c.cfg
				ref := runWaves(t, w, numerics, capB, off, c.waves)
				if waves == nil {
					// Turn 2 resends turn 1 and its answer (crossing 256 while
					// decoding) and asks more; turn 3 likewise.
					p1 := c.waves[0][0].Prompt
					p2 := cat(p1, ref.tokens[0], seqTokens(230, 17, V))
					ref2 := runWaves(t, w, numerics, capB, off, [][]*Request{{greedy(p2, 30)}})
					p3 := cat(p2, ref2.tokens[0], seqTokens(10, 18, V))
					waves = [][]*Request{{greedy(p1, 30)}, {greedy(p2, 30)}, {greedy(p3, 5)}}
				}
				ref = runWaves(t, w, numerics, capB, off, waves)
				on := c.cfg
				on.PrefixCaching = true
				got := runWaves(t, w, numerics, capB, on, waves)
				for i := range ref.tokens {
					if !slices.Equal(got.tokens[i], ref.tokens[i]) {
						t.Errorf("%s: request %d: tokens %v, without the cache %v", numerics, i, got.tokens[i], ref.tokens[i])
					}
					if numerics == "exact" && !slices.EqualFunc(got.logprobs[i], ref.logprobs[i], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Errorf("%s: request %d: logprobs differ from the uncached run", numerics, i)
					}
				}
				s := got.stats
				t.Logf("%s: cached tokens %v, queries %d hits %d, preemptions %d", numerics, got.cached, s.PrefixQueries, s.PrefixHits, s.Preemptions)
				if c.wantHits && s.PrefixHits == 0 {
					t.Errorf("%s: no prefix cache hit", numerics)
				}
				if c.preempted && s.Preemptions == 0 {
					t.Errorf("%s: no preemption", numerics)
				}
				if ref.stats.PrefixQueries != 0 || slices.Max(ref.cached) != 0 {
					t.Errorf("%s: the uncached run queried the cache", numerics)
				}
			}
		})
	}
}
