package gpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestPrefixPartialOnGPU: on the GPU, a sequence that hits the kept end of
// an earlier one mid-block (its slot and partial block copied: CopySlot,
// CopyBlock) computes the same logits as one that computed its whole
// prompt, chunked alike: its prefill rows and three teacher-forced decode
// steps; two such hits at once each get their own copies.
func TestPrefixPartialOnGPU(t *testing.T) {
	for _, numerics := range []string{"faithful", "exact"} {
		t.Run(numerics, func(t *testing.T) {
			m, w := prefixModel(t, numerics)
			cache := m.Cache()
			r := rand.New(rand.NewPCG(7, 8))
			rnd := func(n int) []int32 {
				v := make([]int32, n)
				for i := range v {
					v[i] = int32(r.IntN(w.Config.Vocab))
				}
				return v
			}
			const end = 300 // the first request's end: one block and 44 tokens
			a := rnd(end)
			forced := rnd(3)
			// step runs toks on each sequence (one batch) and commits them.
			step := func(seqs []*seqRun, toks func(*seqRun) []int32) {
				var items []model.BatchItem
				for _, q := range seqs {
					items = append(items, model.BatchItem{Seq: q.s, Tokens: toks(q), AllLogits: true})
				}
				o, err := m.Forward(&model.Batch{Items: items})
				if err != nil {
					t.Fatal(err)
				}
				for i, q := range seqs {
					if q.s.Len() > end {
						q.rows = append(q.rows, o.Rows(i)...)
					}
					cache.Commit(q.s, slices.Concat(q.tokens, forced))
				}
			}
			// run computes the sequences' tokens from their hits in chunks
			// ending at 256 and at `end`, then forced one by one.
			run := func(salt string, prompts ...[]int32) []*seqRun {
				var seqs []*seqRun
				for _, p := range prompts {
					q := &seqRun{s: cache.NewSequence(), tokens: p}
					q.hit = cache.Match(q.s, p, salt)
					seqs = append(seqs, q)
				}
				for _, cut := range []int{256, end, len(prompts[0])} {
					if seqs[0].s.Len() < cut {
						step(seqs, func(q *seqRun) []int32 { return q.tokens[q.s.Len():cut] })
					}
				}
				if len(prompts[0]) > end {
					for _, tk := range forced {
						step(seqs, func(*seqRun) []int32 { return []int32{tk} })
					}
				}
				return seqs
			}
			// a is computed twice in one batch, as b and c's first 300
			// tokens are below: GPU kernels are not batch-invariant, so the
			// kept state must come from the same batch shapes.
			firsts := run("", a, a)
			cache.Keep(firsts[0].s, a)
			for _, q := range firsts {
				m.FreeSequence(q.s)
			}
			b, c := slices.Concat(a, rnd(40)), slices.Concat(a, rnd(40))
			want := run("other tenant", b, c) // no hit: a's blocks are under another salt
			got := run("", b, c)
			for i, q := range got {
				if q.hit != end || len(q.rows) != len(want[i].rows) || want[i].hit != 0 {
					t.Fatalf("sequence %d: hit %d, %d rows; uncached hit %d, %d rows", i, q.hit, len(q.rows), want[i].hit, len(want[i].rows))
				}
				var worst float64
				for j := range q.rows {
					for k := range q.rows[j] {
						worst = max(worst, math.Abs(float64(q.rows[j][k])-float64(want[i].rows[j][k])))
					}
				}
				t.Logf("sequence %d: %d rows after the hit: max |difference| %.3g", i, len(q.rows), worst)
				if worst != 0 {
					t.Errorf("sequence %d: logits after a partial-block hit differ from the uncached run's by up to %.3g", i, worst)
				}
			}
			for _, q := range slices.Concat(want, got) {
				m.FreeSequence(q.s)
			}
		})
	}
}

// seqRun is one sequence of TestPrefixPartialOnGPU: its prompt, hit and
// logits rows after the first request's end.
type seqRun struct {
	s      *kvcache.Sequence
	tokens []int32
	hit    int
	rows   [][]float32
}
