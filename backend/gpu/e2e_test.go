package gpu

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/model"
)

var _ backend.Backend = (*Backend)(nil)

// greedy prefills prompt in chunks, then decodes n tokens greedily; it returns
// the tokens and the logits of every prefill row and decode step.
func greedy(t *testing.T, m *model.Model, prompt []int32, chunk, n int) ([]int32, [][]float32) {
	t.Helper()
	s := m.Cache().NewSequence()
	defer m.FreeSequence(s)
	var logits [][]float32
	for i := 0; i < len(prompt); i += chunk {
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: prompt[i:min(i+chunk, len(prompt))], AllLogits: true}}})
		if err != nil {
			t.Fatal(err)
		}
		logits = append(logits, o.Rows(0)...)
	}
	var toks []int32
	next := argmax(logits[len(logits)-1])
	for range n {
		toks = append(toks, next)
		o, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: []int32{next}}}})
		if err != nil {
			t.Fatal(err)
		}
		l := o.Last(0)
		logits = append(logits, l)
		next = argmax(l)
	}
	return toks, logits
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// TestSmallModelEndToEnd runs the small checkpoint (SWA, CSA, HCA layers, hash
// and routed MoE) on the GPU and on the CPU: a 300-token prompt in chunks of
// 64 (compressed entries of ratio 4 and 128 exist), then 32 greedy decode
// steps. The greedy tokens must be equal and the logits close.
func TestSmallModelEndToEnd(t *testing.T) {
	for _, format := range []string{checkpoint.GenOfficial, checkpoint.GenNVFP4} {
		t.Run(format, func(t *testing.T) {
			g, err := New(Options{})
			if err != nil {
				t.Skipf("no GPU: %v", err)
			}
			defer g.Close()
			dir := filepath.Join(t.TempDir(), format)
			if err := checkpoint.Generate(dir, checkpoint.GenSpec{Format: format, Seed: 1}); err != nil {
				t.Fatal(err)
			}
			w, st, err := checkpoint.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			opts := model.Options{CacheBytes: 64 << 20}
			mc, err := model.New(w, nil, opts)
			if err != nil {
				t.Fatal(err)
			}
			mg, err := model.New(w, g, opts)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(3, 4))
			prompt := make([]int32, 300)
			for i := range prompt {
				prompt[i] = int32(r.IntN(w.Config.Vocab))
			}
			tc, lc := greedy(t, mc, prompt, 64, 32)
			tg, lg := greedy(t, mg, prompt, 64, 32)
			worst := 0.0
			for i := range lc {
				var num, den float64
				for j := range lc[i] {
					if math.IsNaN(float64(lg[i][j])) || math.IsInf(float64(lg[i][j]), 0) {
						t.Fatalf("non-finite GPU logit at row %d", i)
					}
					num = max(num, math.Abs(float64(lg[i][j]-lc[i][j])))
					den = max(den, math.Abs(float64(lc[i][j])))
				}
				worst = max(worst, num/den)
			}
			same := 0
			for i := range tc {
				if tc[i] == tg[i] {
					same++
				}
			}
			t.Logf("%s: greedy tokens equal %d/%d; max relative logit difference %.3g over %d rows", format, same, len(tc), worst, len(lc))
			t.Logf("cpu %v", tc)
			t.Logf("gpu %v", tg)
			if same != len(tc) {
				t.Errorf("greedy tokens differ")
			}
			if worst > 5e-2 {
				t.Errorf("max relative logit difference %.3g > 5e-2", worst)
			}
		})
	}
}
