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

// specSeq is one sequence of a drafting loop (engine/spec.go's step, greedy).
type specSeq struct {
	kv      *kvcache.Sequence
	toks    []int32
	pending []int32         // tokens not yet in the cache: the last one
	mtpLen  int             // positions the MTP block has processed
	hidden  model.HiddenRef // final streams of positions mtpLen… not yet fed to the MTP block, on the device
}

// specTrace is what one step of the loop computed.
type specTrace struct {
	drafts [][]int32
	mtp    [][]float32 // the MTP passes' logits, pass after pass, per sequence
	rows   [][]float32 // the verification's logits, per sequence
}

// specLoopStep drafts k tokens per sequence with the MTP block, verifies them
// in one forward pass with the pending token, accepts the drafts that
// equal the target's argmax and rewinds the cache as the engine does.
// The final streams stay on the device (KeepHidden, MTPItem.In, KeepNext).
func specLoopStep(t *testing.T, m *model.Model, seqs []*specSeq, k int) specTrace {
	t.Helper()
	vocab := m.Config().Vocab
	mi := make([]model.MTPItem, len(seqs))
	for i, s := range seqs {
		n := s.hidden.Rows
		mi[i] = model.MTPItem{Seq: s.kv, Start: s.mtpLen, In: s.hidden, Next: s.toks[s.mtpLen+1 : s.mtpLen+n+1], KeepNext: true, Ahead: true}
		s.mtpLen += n
	}
	out, err := m.ForwardMTP(mi)
	must(t, err)
	for i, s := range seqs { // the rows were in one step's streams, or each in its prompt's
		if i == 0 || s.hidden.H != seqs[i-1].hidden.H {
			m.FreeHidden(s.hidden.H)
		}
	}
	tr := specTrace{drafts: make([][]int32, len(seqs)), mtp: make([][]float32, len(seqs))}
	for i, s := range seqs {
		must(t, m.Cache().Reserve(s.kv, s.kv.Len()+len(s.pending)+k))
		tr.drafts[i] = []int32{engine.Argmax(out.Logits[i])}
		tr.mtp[i] = append(tr.mtp[i], out.Logits[i]...)
	}
	for d := 1; d < k; d++ {
		for i, s := range seqs {
			mi[i] = model.MTPItem{Seq: s.kv, Start: len(s.toks) - 1 + d - 1, In: model.HiddenRef{H: out.Kept, Row0: out.KeptRow[i], Rows: 1},
				Next: tr.drafts[i][d-1 : d], KeepNext: true, Draft: true}
		}
		next, err := m.ForwardMTP(mi)
		must(t, err)
		m.FreeHidden(out.Kept)
		out = next
		for i := range seqs {
			tr.drafts[i] = append(tr.drafts[i], engine.Argmax(out.Logits[i]))
			tr.mtp[i] = append(tr.mtp[i], out.Logits[i]...)
		}
	}
	m.FreeHidden(out.Kept)
	b := &model.Batch{}
	for i, s := range seqs {
		b.Items = append(b.Items, model.BatchItem{Seq: s.kv, Tokens: append(slices.Clone(s.pending), tr.drafts[i]...), AllLogits: true, KeepHidden: true})
	}
	vout, err := m.Forward(b)
	must(t, err)
	for i, s := range seqs {
		tr.rows = append(tr.rows, vout.Logits[i])
		n := len(s.pending)
		row := func(r int) []float32 { return vout.Logits[i][r*vocab : (r+1)*vocab] }
		a := 0
		for a < k && engine.Argmax(row(n-1+a)) == tr.drafts[i][a] {
			a++
		}
		start := s.kv.Len() - n - k
		must(t, m.Rewind(s.kv, start+n+a))
		m.Cache().Shrink(s.kv, start+n+a+1)
		s.hidden = model.HiddenRef{H: vout.Kept, Row0: vout.KeptRow[i] + n - 1, Rows: a + 1}
		s.toks = append(append(s.toks, tr.drafts[i][:a]...), engine.Argmax(row(n-1+a)))
		s.pending = slices.Clone(s.toks[len(s.toks)-1:])
	}
	return tr
}

