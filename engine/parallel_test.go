package engine

import (
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestParallelModelInEngine: the engine drives a model split over 2 CPU
// ranks exactly like a single one: with a KV cache so small that sequences
// are preempted and recomputed, greedy and seeded-sampled outputs equal the
// single-rank model's with a roomy cache (exact numerics), and every rank's
// cache (the mirrors included) is empty afterwards.
func TestParallelModelInEngine(t *testing.T) {
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "tp"), checkpoint.GenSpec{Seed: 3, Preset: "small-tp"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := 4
	if testing.Short() {
		n = 2 // one greedy, one sampled: still preempted
	}
	var reqs []*Request
	for i := range n {
		p := make([]int32, 246+i*3) // KV blocks hold 256 tokens: decode crosses into a second
		for j := range p {
			p[j] = int32((i*131 + j*17) % w.Config.Vocab)
		}
		params := SamplingParams{}
		if i%2 == 1 {
			params = SamplingParams{Temperature: 0.9, TopP: 0.95, Seed: seed(uint64(i))}
		}
		reqs = append(reqs, &Request{Prompt: p, MaxTokens: 14, Params: params})
	}
	cfg := Config{MaxModelLen: 512, MaxBatchTokens: 128}
	single, err := model.New(w, nil, model.Options{Numerics: "exact", CacheBytes: 64 << 20, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := runEngine(t, FromModel(single), cfg, reqs)
	// Room for the prompts' first blocks but not for their growth.
	small := int64(n)*single.Cache().BytesFor(256) + 1
	p, err := model.NewParallel(w, []backend.Backend{cpu.New(cpu.Options{Threads: 1}), cpu.New(cpu.Options{Threads: 1})},
		model.Options{Numerics: "exact", CacheBytes: small})
	if err != nil {
		t.Fatal(err)
	}
	got, e := runEngine(t, FromModel(p), cfg, reqs)
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("request %d: %d tokens, single rank %d", i, len(got[i]), len(want[i]))
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("request %d token %d: %d, single rank %d", i, j, got[i][j], want[i][j])
			}
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Error("the small cache caused no preemption")
	}
	for r := range p.Ranks() {
		if u := p.Rank(r).Cache().UsedBytes(); u != 0 {
			t.Errorf("rank %d cache holds %d bytes after all finished", r, u)
		}
	}
}
