package model

import (
	"slices"
	"testing"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/cpuref"
	"github.com/megamoe/megamoe/kvcache"
)

// drawingBackend adds DeviceSampler to a CPU backend with the kernel's CPU
// twin, so the model's draw path runs here as it does on the GPU.
type drawingBackend struct {
	*countingBackend
	calls int
}

func (b *drawingBackend) SampleDraw(logits backend.Tensor, d []backend.Draw, ids []int32) error {
	b.calls++
	rows, vocab := logits.Rows(), logits.Cols()
	x := make([]float32, rows*vocab)
	if err := b.Download(logits, x); err != nil {
		return err
	}
	copy(ids, drawRef(x, vocab, d))
	return nil
}

// drawRef draws every row of x [len(d), vocab] under d with cpuref.
func drawRef(x []float32, vocab int, d []backend.Draw) []int32 {
	n := len(d)
	temp, topP, minP, u := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	topK := make([]int32, n)
	for i, p := range d {
		temp[i], topK[i], topP[i], minP[i], u[i] = p.Temp, p.TopK, p.TopP, p.MinP, p.U
	}
	return cpuref.SampleDraw(x, n, vocab, temp, topK, topP, minP, u)
}

// TestForwardDraws: items that ask for a drawn token get the token the sample
// kernel's twin draws from the logits a plain forward returns, and no logits
// (unless AllLogits); the others get their logits; a step where every item
// draws downloads no logits; nothing leaks.
func TestForwardDraws(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	be, m, ref := drawingModels(t, w)
	if !m.CanDraw() || ref.CanDraw() {
		t.Fatalf("CanDraw: drawing backend %v, CPU backend %v", m.CanDraw(), ref.CanDraw())
	}
	draws := []*backend.Draw{
		{},                               // greedy
		{Temp: 0.8, TopP: 0.9, U: 0.37},  // nucleus
		nil,                              // logits to the host
		{Temp: 1.3, TopK: 5, U: 0.999},   // top-k, with AllLogits in the prefill
		{Temp: 2, MinP: 0.05, U: 0.0625}, // min-p, in id order
	}
	mSeqs, rSeqs := make([]*kvcache.Sequence, len(draws)), make([]*kvcache.Sequence, len(draws))
	for i := range draws {
		mSeqs[i], rSeqs[i] = m.Cache().NewSequence(), ref.Cache().NewSequence()
		defer m.FreeSequence(mSeqs[i])
		defer ref.FreeSequence(rSeqs[i])
	}
	before := len(be.live)
	for step, n := range []int{7, 1, 1} {
		var mb, rb Batch
		for i, d := range draws {
			toks := prompt(n, c.Vocab, uint64(10*step+i))
			all := step == 0 && i == 3
			it := BatchItem{Seq: mSeqs[i], Tokens: toks, AllLogits: all, Draw: d}
			if step == 2 && d == nil {
				it.Draw = &backend.Draw{} // the last step downloads no logits
			}
			mb.Items = append(mb.Items, it)
			rb.Items = append(rb.Items, BatchItem{Seq: rSeqs[i], Tokens: toks, AllLogits: all})
		}
		calls := be.calls
		got, err := m.Forward(&mb)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ref.Forward(&rb)
		if err != nil {
			t.Fatal(err)
		}
		if be.calls != calls+1 {
			t.Fatalf("step %d: %d SampleDraw calls, want 1", step, be.calls-calls)
		}
		for i, it := range mb.Items {
			wantID := int32(-1)
			if it.Draw != nil {
				wantID = drawRef(want.Last(i), c.Vocab, []backend.Draw{*it.Draw})[0]
			}
			if got.IDs[i] != wantID {
				t.Errorf("step %d item %d: drew %d, want %d", step, i, got.IDs[i], wantID)
			}
			if keep := it.Draw == nil || it.AllLogits; keep != (got.Logits[i] != nil) {
				t.Errorf("step %d item %d: logits returned %v, want %v", step, i, got.Logits[i] != nil, keep)
			} else if keep && !slices.Equal(got.Logits[i], want.Logits[i]) {
				t.Errorf("step %d item %d: logits differ from a plain forward", step, i)
			}
		}
		if len(be.live) != before {
			t.Errorf("step %d left %d tensors allocated: %s", step, len(be.live)-before, be.sites())
			before = len(be.live)
		}
	}
}

