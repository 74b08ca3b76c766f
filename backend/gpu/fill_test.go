package gpu

import (
	"math"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestFillCacheOnGPU: model.FillCache (bench stack --context's fill) writes
// well-formed state on the GPU: one decode step from two filled sequences
// gives finite logits, other than a fresh sequence's, and those of the CPU
// filled alike (same random inputs): in exact numerics within 1e-3 with the
// same argmax, in faithful numerics (the compact store) logged, since its
// roundings make random weights chaotic (TestGreedyExact). Past one fill
// chunk on a real GPU, so that its rotated input pool is covered too.
func TestFillCacheOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	n := 300 // 75 CSA entries for index_topk 4
	if !g.Device().Emulated() && !testing.Short() {
		n = 8192 + 300
	}
	w := genWeights(t, checkpoint.SmallConfig(), 7)
	for _, mode := range []string{"exact", "faithful"} {
		mc, mg := twinModels(t, w, g, model.Options{CacheBytes: 64 << 20, Numerics: mode})
		lc, lg := decodeFilled(t, mc, n), decodeFilled(t, mg, n)
		for i, row := range lg {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s: GPU row %d: non-finite logit %v", mode, i, v)
				}
			}
		}
		if slices.Equal(lg[0], lg[2]) || slices.Equal(lg[1], lg[2]) {
			t.Errorf("%s: a GPU decode at depth %d gave the logits of depth 0", mode, n)
		}
		var p errProfile
		p.add(lc, lg)
		med, _, worst := p.quantiles()
		t.Logf("%s at depth %d: logits rel median %.3g max %.3g, argmax agrees on %d of %d rows", mode, n, med, worst, p.agree, len(lc))
		if mode == "exact" && (worst > 1e-3 || p.agree != len(lc)) {
			t.Errorf("exact: GPU rows off the CPU's by up to %.3g (want <= 1e-3), argmax agrees on %d of %d", worst, p.agree, len(lc))
		}
	}
}

// decodeFilled fills two sequences to n tokens, then decodes one token on
// them and on a fresh sequence; it returns the three logits rows.
func decodeFilled(t *testing.T, m *model.Model, n int) [][]float32 {
	t.Helper()
	seqs := []*kvcache.Sequence{m.Cache().NewSequence(), m.Cache().NewSequence()}
	if err := m.FillCache(seqs, n, 11); err != nil {
		t.Fatal(err)
	}
	b := &model.Batch{}
	for _, s := range append(seqs, m.Cache().NewSequence()) {
		b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: []int32{7}})
		defer m.FreeSequence(s)
	}
	out, err := m.Forward(b)
	if err != nil {
		t.Fatal(err)
	}
	rows := make([][]float32, len(b.Items))
	for i := range rows {
		rows[i] = out.Last(i)
	}
	return rows
}
