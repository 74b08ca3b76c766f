package engine

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestLongPromptBatched serves a 32,800-token prompt beside a 3,000-token one
// through the engine (steps of 512 tokens: the short prompt's decode steps
// share steps with the long one's prefill chunks) on checkpoint.LongConfig in
// exact numerics; each request's greedy tokens must equal those of the model
// run alone, whole prompt in one step.
func TestLongPromptBatched(t *testing.T) {
	if testing.Short() {
		t.Skip("long context: about a minute of CPU time")
	}
	checkLongBatched(t, []int{32800, 3000}, 8)
}

func checkLongBatched(t *testing.T, lens []int, gen int) {
	c := checkpoint.LongConfig()
	w, err := checkpoint.GenWeights(c, checkpoint.GenOfficial, 5)
	if err != nil {
		t.Fatal(err)
	}
	opts := model.Options{Numerics: "exact", CacheBytes: 256 << 20}
	alone, err := model.New(w, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(21, 22))
	var reqs []*Request
	var want [][]int32
	for _, n := range lens {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(r.IntN(c.Vocab))
		}
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: gen})
		want = append(want, greedyAlone(t, alone, p, gen))
	}
	served, err := model.New(w, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := runEngine(t, FromModel(served), Config{MaxModelLen: 40000, MaxBatchTokens: 512}, reqs)
	for i := range want {
		t.Logf("request %d (%d prompt tokens): engine %v", i, lens[i], got[i])
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d (%d prompt tokens): engine %v, model alone %v", i, lens[i], got[i], want[i])
		}
	}
}

// greedyAlone prefills prompt in one step and decodes n tokens greedily.
func greedyAlone(t *testing.T, m *model.Model, prompt []int32, n int) []int32 {
	t.Helper()
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	var out []int32
	in := prompt
	for range n {
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: in}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Argmax(o.Last(0)))
		in = out[len(out)-1:]
	}
	return out
}
