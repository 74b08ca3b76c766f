package gpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/engine"
	"github.com/megamoe/megamoe/kvcache"
	"github.com/megamoe/megamoe/model"
	"github.com/megamoe/megamoe/models"
)

// TestRecordedDecodeSteps runs the same schedule on an eager backend and on
// one that records decode steps as CUDA graphs: three sequences prefilled
// with different lengths (one close to the 1024-token recording capacity, so
// that decoding crosses it), then decode steps in one batch, one sequence
// leaving half way. Replays run the same kernels on the same inputs, so every
// logit must be bit-identical; and most steps must have been replays.
func TestRecordedDecodeSteps(t *testing.T) {
	ge := openGPU(t, Options{})
	gr, err := New(Options{Graphs: true, TimeReplays: true})
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	dir, err := models.ExtractSmall()
	if err != nil {
		t.Fatal(err)
	}
	w, st, err := checkpoint.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	opts := model.Options{CacheBytes: 256 << 20}
	me, err := model.New(w, ge, opts)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := model.New(w, gr, opts)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	lens := []int{1013, 37, 200}
	prompts := make([][]int32, len(lens))
	for i, n := range lens {
		prompts[i] = make([]int32, n)
		for k := range prompts[i] {
			prompts[i][k] = int32(rng.IntN(w.Config.Vocab))
		}
	}
	type run struct {
		m    *model.Model
		seqs []*kvcache.Sequence
		next []int32
	}
	runs := []*run{{m: me}, {m: mr}}
	for _, r := range runs {
		for _, p := range prompts {
			s := r.m.Cache().NewSequence()
			r.seqs = append(r.seqs, s)
			out, err := r.m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s, Tokens: p}}})
			if err != nil {
				t.Fatal(err)
			}
			r.next = append(r.next, engine.Argmax(out.Last(0)))
		}
	}
	const steps = 20
	for step := range steps {
		if step == steps/2 { // the short sequence finishes: the layout changes
			for _, r := range runs {
				r.m.FreeSequence(r.seqs[1])
				r.seqs = append(r.seqs[:1], r.seqs[2:]...)
				r.next = append(r.next[:1], r.next[2:]...)
			}
		}
		var outs [2]*model.Output
		for i, r := range runs {
			b := &model.Batch{}
			for k, s := range r.seqs {
				b.Items = append(b.Items, model.BatchItem{Seq: s, Tokens: []int32{r.next[k]}})
			}
			if outs[i], err = r.m.Forward(b); err != nil {
				t.Fatalf("step %d (%s): %v", step, r.m.Backend().Name(), err)
			}
		}
		for k := range runs[0].seqs {
			le, lr := outs[0].Last(k), outs[1].Last(k)
			for v := range le {
				if math.Float32bits(le[v]) != math.Float32bits(lr[v]) {
					t.Fatalf("step %d sequence %d (position %d): logit %d eager %g, recorded %g", step, k, runs[0].seqs[k].Len(), v, le[v], lr[v])
				}
			}
			for _, r := range runs {
				r.next[k] = engine.Argmax(le)
			}
		}
	}
	st2 := gr.GraphStats()
	t.Logf("graphs %d, recorded %d, replayed %d, eager %d, failed %v", st2.Graphs, st2.Recorded, st2.Replayed, st2.Eager, st2.Failed)
	// Layouts: 3 sequences below 1024, 3 past it, 2 past it: each runs once
	// eagerly, then is recorded and replayed.
	if len(st2.Failed) > 0 || st2.Recorded < 2 || st2.Replayed < steps-6 {
		t.Errorf("recorded %d layouts, replayed %d of %d decode steps, failed %v", st2.Recorded, st2.Replayed, steps, st2.Failed)
	}
	if len(st2.ReplayMs) != st2.Replayed || slices.ContainsFunc(st2.ReplayMs, func(ms float32) bool { return !(ms > 0 && ms < 1000) }) {
		t.Errorf("replay times %v for %d replays", st2.ReplayMs, st2.Replayed)
	}
	if eb := ge.GraphStats(); eb.Recorded != 0 || eb.Replayed != 0 {
		t.Errorf("the eager backend recorded %d and replayed %d steps", eb.Recorded, eb.Replayed)
	}
}
