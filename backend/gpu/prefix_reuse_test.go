package gpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/model"
)

// TestPrefixReuseOnGPU: on the GPU, the copy of a running sequence's slot and
// partial block taken mid-prefill (KeepCopy, at a thinking chat's prompt but
// its generation prefix) is not disturbed by that sequence's later steps,
// which write into the copied block: a follow-up diverging there hits it and
// computes the same logits as one that computed its whole prompt, chunked
// alike: its prefill rows and three teacher-forced decode steps.
func TestPrefixReuseOnGPU(t *testing.T) {
	for _, numerics := range []string{"faithful", "exact"} {
		t.Run(numerics, func(t *testing.T) {
			m, w := prefixModel(t, numerics)
			cache := m.Cache()
			r := rand.New(rand.NewPCG(9, 10))
			rnd := func(n int) []int32 {
				v := make([]int32, n)
				for i := range v {
					v[i] = int32(r.IntN(w.Config.Vocab))
				}
				return v
			}
			const at = 300 // the reuse point: one block and 44 tokens
			a := rnd(at + 1)
			b := slices.Concat(a[:at], rnd(40))
			forced := rnd(3)
			// run computes tokens from the hit on in chunks ending at 256,
			// at and the prompt's end (keeping a copy at at when keep), then
			// forced one by one; it returns the hit and every row's logits
			// after position at.
			run := func(tokens []int32, salt string, keep bool) (int, [][]float32) {
				s := cache.NewSequence()
				defer m.FreeSequence(s)
				hit := cache.Match(s, tokens, salt)
				var rows [][]float32
				all := slices.Concat(tokens, forced)
				step := func(toks []int32) {
					o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks, AllLogits: true}}})
					if err != nil {
						t.Fatal(err)
					}
					if s.Len() > at {
						rows = append(rows, o.Rows(0)...)
					}
					cache.Commit(s, all)
					if keep && s.Len() == at {
						cache.KeepCopy(s, tokens[:at])
					}
				}
				for _, cut := range []int{256, at, len(tokens)} {
					if s.Len() < cut {
						step(tokens[s.Len():cut])
					}
				}
				for _, tk := range forced {
					step([]int32{tk})
				}
				return hit, rows
			}
			if hit, _ := run(a, "", true); hit != 0 {
				t.Fatalf("cold hit %d", hit)
			}
			_, want := run(b, "other tenant", false) // no hit: a's copy is under another salt
			hit, got := run(b, "", false)
			if hit != at || len(got) != len(want) {
				t.Fatalf("hit %d, %d rows, want %d and %d", hit, len(got), at, len(want))
			}
			var worst float64
			for i := range want {
				for j := range want[i] {
					worst = max(worst, math.Abs(float64(got[i][j])-float64(want[i][j])))
				}
			}
			t.Logf("%d rows after the hit: max |difference| %.3g", len(want), worst)
			if worst != 0 {
				t.Errorf("logits after a hit on a reuse point differ from the uncached run's by up to %.3g", worst)
			}
		})
	}
}
