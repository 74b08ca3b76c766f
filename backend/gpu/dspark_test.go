package gpu

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
)

// dsparkTwins builds the small-dspark model on the CPU reference and on the
// GPU (exact numerics).
func dsparkTwins(t *testing.T, g *Backend) (*checkpoint.Weights, *model.Model, *model.Model) {
	t.Helper()
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "small-dspark"), checkpoint.GenSpec{Seed: 1, Preset: "small-dspark"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mc, mg := twinModels(t, w, g, model.Options{CacheBytes: 64 << 20, Numerics: "exact", Drafts: -1})
	return w, mc, mg
}

// TestDSparkDrafterOnGPU runs the DSpark drafter of the small-dspark model
// on the GPU beside the CPU reference (exact numerics; a 24-token context
// wraps the 16-entry window): the captured target features, the block
// logits and the Markov bias are within 1e-3 of the CPU's, with the same
// argmax per block row.
func TestDSparkDrafterOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	w, mc, mg := dsparkTwins(t, g)
	const n = 24
	toks := randomTokens(n+1, w.Config.Vocab, 5)
	type drafted struct{ hid, block, bias []float32 }
	draft := func(m *model.Model) drafted {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[:n], Hidden: true}}})
		must(t, err)
		d, err := m.ForwardDSpark([]model.DSparkItem{{Seq: s, Context: o.Hidden[0], Anchor: toks[n], Draft: true}})
		must(t, err)
		b, err := m.MarkovBias(toks[n : n+1])
		must(t, err)
		return drafted{o.Hidden[0], d.Logits[0], b[0]}
	}
	c, gp := draft(mc), draft(mg)
	rows := mc.DSparkRows()
	for _, x := range []struct {
		name       string
		cpu, gpu   []float32
		rows       int
		sameArgmax bool
	}{{"captured features", c.hid, gp.hid, n, false}, {"block logits", c.block, gp.block, rows, true}, {"markov bias", c.bias, gp.bias, 1, false}} {
		if d := worstRow(x.cpu, x.gpu, x.rows); d > 1e-3 {
			t.Errorf("%s: rel %.3g from the CPU", x.name, d)
		}
		cols := len(x.cpu) / x.rows
		for j := 0; x.sameArgmax && j < x.rows; j++ {
			if a, b := engine.Argmax(x.cpu[j*cols:(j+1)*cols]), engine.Argmax(x.gpu[j*cols:(j+1)*cols]); a != b {
				t.Errorf("%s row %d: argmax cpu %d gpu %d", x.name, j, a, b)
			}
		}
	}
}

// TestDSparkGreedyOnGPU: greedy decoding through the engine with DSpark
// drafts on the GPU gives the CPU's tokens with drafts, which are plain
// decoding's (small-dspark model, exact numerics).
func TestDSparkGreedyOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	w, mc, mg := dsparkTwins(t, g)
	toks := randomTokens(90, w.Config.Vocab, 6)
	gen := func(m *model.Model, spec engine.SpecConfig) [][]int32 {
		e, err := engine.New(engine.FromModel(m), engine.Config{MaxModelLen: 256, MaxBatchTokens: 64, Speculative: spec})
		must(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { _ = e.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		var streams []*engine.Stream
		for _, n := range []int{9, 40, 90} {
			st, err := e.Submit(&engine.Request{Prompt: toks[:min(n, len(toks))], MaxTokens: 16})
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
		return out
	}
	spec := engine.SpecConfig{Method: "dspark"}
	plain, cpu, gpu := gen(mc, engine.SpecConfig{}), gen(mc, spec), gen(mg, spec)
	for i := range plain {
		if !slices.Equal(plain[i], cpu[i]) || !slices.Equal(cpu[i], gpu[i]) {
			t.Errorf("request %d: plain %v, DSpark drafts on the CPU %v, on the GPU %v", i, plain[i], cpu[i], gpu[i])
		}
	}
}
