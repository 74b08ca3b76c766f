package gpu

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestPrefixCacheOnGPU: on the GPU, a sequence restored from the prefix cache
// (shared block, slot copied from the snapshot) computes the same logits as
// one that computed its whole prompt, chunked alike (so every kernel sees the
// same shapes): its prefill rows and three teacher-forced decode steps.
func TestPrefixCacheOnGPU(t *testing.T) {
	for _, numerics := range []string{"faithful", "exact"} {
		t.Run(numerics, func(t *testing.T) {
			m, w := prefixModel(t, numerics)
			cache := m.Cache()
			r := rand.New(rand.NewPCG(5, 6))
			rnd := func(n int) []int32 {
				v := make([]int32, n)
				for i := range v {
					v[i] = int32(r.IntN(w.Config.Vocab))
				}
				return v
			}
			a := rnd(300)
			b := slices.Concat(a[:256], rnd(40))
			forced := rnd(3)
			// run computes tokens from the hit on (chunks of 256 from the
			// start), then forced one by one; it returns the hit and every
			// row's logits after position 256.
			run := func(tokens []int32, salt string) (int, [][]float32) {
				s := cache.NewSequence()
				defer m.FreeSequence(s)
				hit := cache.Match(s, tokens, salt)
				var rows [][]float32
				step := func(toks []int32) {
					o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks, AllLogits: true}}})
					if err != nil {
						t.Fatal(err)
					}
					if s.Len() > 256 {
						rows = append(rows, o.Rows(0)...)
					}
					cache.Commit(s, slices.Concat(tokens, forced))
				}
				for p := hit; p < len(tokens); p = min(p+256, len(tokens)) {
					step(tokens[p:min(p+256, len(tokens))])
				}
				for _, tk := range forced {
					step([]int32{tk})
				}
				return hit, rows
			}
			if hit, _ := run(a, ""); hit != 0 {
				t.Fatalf("cold hit %d", hit)
			}
			_, want := run(b, "other tenant") // no hit: a's blocks are under another salt
			hit, got := run(b, "")
			if hit != 256 || len(got) != len(want) {
				t.Fatalf("hit %d, %d rows, want 256 and %d", hit, len(got), len(want))
			}
			var worst float64
			for i := range want {
				for j := range want[i] {
					worst = max(worst, math.Abs(float64(got[i][j])-float64(want[i][j])))
				}
			}
			t.Logf("%d rows after the hit: max |difference| %.3g", len(want), worst)
			if worst != 0 {
				t.Errorf("logits after a prefix cache hit differ from the uncached run's by up to %.3g", worst)
			}
		})
	}
}

// prefixModel is the small checkpoint on the GPU in the given numerics with
// prefix caching on.
func prefixModel(t *testing.T, numerics string) (*model.Model, *checkpoint.Weights) {
	t.Helper()
	g := openGPU(t, Options{})
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "m"), checkpoint.GenSpec{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := model.New(w, g, model.Options{Numerics: numerics, CacheBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Cache().EnablePrefixCaching(); err != nil {
		t.Fatal(err)
	}
	return m, w
}
