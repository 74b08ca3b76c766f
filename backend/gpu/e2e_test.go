package gpu

import (
	"fmt"
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
			if same != len(tc) || worst > 5e-2 {
				firstDivergence(t, w, g, opts, prompt, 64, tc)
			}
			if worst > 5e-2 {
				t.Errorf("max relative logit difference %.3g > 5e-2", worst)
			}
		})
	}
}

// probeRec records every traced component output of one forward step.
type probeRec struct {
	be    backend.Backend
	names []string
	vals  [][]float32
}

func (r *probeRec) probe(name string, out backend.Tensor) {
	v := make([]float32, out.Rows()*out.Cols())
	if out.DType() == backend.I32 {
		ids := make([]int32, len(v))
		if err := r.be.DownloadI32(out, ids); err != nil {
			panic(fmt.Sprintf("probe %s: %v", name, err))
		}
		for i, id := range ids {
			v[i] = float32(id)
		}
	} else if err := r.be.Download(out, v); err != nil {
		panic(fmt.Sprintf("probe %s: %v", name, err))
	}
	r.names, r.vals = append(r.names, name), append(r.vals, v)
}

// firstDivergence replays the schedule on both backends with the CPU's tokens
// forced and logs the first component whose output differs by more than 2e-2.
func firstDivergence(t *testing.T, w *checkpoint.Weights, g *Backend, opts model.Options, prompt []int32, chunk int, toks []int32) {
	t.Helper()
	cr, gr := &probeRec{}, &probeRec{be: g}
	co, gopt := opts, opts
	co.Probe, gopt.Probe = cr.probe, gr.probe
	mc, err := model.New(w, nil, co)
	if err != nil {
		t.Fatal(err)
	}
	cr.be = mc.Backend()
	mg, err := model.New(w, g, gopt)
	if err != nil {
		t.Fatal(err)
	}
	sc, sg := mc.Cache().NewSequence(), mg.Cache().NewSequence()
	var steps [][]int32
	for i := 0; i < len(prompt); i += chunk {
		steps = append(steps, prompt[i:min(i+chunk, len(prompt))])
	}
	for _, tk := range toks {
		steps = append(steps, []int32{tk})
	}
	for si, st := range steps {
		cr.names, cr.vals, gr.names, gr.vals = nil, nil, nil, nil
		if _, err := mc.Forward(&model.Batch{Items: []model.BatchItem{{Seq: sc, Tokens: st}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := mg.Forward(&model.Batch{Items: []model.BatchItem{{Seq: sg, Tokens: st}}}); err != nil {
			t.Fatal(err)
		}
		if len(cr.names) != len(gr.names) {
			t.Fatalf("step %d: %d probed components on the CPU, %d on the GPU", si, len(cr.names), len(gr.names))
		}
		for i, name := range cr.names {
			a, b := cr.vals[i], gr.vals[i]
			var num, den float64
			for j := range a {
				d := float64(b[j] - a[j])
				num, den = num+d*d, den+float64(a[j])*float64(a[j])
			}
			rel := math.Sqrt(num / max(den, 1e-30))
			if rel > 2e-2 || math.IsNaN(rel) {
				// Few wholly different rows mean a discrete flip (a routing or
				// top-k near-tie); all rows a little off mean arithmetic.
				cols := len(a) / len(st)
				bad, worst := 0, 0.0
				for r := range len(st) {
					var n2, d2 float64
					for j := r * cols; j < (r+1)*cols; j++ {
						d := float64(b[j] - a[j])
						n2, d2 = n2+d*d, d2+float64(a[j])*float64(a[j])
					}
					rr := math.Sqrt(n2 / max(d2, 1e-30))
					worst = max(worst, rr)
					if rr > 2e-2 {
						bad++
					}
				}
				t.Errorf("first divergence: step %d (%d tokens at position %d), component %q, rel %.3g (%d values); %d of %d rows off by > 2e-2, worst row %.3g; previous component %q",
					si, len(st), sc.Len()-len(st), name, rel, len(a), bad, len(st), worst, prev(cr.names, i))
				return
			}
		}
	}
	t.Log("no component diverges by more than 2e-2 when the CPU's tokens are forced")
}

func prev(names []string, i int) string {
	if i == 0 {
		return ""
	}
	return names[i-1]
}
