package gpu

import (
	"context"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// greedyRun decodes prompts greedily through an engine on m and
// returns the tokens (maxTok each at most).
func greedyRun(t *testing.T, m *model.Model, cfg engine.Config, prompts [][]int32, maxTok int) [][]int32 {
	t.Helper()
	out, _ := greedyRunStats(t, m, cfg, prompts, maxTok)
	return out
}

// greedyRunStats is greedyRun that also returns the engine's draft counts.
func greedyRunStats(t *testing.T, m *model.Model, cfg engine.Config, prompts [][]int32, maxTok int) ([][]int32, engine.SpecStats) {
	t.Helper()
	e, err := engine.New(engine.FromModel(m), cfg)
	must(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var streams []*engine.Stream
	for _, p := range prompts {
		st, err := e.Submit(&engine.Request{Prompt: p, MaxTokens: maxTok})
		must(t, err)
		streams = append(streams, st)
	}
	out := make([][]int32, len(streams))
	for i, st := range streams {
		for fin := engine.FinishNone; fin == engine.FinishNone; {
			select {
			case <-st.Ready():
			case <-t.Context().Done():
				t.Fatal("stream unfinished")
			}
			for ev, ok := st.Next(); ok; ev, ok = st.Next() {
				for _, tk := range ev.Tokens {
					out[i] = append(out[i], tk.ID)
				}
				if fin = ev.Finish; ev.Err != nil {
					t.Fatalf("request %d: %v", i, ev.Err)
				}
			}
		}
	}
	return out, e.Stats().Spec
}

// TestSpecEngineGraphsOnGPU: greedy decoding through the engine with MTP
// drafts on the GPU, steps recorded as CUDA graphs, drafts and verifying
// rows drawn on the device and the MTP block's inputs kept there, gives
// plain decoding's tokens (three requests of different lengths batched, so
// verifications keep different rows per sequence); the MTP passes and the
// verifications replay.
func TestSpecEngineGraphsOnGPU(t *testing.T) {
	dir, err := models.ExtractSmall()
	must(t, err)
	w, st, err := checkpoint.Load(dir)
	must(t, err)
	defer st.Close()
	prompts := [][]int32{randomTokens(9, w.Config.Vocab, 3), randomTokens(40, w.Config.Vocab, 4), randomTokens(23, w.Config.Vocab, 5)}
	const maxTok = 24
	run := func(g *Backend, spec engine.SpecConfig) [][]int32 {
		m, err := model.New(w, g, model.Options{CacheBytes: 128 << 20, Drafts: spec.Drafts()})
		must(t, err)
		defer m.Close()
		return greedyRun(t, m, engine.Config{MaxModelLen: 256, MaxBatchTokens: 64, DeviceSampling: true, Speculative: spec}, prompts, maxTok)
	}
	plain := run(openGPU(t, Options{}), engine.SpecConfig{})
	g := openGPU(t, Options{Graphs: true})
	got := run(g, engine.SpecConfig{Method: "mtp", NumTokens: 2})
	for i := range plain {
		if !slices.Equal(plain[i], got[i]) {
			t.Errorf("request %d: plain %v, with drafts %v", i, plain[i], got[i])
		}
	}
	gs := g.GraphStats()
	t.Logf("by kind %v, failed %v", gs.Kinds, gs.Failed)
	if v, mp := gs.Kinds["verify"], gs.Kinds["mtp"]; len(gs.Failed) > 0 || v.Replayed == 0 || mp.Replayed == 0 {
		t.Errorf("verifications %+v, MTP passes %+v replayed, failed %v", v, mp, gs.Failed)
	}
}
