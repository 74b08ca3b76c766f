package gpu

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/model"
)

// TestDSparkDraftOnGPU runs the DSpark drafter of the small-dspark model on
// the GPU beside the CPU reference (exact numerics): the captured target
// features, the block logits and the Markov bias are within 1e-3 of the
// CPU's with the same argmax per block row, and greedy decoding through
// the engine with DSpark drafts gives the CPU's tokens, which are plain
// decoding's.
func TestDSparkDraftOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	w, st, err := checkpoint.GenerateLoad(filepath.Join(t.TempDir(), "small-dspark"), checkpoint.GenSpec{Seed: 1, Preset: "small-dspark"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	opts := model.Options{CacheBytes: 64 << 20, Numerics: "exact"}
	mc, mg := twinModels(t, w, g, opts)
	r := rand.New(rand.NewPCG(5, 6))
	toks := make([]int32, 41)
	for i := range toks {
		toks[i] = int32(r.IntN(w.Config.Vocab))
	}
	type drafted struct{ hid, block, bias []float32 }
	draft := func(m *model.Model) drafted {
		s := m.Cache().NewSequence()
		defer m.FreeSequence(s)
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: toks[:40], Hidden: true}}})
		must(t, err)
		d, err := m.ForwardDSpark([]model.DSparkItem{{Seq: s, Context: o.Hidden[0], Anchor: toks[40], Draft: true}})
		must(t, err)
		b, err := m.MarkovBias(toks[40:41])
		must(t, err)
		return drafted{o.Hidden[0], d.Logits[0], b[0]}
	}
	c, gp := draft(mc), draft(mg)
	rows := mc.DSparkRows()
	for _, x := range []struct {
		name      string
		cpu, gpu  []float32
		rows      int
		sameArgmx bool
	}{{"captured features", c.hid, gp.hid, 40, false}, {"block logits", c.block, gp.block, rows, true}, {"markov bias", c.bias, gp.bias, 1, false}} {
		if d := worstRow(x.cpu, x.gpu, x.rows); d > 1e-3 {
			t.Errorf("%s: rel %.3g from the CPU", x.name, d)
		}
		cols := len(x.cpu) / x.rows
		for j := 0; x.sameArgmx && j < x.rows; j++ {
			if a, b := engine.Argmax(x.cpu[j*cols:(j+1)*cols]), engine.Argmax(x.gpu[j*cols:(j+1)*cols]); a != b {
				t.Errorf("%s row %d: argmax cpu %d gpu %d", x.name, j, a, b)
			}
		}
	}

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
