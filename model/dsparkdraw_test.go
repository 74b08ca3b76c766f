package model

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/kvcache"
)

// TestDSparkDeviceDraw runs sequences through the host path (captured
// features to the host, base logits and Markov biases to the host, the
// drafts chosen there) and twins of them through the device path
// (KeepHidden, DSparkItem.In, Draw), step by step with verified rows of
// varied counts: the kept features equal the host ones bit for bit, the
// drawn drafts equal the host path's, a drafting item without Draw beside
// drawn ones still gets its logits (equal to the host path's), and nothing
// leaks.
func TestDSparkDeviceDraw(t *testing.T) {
	for _, mode := range []string{"exact", "faithful"} {
		t.Run(mode, func(t *testing.T) { dsparkDeviceDraw(t, mode) })
	}
}

func dsparkDeviceDraw(t *testing.T, mode string) {
	m := newSynth(t, checkpoint.SmallDSparkConfig(), mode)
	if !m.CanDrawDSpark() {
		t.Fatal("the CPU backend cannot draw DSpark drafts")
	}
	c, w, k := m.Config(), m.DSparkDim(), m.DSparkRows()
	lens := []int{11, 26, 17}
	ns := len(lens)
	host, dev := make([]*kvcache.Sequence, ns), make([]*kvcache.Sequence, ns)
	toks := make([][]int32, ns)
	for i := range ns {
		host[i], dev[i] = m.Cache().NewSequence(), m.Cache().NewSequence()
		defer m.FreeSequence(host[i])
		defer m.FreeSequence(dev[i])
		toks[i] = prompt(lens[i]+40, c.Vocab, uint64(20+i))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	done := make([]int, ns) // positions in the cache and the drafter
	in := make([]int, ns)   // tokens of this step
	for i := range ns {
		in[i] = lens[i]
	}
	for step := range 6 {
		var hb, db Batch
		for i := range ns {
			x := toks[i][done[i] : done[i]+in[i]]
			hb.Items = append(hb.Items, BatchItem{Seq: host[i], Tokens: x, Hidden: true})
			db.Items = append(db.Items, BatchItem{Seq: dev[i], Tokens: x, KeepHidden: true})
		}
		ho, err := m.Forward(&hb)
		if err != nil {
			t.Fatal(err)
		}
		do, err := m.Forward(&db)
		if err != nil {
			t.Fatal(err)
		}
		if do.Kept == nil || len(do.KeptRow) != ns || do.HiddenDim != w {
			t.Fatalf("step %d: kept %v rows %v dim %d", step, do.Kept, do.KeptRow, do.HiddenDim)
		}
		var hi, di []DSparkItem
		for i := range ns {
			ref := HiddenRef{H: do.Kept, Row0: do.KeptRow[i], Rows: in[i]}
			got, err := m.DownloadHidden(ref)
			if err != nil {
				t.Fatal(err)
			}
			equalRows(t, "kept features", done[i], ho.Hidden[i], got)
			anchor := toks[i][done[i]+in[i]]
			draft := step%3 != 2 || i != 1 // one step gives a sequence context only
			hi = append(hi, DSparkItem{Seq: host[i], Start: done[i], Context: ho.Hidden[i], Anchor: anchor, Draft: draft})
			di = append(di, DSparkItem{Seq: dev[i], Start: done[i], In: ref, Anchor: anchor, Draft: draft, Draw: step != 1 || i != 0})
		}
		hout, err := m.ForwardDSpark(hi)
		if err != nil {
			t.Fatal(err)
		}
		dout, err := m.ForwardDSpark(di)
		m.FreeHidden(do.Kept)
		if err != nil {
			t.Fatal(err)
		}
		want, err := hostDrafts(m, hi, hout)
		if err != nil {
			t.Fatal(err)
		}
		for i, it := range di {
			switch {
			case !it.Draft:
				if dout.Logits[i] != nil || dout.RowIDs != nil && dout.RowIDs[i] != nil {
					t.Errorf("step %d item %d: output for an item without a block", step, i)
				}
			case it.Draw:
				if dout.Logits[i] != nil || !slices.Equal(dout.RowIDs[i], want[i]) {
					t.Errorf("step %d item %d: drawn drafts %v (logits %d), host path %v", step, i, dout.RowIDs[i], len(dout.Logits[i]), want[i])
				}
			default:
				equalRows(t, "undrawn block logits", step, hout.Logits[i], dout.Logits[i])
			}
		}
		for i := range ns {
			done[i] += in[i]
			in[i] = 1 + rng.IntN(k+1) // the verified rows of the next step
		}
	}
}

// hostDrafts chooses each drafting item's drafts on the host, as the
// engine's host path does: base row j plus the Markov bias of the previous
// token (the anchor, then the previous draft), greedy.
func hostDrafts(m *Model, items []DSparkItem, o *Output) ([][]int32, error) {
	v, k := m.Config().Vocab, m.DSparkRows()
	out := make([][]int32, len(items))
	for j := range k {
		var prev []int32
		var who []int
		for i, it := range items {
			if !it.Draft {
				continue
			}
			p := it.Anchor
			if j > 0 {
				p = out[i][j-1]
			}
			prev, who = append(prev, p), append(who, i)
		}
		bias, err := m.MarkovBias(prev)
		if err != nil {
			return nil, err
		}
		for r, i := range who {
			row := make([]float32, v)
			for x := range row {
				row[x] = o.Logits[i][j*v+x] + bias[r][x]
			}
			out[i] = append(out[i], hostArgmax(row))
		}
	}
	return out, nil
}

// hostArgmax is the host's greedy rule (engine.Argmax).
func hostArgmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] || (x[best] != x[best] && v == v) {
			best = i
		}
	}
	return int32(best)
}