// TestRecordedSpecSteps runs the same drafting loop (two sequences, two MTP
// drafts, greedy verification, rollbacks, the streams kept on the device) on
// an eager backend and on one that records steps as CUDA graphs: the drafts,
// the emitted tokens and every logit of the MTP passes and the verifications
// must be identical, and the verifications and MTP passes of a repeated
// layout (rows per sequence) must be replays.
func TestRecordedSpecSteps(t *testing.T) {
	ge := openGPU(t, Options{})
	gr := openGPU(t, Options{Graphs: true})
	dir, err := models.ExtractSmall()
	must(t, err)
	w, st, err := checkpoint.Load(dir)
	must(t, err)
	defer st.Close()
	rng := rand.New(rand.NewPCG(3, 5))
	prompts := [][]int32{make([]int32, 40), make([]int32, 9)}
	for _, p := range prompts {
		for i := range p {
			p[i] = int32(rng.IntN(w.Config.Vocab))
		}
	}
	const k, steps = 2, 24
	opts := model.Options{CacheBytes: 128 << 20, Drafts: k}
	var traces [2][]specTrace
	var toks [2][][]int32
	for r, be := range []*Backend{ge, gr} {
		m, err := model.New(w, be, opts)
		must(t, err)
		hw := m.Config().HcDim()
		var seqs []*specSeq
		for _, p := range prompts {
			s := &specSeq{kv: m.Cache().NewSequence(), toks: slices.Clone(p)}
			defer m.FreeSequence(s.kv)
			// The prompt's streams on the host, and kept on the device for
			// its last row (the first catch-up reads two tensors).
			out, err := m.Forward(&model.Batch{Items: []model.BatchItem{{Seq: s.kv, Tokens: p, Hidden: true, KeepHidden: true}}})
			must(t, err)
			s.toks = append(s.toks, engine.Argmax(out.Last(0)))
			s.pending = s.toks[len(s.toks)-1:]
			n := len(p) - 1
			_, err = m.ForwardMTP([]model.MTPItem{{Seq: s.kv, Hidden: out.Hidden[0][:n*hw], Next: s.toks[1 : n+1]}})
			must(t, err)
			s.mtpLen, s.hidden = n, model.HiddenRef{H: out.Kept, Row0: n, Rows: 1}
			seqs = append(seqs, s)
		}
		for range steps {
			traces[r] = append(traces[r], specLoopStep(t, m, seqs, k))
		}
		for _, s := range seqs {
			toks[r] = append(toks[r], s.toks)
		}
	}
	for step := range steps {
		e, g := traces[0][step], traces[1][step]
		for i := range e.drafts {
			if !slices.Equal(e.drafts[i], g.drafts[i]) {
				t.Fatalf("step %d sequence %d: drafts %v eager, %v recorded", step, i, e.drafts[i], g.drafts[i])
			}
			for v := range e.mtp[i] {
				if math.Float32bits(e.mtp[i][v]) != math.Float32bits(g.mtp[i][v]) {
					t.Fatalf("step %d sequence %d: MTP logit %d eager %g, recorded %g", step, i, v, e.mtp[i][v], g.mtp[i][v])
				}
			}
			if len(e.rows[i]) != len(g.rows[i]) {
				t.Fatalf("step %d sequence %d: %d logits eager, %d recorded", step, i, len(e.rows[i]), len(g.rows[i]))
			}
			for v := range e.rows[i] {
				if math.Float32bits(e.rows[i][v]) != math.Float32bits(g.rows[i][v]) {
					t.Fatalf("step %d sequence %d: logit %d eager %g, recorded %g", step, i, v, e.rows[i][v], g.rows[i][v])
				}
			}
		}
	}
	for i := range toks[0] {
		if !slices.Equal(toks[0][i], toks[1][i]) {
			t.Fatalf("sequence %d: tokens differ:\neager    %v\nrecorded %v", i, toks[0][i], toks[1][i])
		}
	}
	gs := gr.GraphStats()
	t.Logf("graphs %d, recorded %d, replayed %d, eager %d, by kind %v, failed %v", gs.Graphs, gs.Recorded, gs.Replayed, gs.Eager, gs.Kinds, gs.Failed)
	// With k = 2 and two sequences a verification keeps 2, 3 or 4 rows in
	// all (1 or 2 each; which sequence keeps 2 is an input of the
	// recording): at most three are recorded, each run eagerly once. An
	// MTP pass has 2 to 6 rows in all (a catch-up 1 to 3 each, a chained
	// draft 1), and the prompts' passes are eager: most of the 48 replay.
	v, mp := gs.Kinds["verify"], gs.Kinds["mtp"]
	if len(gs.Failed) > 0 || v.Recorded > 3 || v.Eager > 3 || v.Replayed < steps-3 || mp.Recorded > 5 || mp.Replayed < 2*steps-12 {
		t.Errorf("verifications %+v and MTP passes %+v of %d steps, failed %v", v, mp, steps, gs.Failed)
	}
}
