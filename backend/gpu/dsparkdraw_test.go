package gpu

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
)

// TestDSparkDeviceDrawOnGPU: the DSpark drafts drawn on the GPU (captured
// features kept there, DSparkItem.In, Draw) equal the host path's on the
// GPU (features, base logits and Markov biases to the host, greedy there),
// and the CPU twin's device path wherever the CPU's choice is clear (a
// margin of 1e-2 over the runner-up: random weights tie closely), for
// three sequences over steps of 1 to 5 verified rows (small-dspark model,
// exact numerics).
func TestDSparkDeviceDrawOnGPU(t *testing.T) {
	g := openGPU(t, Options{})
	w, mc, mg := dsparkTwins(t, g)
	lens := []int{9, 24, 17}
	toks := make([][]int32, len(lens))
	for i, n := range lens {
		toks[i] = randomTokens(n+30, w.Config.Vocab, uint64(7+i))
	}
	type run struct {
		m    *model.Model
		seqs []*kvcache.Sequence
	}
	newRun := func(m *model.Model) run {
		r := run{m: m}
		for range lens {
			s := m.Cache().NewSequence()
			t.Cleanup(func() { m.FreeSequence(s) })
			r.seqs = append(r.seqs, s)
		}
		return r
	}
	devG, hostG, devC, hostC := newRun(mg), newRun(mg), newRun(mc), newRun(mc)
	done, in := make([]int, len(lens)), slices.Clone(lens)
	for step := range 5 {
		dg, err := deviceDrafts(devG.m, devG.seqs, toks, done, in)
		must(t, err)
		hg, _, err := hostDrafts(hostG.m, hostG.seqs, toks, done, in)
		must(t, err)
		dc, err := deviceDrafts(devC.m, devC.seqs, toks, done, in)
		must(t, err)
		hc, margins, err := hostDrafts(hostC.m, hostC.seqs, toks, done, in)
		must(t, err)
		for i := range lens {
			if !slices.Equal(dg[i], hg[i]) {
				t.Errorf("step %d sequence %d: GPU drafts drawn on the device %v, on the host %v", step, i, dg[i], hg[i])
			}
			if !slices.Equal(dc[i], hc[i]) {
				t.Errorf("step %d sequence %d: CPU device path %v, host path %v", step, i, dc[i], hc[i])
			}
			for j := range dc[i] {
				if margins[i][j] < 1e-2 {
					break // the CPU's choice is too close to call; the chain goes on from it
				}
				if dg[i][j] != dc[i][j] {
					t.Errorf("step %d sequence %d: GPU drafts %v, CPU %v (margins %v)", step, i, dg[i], dc[i], margins[i])
					break
				}
			}
		}
		for i := range lens {
			done[i] += in[i]
			in[i] = 1 + (step+i)%5
		}
	}
}

// deviceDrafts runs one step of the device path: the verified rows in[i]
// after done[i] with their features kept on the device, then the context
// read from there and the block drawn on the device.
func deviceDrafts(m *model.Model, seqs []*kvcache.Sequence, toks [][]int32, done, in []int) ([][]int32, error) {
	b := &model.Batch{}
	for i, s := range seqs {
		b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: toks[i][done[i] : done[i]+in[i]], KeepHidden: true})
	}
	o, err := m.Forward(b)
	if err != nil {
		return nil, err
	}
	defer m.FreeHidden(o.Kept)
	items := make([]model.DSparkItem, len(seqs))
	for i, s := range seqs {
		items[i] = model.DSparkItem{Seq: s, Start: done[i], In: model.HiddenRef{H: o.Kept, Row0: o.KeptRow[i], Rows: in[i]},
			Anchor: toks[i][done[i]+in[i]], Draft: true, Draw: true}
	}
	d, err := m.ForwardDSpark(items)
	if err != nil {
		return nil, err
	}
	return d.RowIDs, nil
}