// TestForwardDrawRows: a DrawRows item gets the greedy token of every row
// (its last row under Draw) and no logits unless AllLogits; on a model that
// cannot draw it gets every row's logits instead.
func TestForwardDrawRows(t *testing.T) {
	c := checkpoint.SmallConfig()
	w := genWeights(t, c, 1)
	_, m, ref := drawingModels(t, w)
	items := []struct {
		n    int
		draw *backend.Draw
		all  bool
	}{
		{4, nil, false}, // greedy rows
		{3, &backend.Draw{Temp: 0.9, U: 0.4}, false}, // the last row sampled
		{2, nil, true},  // ids and logits
		{1, nil, false}, // one row
	}
	var mb, rb, nb Batch
	for i, it := range items {
		toks := prompt(it.n, c.Vocab, uint64(i+3))
		s, r, nd := m.Cache().NewSequence(), ref.Cache().NewSequence(), ref.Cache().NewSequence()
		defer m.FreeSequence(s)
		defer ref.FreeSequence(r)
		defer ref.FreeSequence(nd)
		mb.Items = append(mb.Items, BatchItem{Seq: s, Tokens: toks, DrawRows: true, Draw: it.draw, AllLogits: it.all})
		rb.Items = append(rb.Items, BatchItem{Seq: r, Tokens: toks, AllLogits: true})
		nb.Items = append(nb.Items, BatchItem{Seq: nd, Tokens: toks, DrawRows: true})
	}
	got, err := m.Forward(&mb)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ref.Forward(&rb)
	if err != nil {
		t.Fatal(err)
	}
	undrawn, err := ref.Forward(&nb)
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		d := make([]backend.Draw, it.n)
		if it.draw != nil {
			d[it.n-1] = *it.draw
		}
		wantIDs := drawRef(want.Logits[i], c.Vocab, d)
		if !slices.Equal(got.RowIDs[i], wantIDs) || got.IDs[i] != wantIDs[it.n-1] {
			t.Errorf("item %d: rows drew %v (last %d), want %v", i, got.RowIDs[i], got.IDs[i], wantIDs)
		}
		if it.all != (got.Logits[i] != nil) || it.all && !slices.Equal(got.Logits[i], want.Logits[i]) {
			t.Errorf("item %d: logits returned %v, want %v and equal to a plain forward's", i, got.Logits[i] != nil, it.all)
		}
		if !slices.Equal(undrawn.Logits[i], want.Logits[i]) {
			t.Errorf("item %d: a model that cannot draw returned %d logits, want every row's %d", i, len(undrawn.Logits[i]), len(want.Logits[i]))
		}
	}
	if undrawn.RowIDs != nil || undrawn.IDs != nil {
		t.Errorf("a model that cannot draw returned ids")
	}
}

// TestForwardMTPDraws: MTP items with Draw get the token drawn from the
// logits a plain ForwardMTP returns, and no logits; the others their logits.
func TestForwardMTPDraws(t *testing.T) {
	c := checkpoint.SmallConfig()
	if c.MTPLayers == 0 {
		t.Fatal("the small config has no MTP block")
	}
	w := genWeights(t, c, 2)
	be, m, ref := drawingModels(t, w)
	draws := []*backend.Draw{{}, {Temp: 1.1, TopK: 9, U: 0.61}, nil}
	var mi, ri []MTPItem
	for i, d := range draws {
		toks := prompt(6, c.Vocab, uint64(20+i))
		var items []MTPItem
		for _, mod := range []*Model{m, ref} {
			s := mod.Cache().NewSequence()
			defer mod.FreeSequence(s)
			out, err := mod.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks[:5], Hidden: true}}})
			if err != nil {
				t.Fatal(err)
			}
			items = append(items, MTPItem{Seq: s, Hidden: out.Hidden[0], Next: toks[1:6], Draw: d})
		}
		mi, ri = append(mi, items[0]), append(ri, items[1])
		ri[i].Draw = nil
	}
	calls := be.calls
	before := len(be.live)
	got, err := m.ForwardMTP(mi)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ref.ForwardMTP(ri)
	if err != nil {
		t.Fatal(err)
	}
	if be.calls != calls+1 {
		t.Errorf("%d SampleDraw calls, want 1", be.calls-calls)
	}
	for i, d := range draws {
		if d == nil {
			if got.IDs[i] != -1 || !slices.Equal(got.Logits[i], want.Logits[i]) {
				t.Errorf("item %d: id %d and logits equal %v, want -1 and the plain logits", i, got.IDs[i], slices.Equal(got.Logits[i], want.Logits[i]))
			}
			continue
		}
		if id := drawRef(want.Logits[i], c.Vocab, []backend.Draw{*d})[0]; got.IDs[i] != id || got.Logits[i] != nil {
			t.Errorf("item %d: drew %d (logits returned %v), want %d and no logits", i, got.IDs[i], got.Logits[i] != nil, id)
		}
	}
	m.Close() // the input staging
	if len(be.live) != before {
		t.Errorf("ForwardMTP left %d tensors allocated: %s", len(be.live)-before, be.sites())
	}
}

// drawingModels builds w on a CPU backend that draws tokens (counting its
// calls and live tensors) and on a plain CPU backend, the reference.
func drawingModels(t *testing.T, w *checkpoint.Weights) (*drawingBackend, *Model, *Model) {
	t.Helper()
	be := &drawingBackend{countingBackend: &countingBackend{Backend: cpu.New(cpu.Options{}), live: map[backend.Tensor]string{}}}
	m, err := New(w, be, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := New(w, cpu.New(cpu.Options{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	return be, m, ref
}
