package gpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// openLongGPU opens a GPU for a long-context test; the PTX emulator would
// take hours over these lengths.
func openLongGPU(t *testing.T) *Backend {
	t.Helper()
	if testing.Short() {
		t.Skip("long context")
	}
	g := openGPU(t, Options{})
	if g.Device().Emulated() {
		t.Skip("long context: too slow in the PTX emulator")
	}
	return g
}

func randomTokens(n, vocab int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 9))
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(r.IntN(vocab))
	}
	return p
}

// TestLongContextGreedy: a 32,768-token prompt on checkpoint.LongConfig (SWA,
// CSA with index_topk 8 of up to 8,192 entries, HCA; positions 8x past YaRN's
// original context), prefilled in chunks of 1,000, then 16 greedy steps. In
// exact numerics, as TestGreedyExact at short length, the GPU's greedy tokens
// must equal the CPU's and the logits rows be within 1e-3 (median 1e-4) but
// for at most 0.1 % of them: over 32K rows an indexer score near-tie (the
// 8th and 9th of 8,192 within summation-order noise) may select another
// entry for a row. The model test TestLongContext checks the CPU itself over
// the same lengths.
func TestLongContextGreedy(t *testing.T) {
	g := openLongGPU(t)
	c := checkpoint.LongConfig()
	c.MoEInter = 128 // the GPU's expert kernels tile inter by 128
	w := genWeights(t, c, 5)
	mc, mg := twinModels(t, w, g, model.Options{CacheBytes: 256 << 20, Numerics: "exact"})
	prompt := randomTokens(32768, w.Config.Vocab, 13)
	start := time.Now()
	tg, lg := greedy(t, mg, prompt, 1000, 16)
	mid := time.Now()
	tc, lc := greedy(t, mc, prompt, 1000, 16)
	var p errProfile
	p.add(lc, lg)
	med, p90, worst := p.quantiles()
	over := 0
	for _, r := range p.rels {
		if r > 1e-3 {
			over++
		}
	}
	t.Logf("gpu %v, cpu %v; greedy cpu %v gpu %v; logits rel median %.3g p90 %.3g max %.3g (%d rows > 1e-3), argmax %d/%d rows",
		mid.Sub(start).Round(time.Millisecond), time.Since(mid).Round(time.Millisecond), tc, tg, med, p90, worst, over, p.agree, len(p.rels))
	if !slices.Equal(tc, tg) {
		t.Errorf("greedy tokens differ: cpu %v gpu %v", tc, tg)
	}
	if med > 1e-4 || over > len(p.rels)/1000 || math.IsInf(worst, 0) {
		t.Errorf("logits rel median %.3g, %d of %d rows > 1e-3, max %.3g: want median <= 1e-4, at most 0.1 %% of rows > 1e-3, all finite",
			med, over, len(p.rels), worst)
	}
}

// longTokensEnv names the context length of TestContextMillion; unset, the
// test skips (it is a manual run: about a minute on an H100).
const longTokensEnv = "MEGAMOE_LONG_TOKENS"

// TestContextMillion runs the small model (checkpoint.SmallConfig, whose
// max_position_embeddings is 1,048,576) to $MEGAMOE_LONG_TOKENS tokens on
// the GPU in faithful numerics: prefill in chunks of 2,048, then 16 decode
// steps ending at the last position. Every logit of the last chunk and of
// the decode steps must be finite. It logs the device memory the cache took
// against kvcache's prediction (`bench kv --preset small --context N`) and
// the step workspace's peak.
//
//	MEGAMOE_LONG_TOKENS=1048576 go test ./backend/gpu -run TestContextMillion -v -timeout 30m
func TestContextMillion(t *testing.T) {
	env := os.Getenv(longTokensEnv)
	if env == "" {
		t.Skipf("set %s (e.g. 1048576) to run", longTokensEnv)
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 4096 || n > 1<<20 {
		t.Fatalf("%s=%q: want a token count in [4096, 1048576]", longTokensEnv, env)
	}
	g := openLongGPU(t)
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	opts := model.Options{MaxSeqs: 1} // one state slot, as bench kv's one sequence
	store := model.StoreFor(backend.Faithful)
	layout, err := kvcache.LayoutFromConfig(c, kvcache.DefaultBlockTokens, store)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := kvcache.FootprintFromConfig(c, store)
	if err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		f, _, err := g.Context().MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		return int64(f)
	}
	// The weights and a one-block cache first, then the same weights with the
	// cache of one n-token sequence: the difference is the bigger cache.
	small := kvcache.NewManager(layout, 1<<62).BytesFor(kvcache.DefaultBlockTokens)
	f0 := free()
	opts.CacheBytes = small
	if _, err := model.New(w, g, opts); err != nil {
		t.Fatal(err)
	}
	f1 := free()
	opts.CacheBytes = kvcache.NewManager(layout, 1<<62).BytesFor(n)
	m, err := model.New(w, g, opts)
	if err != nil {
		t.Fatal(err)
	}
	f2 := free()
	cacheGot := (f1 - f2) - (f0 - f1) + small
	gib := func(b int64) string { return fmt.Sprintf("%.3f GiB", float64(b)/(1<<30)) }
	t.Logf("%s store, %d tokens: cache allocated %s (manager capacity %s, %d blocks, %d slots); bench kv predicts %s (%.2f bytes/token + %d fixed)",
		store, n, gib(cacheGot), gib(opts.CacheBytes), m.Cache().MaxBlocks(), m.Cache().MaxSlots(), gib(fp.BytesAt(n)), fp.PerToken(), fp.Fixed())

	const chunk, decode = 2048, 16
	toks := randomTokens(n, c.Vocab, 3)
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	minFree := f2
	finite := func(rows [][]float32, at int) {
		for r, row := range rows {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("non-finite logit at position %d", at+r)
				}
			}
		}
	}
	start := time.Now()
	pre := n - decode
	for i := 0; i < n; {
		k := min(chunk, pre-i)
		if i >= pre {
			k = 1
		}
		last := i+k >= pre
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[i : i+k], AllLogits: last}}})
		if err != nil {
			t.Fatalf("forward at position %d: %v", i, err)
		}
		if last {
			finite(o.Rows(0), i)
		}
		minFree = min(minFree, free())
		if i%(64*chunk) == 0 {
			t.Logf("position %d: %v", i, time.Since(start).Round(time.Millisecond))
		}
		i += k
	}
	t.Logf("%d tokens in %v; step workspace peak %s (device free %s at the end)", n, time.Since(start).Round(time.Millisecond), gib(f2-minFree), gib(minFree))
}