// hostDrafts runs one step of the host path and returns the drafts and
// each draft's margin over the runner-up (relative to the larger logit).
func hostDrafts(m *model.Model, seqs []*kvcache.Sequence, toks [][]int32, done, in []int) ([][]int32, [][]float32, error) {
	b := &model.Batch{}
	for i, s := range seqs {
		b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: toks[i][done[i] : done[i]+in[i]], Hidden: true})
	}
	o, err := m.Forward(b)
	if err != nil {
		return nil, nil, err
	}
	items := make([]model.DSparkItem, len(seqs))
	for i, s := range seqs {
		items[i] = model.DSparkItem{Seq: s, Start: done[i], Context: o.Hidden[i], Anchor: toks[i][done[i]+in[i]], Draft: true}
	}
	d, err := m.ForwardDSpark(items)
	if err != nil {
		return nil, nil, err
	}
	vocab, k := m.Config().Vocab, m.DSparkRows()
	drafts, margins := make([][]int32, len(seqs)), make([][]float32, len(seqs))
	for j := range k {
		prev := make([]int32, len(seqs))
		for i := range seqs {
			prev[i] = items[i].Anchor
			if j > 0 {
				prev[i] = drafts[i][j-1]
			}
		}
		bias, err := m.MarkovBias(prev)
		if err != nil {
			return nil, nil, err
		}
		for i := range seqs {
			row := make([]float32, vocab)
			for v := range row {
				row[v] = d.Logits[i][j*vocab+v] + bias[i][v]
			}
			best := engine.Argmax(row)
			second := float32(-1e30)
			for v, x := range row {
				if int32(v) != best && x > second {
					second = x
				}
			}
			drafts[i] = append(drafts[i], best)
			margins[i] = append(margins[i], (row[best]-second)/max(abs32(row[best]), 1))
		}
	}
	return drafts, margins, nil
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// TestDSparkGraphsOnGPU: greedy decoding through the engine with DSpark
// drafts on the GPU, drafts and verifying rows drawn on the device and the
// captured features kept there, gives plain decoding's tokens with the
// DSpark passes run eagerly and recorded as CUDA graphs, with the same
// drafts (the same draft and acceptance counts per position); the context
// and block passes replay and no recording fails.
func TestDSparkGraphsOnGPU(t *testing.T) {
	g0 := openGPU(t, Options{})
	w, _, _ := dsparkTwins(t, g0)
	prompts := [][]int32{randomTokens(9, w.Config.Vocab, 3), randomTokens(40, w.Config.Vocab, 4), randomTokens(23, w.Config.Vocab, 5)}
	const maxTok = 24
	run := func(g *Backend, spec engine.SpecConfig) ([][]int32, engine.SpecStats) {
		m, err := model.New(w, g, model.Options{CacheBytes: 64 << 20, Numerics: "exact", Drafts: spec.Drafts()})
		must(t, err)
		defer m.Close()
		return greedyRunStats(t, m, engine.Config{MaxModelLen: 256, MaxBatchTokens: 64, DeviceSampling: true, Speculative: spec}, prompts, maxTok)
	}
	spec := engine.SpecConfig{Method: "dspark"}
	plain, _ := run(g0, engine.SpecConfig{})
	eager, es := run(openGPU(t, Options{}), spec)
	g := openGPU(t, Options{Graphs: true})
	got, gs := run(g, spec)
	for i := range plain {
		if !slices.Equal(plain[i], eager[i]) || !slices.Equal(plain[i], got[i]) {
			t.Errorf("request %d: plain %v, with drafts eagerly %v, with graphs %v", i, plain[i], eager[i], got[i])
		}
	}
	if es.Drafted == 0 || es.Drafted != gs.Drafted || es.Accepted != gs.Accepted || !slices.Equal(es.PerPos, gs.PerPos) {
		t.Errorf("drafts eagerly %+v, with graphs %+v", es, gs)
	}
	st := g.GraphStats()
	t.Logf("by kind %v, failed %v", st.Kinds, st.Failed)
	if c, b := st.Kinds["dspark ctx"], st.Kinds["dspark"]; len(st.Failed) > 0 || c.Replayed == 0 || b.Replayed == 0 {
		t.Errorf("DSpark context passes %+v, blocks %+v replayed, failed %v", c, b, st.Failed)
	}
}
