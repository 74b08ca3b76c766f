package gpu

import (
	"errors"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

// TestTraceNonFiniteOnGPU poisons one weight (a NaN block scale) and requires
// the GPU tracer to name the same component, row and position as the CPU's.
func TestTraceNonFiniteOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	for _, tc := range []struct {
		name   string
		poison func(w *checkpoint.Weights) *checkpoint.Linear
	}{
		{"attn wq_b", func(w *checkpoint.Weights) *checkpoint.Linear { return &w.Layers[2].Attn.WqB }},
		{"indexer wq_b", func(w *checkpoint.Weights) *checkpoint.Linear { return &w.Layers[1].Attn.Indexer.WqB }},
		{"shared w2", func(w *checkpoint.Weights) *checkpoint.Linear { return &w.Layers[3].FFN.Shared.W2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := checkpoint.RandomWeights(checkpoint.SmallConfig(), checkpoint.GenOfficial, 7)
			if err != nil {
				t.Fatal(err)
			}
			l := tc.poison(w)
			sc := append([]byte(nil), l.Scale.Data...) // the pools share bytes: copy
			sc[len(sc)-1] = 0xff                       // e8m0 NaN
			l.Scale.Data = sc
			opts := model.Options{CacheBytes: 16 << 20, TraceNonFinite: true}
			mc, mg := twinModels(t, w, g, opts)
			prompt := []int32{5, 17, 3, 99, 42, 7, 250, 11, 64, 8}
			run := func(m *model.Model) *model.NonFiniteError {
				s := m.Cache().NewSequence()
				defer m.FreeSequence(s)
				_, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: prompt}}})
				var nf *model.NonFiniteError
				if !errors.As(err, &nf) {
					t.Fatalf("%s: err %v, want *NonFiniteError", m.Backend().Name(), err)
				}
				return nf
			}
			ce, ge := run(mc), run(mg)
			t.Logf("cpu: %v", ce)
			t.Logf("gpu: %v", ge)
			if ce.Component != ge.Component || ce.Row != ge.Row || ce.Position != ge.Position {
				t.Errorf("gpu names %q row %d pos %d, cpu %q row %d pos %d", ge.Component, ge.Row, ge.Position, ce.Component, ce.Row, ce.Position)
			}
		})
	}
}
